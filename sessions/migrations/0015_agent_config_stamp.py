"""The agent configuration stamp as a PL/pgSQL function.

Every step commit returns the stamp of its session's agent (hashes of the agent row,
its model endpoints and its tools) so the next step can trust its cached
configuration without a query (`sessions.engine.runtime_cache`). As a subquery in the
step's RETURNING, new text at every step, the server planned its four-table join and
the tools' sub-select each time: ~0.3 ms of a step's ~0.9 ms of server time. A
function keeps that plan for the connection's life, and PostgreSQL re-plans it itself
when one of the tables changes.

The result is the same text the subquery gave (NULL for an agent that is gone).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION agent_config_stamp(p_agent bigint)
RETURNS text
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_stamp text;
BEGIN
    SELECT concat_ws('|', md5(a::text), md5(m::text), md5(f::text), md5(c::text),
                     (SELECT string_agg(md5(t::text), ',' ORDER BY t.id)
                        FROM tools_tool t WHERE t.name = ANY (a.tools)))
      INTO v_stamp
      FROM agent_sessions_agent a
      JOIN agent_sessions_modelendpoint m ON m.id = a.model_id
      LEFT JOIN agent_sessions_modelendpoint f ON f.id = a.fallback_model_id
      LEFT JOIN agent_sessions_modelendpoint c ON c.id = a.candidate_model_id
     WHERE a.id = p_agent;
    RETURN v_stamp;
END
$$;
"""

DROP = "DROP FUNCTION IF EXISTS agent_config_stamp(bigint);"


class Migration(migrations.Migration):

    dependencies = [
        ("agent_sessions", "0014_health"),
        ("tools", "0007_tool_precheck"),
    ]

    operations = [
        migrations.RunSQL(CREATE, DROP),
    ]

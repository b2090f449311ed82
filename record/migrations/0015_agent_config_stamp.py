"""The agent configuration stamp as a PL/pgSQL function.

Every step commit returns the stamp of its session's agent so the next step can trust
its cached configuration without a query (`engine.run_cache`). It was a
subquery in the step's RETURNING hashing the rows' contents (md5 of the agent row, its
model endpoints and its tools): new text at every step, so the server planned its
four-table join each time (~0.25 ms), then hashed every row (~0.15 ms).

Now a function, which keeps its plan for the connection's life, over the rows'
versions: `xmin`, the transaction that wrote each row version, changes with any UPDATE
(a queryset update() that leaves `updated_at` alone too) and never with a read or a row
lock; a tool deleted and created again has a new id. NULL for an agent that is gone.
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
    SELECT concat_ws('|', a.xmin, m.xmin, f.xmin, c.xmin,
                     (SELECT string_agg(t.id::text || ':' || t.xmin::text, ',' ORDER BY t.id)
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

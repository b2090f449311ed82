"""Stripe the daily rollup rows of one owner over ROLLUP_SHARDS rows, by session.

Every step of every session of an owner upserted the same `UsageDaily` row (and one
`ToolUsageDaily` row per tool), and a row lock lasts until the commit: with many
sessions of one owner at once, their step commits waited for each other's, one WAL
flush after another (bench/README.md, `load`). Each session now writes the rows of its
shard, `billing_rollup_shard(session_id)`; every reader already sums the rows of a key.
Rows written before keep shard 0.
"""

from importlib import import_module

from django.conf import settings
from django.db import migrations, models

SHARD_FUNCTION = """
CREATE FUNCTION billing_rollup_shard(p_session uuid) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce((hashtext(p_session::text) & 7)::smallint, 0::smallint) $$;
"""

_ROW = "VALUES (p_owner, p_agent, v_day, p_input, p_output, p_cost, p_model_calls, p_tool_calls,\n                v_taken)"
_KEY = "cost, model_calls, tool_calls, credits_spent)"
_CONFLICT = "ON CONFLICT (owner_id, agent_id, day) DO UPDATE SET"


def _previous_charge_function() -> str:
    previous: str = import_module("billing.migrations.0005_model_charge_once_by_index").CREATE
    return previous


def _charge_function() -> str:
    """0005's `billing_model_charge`, its rollup upsert writing the session's shard."""
    previous = _previous_charge_function()
    for text in (_ROW, _KEY, _CONFLICT):
        assert previous.count(text) == 1, text
    return (
        previous.replace(_KEY, "cost, model_calls, tool_calls, credits_spent, shard)")
        .replace(_ROW, _ROW[:-1] + ", billing_rollup_shard(p_session))")
        .replace(_CONFLICT, "ON CONFLICT (owner_id, agent_id, day, shard) DO UPDATE SET")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0016_lean_indexes"),
        ("billing", "0007_lean_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="toolusagedaily",
            name="shard",
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="usagedaily",
            name="shard",
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.RemoveConstraint(
            model_name="toolusagedaily",
            name="tool_usage_daily_key",
        ),
        migrations.RemoveConstraint(
            model_name="usagedaily",
            name="usage_daily_key",
        ),
        migrations.AddConstraint(
            model_name="toolusagedaily",
            constraint=models.UniqueConstraint(
                fields=("tool", "owner", "day", "shard"), name="tool_usage_daily_key"
            ),
        ),
        migrations.AddConstraint(
            model_name="usagedaily",
            constraint=models.UniqueConstraint(
                fields=("owner", "agent", "day", "shard"), name="usage_daily_key"
            ),
        ),
        migrations.RunSQL(SHARD_FUNCTION, "DROP FUNCTION billing_rollup_shard(uuid)"),
        migrations.RunSQL(_charge_function(), _previous_charge_function()),
    ]

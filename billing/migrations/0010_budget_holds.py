"""Budget holds: a model call's worst-case price held against the owner's shared budgets
(owner day and month, the agent's day, the API key's period) before the call, released by
the step that records it; and `billing_budget_reserve`, which takes a hold in one statement.

The function takes a per-owner transaction lock first: in READ COMMITTED each statement of a
PL/pgSQL function reads a new snapshot, so what it reads after the lock (the rollups, every
other hold of the owner) includes everything the owner's earlier reservers and committed
steps wrote. A step's commit deletes its hold and adds its cost to the rollups in one
transaction: a reserver sees both or neither, never the cost gone from both.

The result row: the budget refused ('' when held: 'agent day', 'owner day', 'owner month',
'API key day' or 'API key month'), then per budget (agent day, owner day, owner month, key)
its tokens and cost spent plus held by the owner's other calls in flight, before this one.
"""

from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION billing_budget_reserve(
    p_owner bigint, p_agent bigint, p_key bigint, p_session uuid, p_run varchar, p_tz text,
    p_tokens bigint, p_cost numeric, p_hold_s double precision,
    p_agent_day_tokens bigint, p_agent_day_cost numeric,
    p_day_tokens bigint, p_day_cost numeric,
    p_month_tokens bigint, p_month_cost numeric,
    p_key_period text, p_key_tokens bigint, p_key_cost numeric)
RETURNS TABLE (exceeded text, agent_day_tokens bigint, agent_day_cost numeric,
               day_tokens bigint, day_cost numeric, month_tokens bigint, month_cost numeric,
               key_tokens bigint, key_cost numeric)
LANGUAGE plpgsql
AS $$
DECLARE
    v_day date := (now() AT TIME ZONE p_tz)::date;
    v_month date := date_trunc('month', now() AT TIME ZONE p_tz)::date;
    v_exceeded text := '';
    a_t bigint; a_c numeric; d_t bigint; d_c numeric; m_t bigint; m_c numeric;
    k_t bigint; k_c numeric;
BEGIN
    -- Its own short transaction: a server crash can lose a hold, never a spend.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- 1. One reserver of an owner at a time (until its commit).
    PERFORM pg_advisory_xact_lock(hashtextextended('budget:' || p_owner, 0));
    DELETE FROM billing_budgethold WHERE owner_id = p_owner AND expires_at <= now();
    -- 2. The owner's other calls in flight; this session's own row counts only if this run
    --    made it (a step's earlier call): another run's (a crash) is replaced below. Read
    --    before the rollups: a step that commits between the two reads is counted twice
    --    (its hold and its cost), never missed.
    SELECT coalesce(sum(h.tokens) FILTER (WHERE h.agent_id = p_agent), 0),
           coalesce(sum(h.cost) FILTER (WHERE h.agent_id = p_agent), 0),
           coalesce(sum(h.tokens), 0), coalesce(sum(h.cost), 0),
           coalesce(sum(h.tokens) FILTER (WHERE h.api_key_id = p_key), 0),
           coalesce(sum(h.cost) FILTER (WHERE h.api_key_id = p_key), 0)
      INTO a_t, a_c, d_t, d_c, k_t, k_c
      FROM billing_budgethold h
     WHERE h.owner_id = p_owner AND (h.session_id <> p_session OR h.run = p_run);
    m_t := d_t;
    m_c := d_c;
    -- 3. What the periods spent: the sums of their days' rollups (the month's only if it
    --    has a budget).
    SELECT a_t + coalesce(sum(u.input_tokens + u.output_tokens)
                          FILTER (WHERE u.agent_id = p_agent AND u.day = v_day), 0),
           a_c + coalesce(sum(u.cost) FILTER (WHERE u.agent_id = p_agent AND u.day = v_day), 0),
           d_t + coalesce(sum(u.input_tokens + u.output_tokens) FILTER (WHERE u.day = v_day), 0),
           d_c + coalesce(sum(u.cost) FILTER (WHERE u.day = v_day), 0),
           m_t + coalesce(sum(u.input_tokens + u.output_tokens), 0),
           m_c + coalesce(sum(u.cost), 0)
      INTO a_t, a_c, d_t, d_c, m_t, m_c
      FROM billing_usagedaily u
     WHERE u.owner_id = p_owner
       AND u.day >= (CASE WHEN p_month_tokens IS NULL AND p_month_cost IS NULL
                          THEN v_day ELSE v_month END);
    IF p_key_period IS NOT NULL THEN
        SELECT k_t + coalesce(sum(s.input_tokens + s.output_tokens), 0),
               k_c + coalesce(sum(s.cost), 0)
          INTO k_t, k_c
          FROM billing_spenddaily s
         WHERE s.api_key_id = p_key
           AND s.day >= (CASE WHEN p_key_period = 'month' THEN v_month ELSE v_day END);
    END IF;
    -- 4. The call's worst case must fit every budget (a NULL limit: none).
    IF a_t + p_tokens > p_agent_day_tokens OR a_c + p_cost > p_agent_day_cost THEN
        v_exceeded := 'agent day';
    ELSIF d_t + p_tokens > p_day_tokens OR d_c + p_cost > p_day_cost THEN
        v_exceeded := 'owner day';
    ELSIF m_t + p_tokens > p_month_tokens OR m_c + p_cost > p_month_cost THEN
        v_exceeded := 'owner month';
    ELSIF k_t + p_tokens > p_key_tokens OR k_c + p_cost > p_key_cost THEN
        v_exceeded := 'API key ' || p_key_period;
    END IF;
    IF v_exceeded = '' THEN
        INSERT INTO billing_budgethold AS h (session_id, owner_id, agent_id, api_key_id, run,
                                             tokens, cost, created_at, expires_at)
        VALUES (p_session, p_owner, p_agent, p_key, p_run, p_tokens, p_cost, now(),
                now() + make_interval(secs => p_hold_s))
        ON CONFLICT (session_id) DO UPDATE SET
            tokens = CASE WHEN h.run = EXCLUDED.run THEN h.tokens + EXCLUDED.tokens
                          ELSE EXCLUDED.tokens END,
            cost = CASE WHEN h.run = EXCLUDED.run THEN h.cost + EXCLUDED.cost
                        ELSE EXCLUDED.cost END,
            owner_id = EXCLUDED.owner_id, agent_id = EXCLUDED.agent_id,
            api_key_id = EXCLUDED.api_key_id, run = EXCLUDED.run,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at;
    END IF;
    RETURN QUERY SELECT v_exceeded, a_t, a_c, d_t, d_c, m_t, m_c, k_t, k_c;
END
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS billing_budget_reserve(bigint, bigint, bigint, uuid, varchar, "
    "text, bigint, numeric, double precision, bigint, numeric, bigint, numeric, bigint, "
    "numeric, text, bigint, numeric);"
)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0009_spend_per_day_key_budgets_notices"),
    ]

    operations = [
        migrations.CreateModel(
            name="BudgetHold",
            fields=[
                ("session_id", models.UUIDField(primary_key=True, serialize=False)),
                ("owner_id", models.BigIntegerField()),
                ("agent_id", models.BigIntegerField()),
                ("api_key_id", models.BigIntegerField(default=0)),
                ("run", models.CharField(blank=True, max_length=200)),
                ("tokens", models.BigIntegerField(default=0)),
                ("cost", models.DecimalField(decimal_places=6, default=0, max_digits=20)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "budget hold",
                "indexes": [models.Index(fields=["owner_id"], name="budget_hold_owner")],
            },
        ),
        migrations.RunSQL(CREATE, DROP),
    ]

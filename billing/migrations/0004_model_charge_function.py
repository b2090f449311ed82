"""The model-call charge as a PL/pgSQL function, and one ledger index fewer.

A paid model step charges its points in the step's batch. As one ad-hoc statement the
server planned a five-part CTE at every step (~0.4 ms); a PL/pgSQL function keeps the
plans of its statements for the life of the connection, so a step pays only for
running them. Unlike a client-side PREPARE this works behind a transaction-pooling
PgBouncer (the plans live in the server backend, not in a named statement), and
PostgreSQL invalidates them itself when a table it reads changes.

`billing.services.model_charge_statement` is the only caller; the tests in
`tests/billing/test_services.py` pin its behaviour (idempotency, never below zero,
concurrent charges, ledger rows, rollups).
"""

from django.db import migrations, models
import django.db.models.deletion

CREATE = """
CREATE OR REPLACE FUNCTION billing_model_charge(
    p_owner bigint, p_agent bigint, p_session uuid, p_tz text,
    p_keys varchar[], p_points bigint[], p_notes varchar[],
    p_usage boolean, p_input bigint, p_output bigint, p_cost numeric,
    p_model_calls bigint, p_tool_calls bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_day date := (now() AT TIME ZONE p_tz)::date;
    v_account bigint;
    v_balance bigint;
    v_taken bigint := 0;
    v_left bigint;
    v_one bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM billing_creditledger
                    WHERE kind = 'charge' AND idempotency_key <> ''
                      AND idempotency_key = ANY (p_keys)) THEN
        SELECT id, balance INTO v_account, v_balance
          FROM billing_creditaccount WHERE owner_id = p_owner FOR NO KEY UPDATE;
        IF FOUND THEN
            v_taken := LEAST(v_balance, (SELECT sum(x) FROM unnest(p_points) x));
            UPDATE billing_creditaccount
               SET balance = balance - v_taken,
                   spent_today = (CASE WHEN spent_day = v_day THEN spent_today ELSE 0 END) + v_taken,
                   spent_day = v_day, updated_at = now()
             WHERE id = v_account;
            v_left := v_taken;
            FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
                v_one := LEAST(p_points[i], v_left);
                EXIT WHEN v_one <= 0;
                v_left := v_left - v_one;
                v_balance := v_balance - v_one;
                INSERT INTO billing_creditledger (account_id, kind, points, delta, balance_after,
                       idempotency_key, actor, note, session_id, agent_id, tool, created_at)
                VALUES (v_account, 'charge', v_one, -v_one, v_balance, p_keys[i], '', p_notes[i],
                        p_session, p_agent, '', now());
            END LOOP;
        END IF;
    END IF;
    IF p_usage OR v_taken > 0 THEN
        INSERT INTO billing_usagedaily AS u (owner_id, agent_id, day, input_tokens, output_tokens,
                                             cost, model_calls, tool_calls, credits_spent)
        VALUES (p_owner, p_agent, v_day, p_input, p_output, p_cost, p_model_calls, p_tool_calls,
                v_taken)
        ON CONFLICT (owner_id, agent_id, day) DO UPDATE SET
            input_tokens = u.input_tokens + EXCLUDED.input_tokens,
            output_tokens = u.output_tokens + EXCLUDED.output_tokens,
            cost = u.cost + EXCLUDED.cost,
            model_calls = u.model_calls + EXCLUDED.model_calls,
            tool_calls = u.tool_calls + EXCLUDED.tool_calls,
            credits_spent = u.credits_spent + EXCLUDED.credits_spent;
    END IF;
    RETURN v_taken;
END
$$;
"""

DROP = "DROP FUNCTION IF EXISTS billing_model_charge(bigint, bigint, uuid, text, varchar[], bigint[], varchar[], boolean, bigint, bigint, numeric, bigint, bigint);"


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0003_ledger_charge"),
    ]

    operations = [
        migrations.RunSQL(CREATE, DROP),
        # Only the index goes: an AlterField would also drop and re-add the foreign key,
        # re-checking every ledger row under a lock.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "billing_creditledger_account_id_9b0260ad"',
                    'CREATE INDEX IF NOT EXISTS "billing_creditledger_account_id_9b0260ad"'
                    ' ON "billing_creditledger" ("account_id")',
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="creditledger",
                    name="account",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ledger",
                        to="billing.creditaccount",
                    ),
                )
            ],
        ),
    ]

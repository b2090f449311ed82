"""The model-call charge finds a key already charged through the ledger's unique index.

0004's function looked each key up in the ledger before it locked the account, then
inserted the rows: two probes of `credit_ledger_once_per_key` per call. Now the account
is locked first and each ledger row is inserted with ON CONFLICT DO NOTHING: a key
charged before (a re-run after a crash) inserts nothing and takes nothing, found by the
probe the insert makes anyway. Keys are charged one by one, so a step whose keys were
partly charged (never written by the engine: a step's charges commit together) would
still take each key's points once.

Same signature and result as 0004, so `billing.services.model_charge_statement` and its
tests are unchanged.
"""

from django.db import migrations

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
    -- The lock first: concurrent charges of one owner take their points in turn.
    SELECT id, balance INTO v_account, v_balance
      FROM billing_creditaccount WHERE owner_id = p_owner FOR NO KEY UPDATE;
    IF FOUND THEN
        v_left := LEAST(v_balance, (SELECT sum(x) FROM unnest(p_points) x));
        FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
            v_one := LEAST(p_points[i], v_left);
            EXIT WHEN v_one <= 0;
            INSERT INTO billing_creditledger (account_id, kind, points, delta, balance_after,
                   idempotency_key, actor, note, session_id, agent_id, tool, created_at)
            VALUES (v_account, 'charge', v_one, -v_one, v_balance - v_one, p_keys[i], '',
                    p_notes[i], p_session, p_agent, '', now())
            ON CONFLICT (kind, idempotency_key) WHERE idempotency_key <> '' DO NOTHING;
            IF FOUND THEN
                v_left := v_left - v_one;
                v_balance := v_balance - v_one;
                v_taken := v_taken + v_one;
            END IF;
        END LOOP;
        IF v_taken > 0 THEN
            UPDATE billing_creditaccount
               SET balance = balance - v_taken,
                   spent_today = (CASE WHEN spent_day = v_day THEN spent_today ELSE 0 END) + v_taken,
                   spent_day = v_day, updated_at = now()
             WHERE id = v_account;
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


def _previous() -> str:
    from importlib import import_module

    return import_module("billing.migrations.0004_model_charge_function").CREATE


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0004_model_charge_function"),
    ]

    operations = [
        migrations.RunSQL(CREATE, _previous()),
    ]

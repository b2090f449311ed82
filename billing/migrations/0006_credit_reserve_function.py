"""A tool call's credit reservation as a PL/pgSQL function: one statement, one round trip.

`billing.services.credit_reserve` held a call's points in a transaction of its own:
BEGIN, the key's reservation locked, the guarded UPDATE of the account, the
reservation row, the ledger row, COMMIT, six round trips and four ORM statements for
each paid call, before the call could be sent. The function does the same work, in
the same order and with the same locks, in one statement; a tool step's paid calls
are reserved by one batch of them (`engine.gates.metering.credits_reserve`).

The result row: outcome (reserved, insufficient, wait, unmetered), the points left,
the reason of a refusal (balance, daily_cap, no_account), the balance after a
reservation and the account's low-water mark.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION billing_credit_reserve(
    p_owner bigint, p_key varchar, p_points bigint, p_session uuid, p_agent bigint,
    p_tool varchar, p_value_per_point double precision, p_tz text, p_wait_s double precision,
    p_required boolean)
RETURNS TABLE (outcome text, points_left bigint, reason text, balance_after bigint,
               low_water_mark bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    v_day date := (now() AT TIME ZONE p_tz)::date;
    v_waiting bigint;
    v_status text;
    v_wait_until timestamptz;
    v_account bigint;
    v_balance bigint;
    v_reserved bigint;
    v_cap bigint;
    v_spent bigint;
    v_low bigint;
    v_left bigint;
    v_reason text;
BEGIN
    -- 1. A reservation of this key already decided wins (a re-run after a crash).
    SELECT r.id, r.status, r.wait_until INTO v_waiting, v_status, v_wait_until
      FROM billing_creditreservation r WHERE r.idempotency_key = p_key FOR NO KEY UPDATE;
    IF v_status IN ('reserved', 'settled') THEN
        RETURN QUERY SELECT 'reserved'::text, 0::bigint, ''::text, 0::bigint, 0::bigint;
        RETURN;
    ELSIF v_status IN ('released', 'refused') THEN
        SELECT a.balance INTO v_balance FROM billing_creditaccount a WHERE a.owner_id = p_owner;
        RETURN QUERY SELECT 'insufficient'::text, coalesce(v_balance, 0), 'balance'::text,
                            0::bigint, 0::bigint;
        RETURN;
    END IF;
    -- 2. Take the points if the balance and the daily cap allow and no waiting call
    --    of higher value per point (or the same, queued earlier) is ahead.
    UPDATE billing_creditaccount AS a
       SET balance = a.balance - p_points, reserved = a.reserved + p_points,
           spent_today = (CASE WHEN a.spent_day = v_day THEN a.spent_today ELSE 0 END) + p_points,
           spent_day = v_day, updated_at = now()
     WHERE a.owner_id = p_owner AND a.balance >= p_points
       AND (a.daily_cap IS NULL
            OR (CASE WHEN a.spent_day = v_day THEN a.spent_today ELSE 0 END) + p_points
               <= a.daily_cap)
       AND NOT EXISTS (
           SELECT 1 FROM billing_creditreservation w
            WHERE w.account_id = a.id AND w.status = 'waiting' AND w.wait_until > now()
              AND (CASE WHEN v_waiting IS NULL THEN w.value_per_point >= p_value_per_point
                        ELSE w.value_per_point > p_value_per_point
                             OR (w.value_per_point = p_value_per_point AND w.id < v_waiting)
                   END))
    RETURNING a.id, a.balance, a.low_water_mark INTO v_account, v_balance, v_low;
    IF FOUND THEN
        IF v_waiting IS NOT NULL THEN
            UPDATE billing_creditreservation SET status = 'reserved', points = p_points
             WHERE id = v_waiting;
        ELSE
            INSERT INTO billing_creditreservation (idempotency_key, account_id, session_id,
                   agent_id, tool, points, status, value_per_point, created_at)
            VALUES (p_key, v_account, p_session, p_agent, left(p_tool, 100), p_points,
                    'reserved', p_value_per_point, now());
        END IF;
        INSERT INTO billing_creditledger (account_id, kind, points, delta, balance_after,
               idempotency_key, actor, note, session_id, agent_id, tool, created_at)
        VALUES (v_account, 'reserve', p_points, -p_points, v_balance, p_key, '', '',
                p_session, p_agent, left(p_tool, 100), now());
        RETURN QUERY SELECT 'reserved'::text, v_balance, ''::text, v_balance, v_low;
        RETURN;
    END IF;
    -- 3. Not taken: wait for in-flight reservations, or be refused.
    SELECT a.id, a.balance, a.reserved, a.daily_cap,
           (CASE WHEN a.spent_day = v_day THEN a.spent_today ELSE 0 END)
      INTO v_account, v_balance, v_reserved, v_cap, v_spent
      FROM billing_creditaccount a WHERE a.owner_id = p_owner;
    IF NOT FOUND THEN
        IF p_required THEN
            RETURN QUERY SELECT 'insufficient'::text, 0::bigint, 'no_account'::text,
                                0::bigint, 0::bigint;
        ELSE
            RETURN QUERY SELECT 'unmetered'::text, 0::bigint, ''::text, 0::bigint, 0::bigint;
        END IF;
        RETURN;
    END IF;
    IF v_cap IS NOT NULL AND v_spent + p_points > v_cap THEN
        -- In-flight calls already count against the cap: waiting cannot help.
        v_left := GREATEST(LEAST(v_balance, v_cap - v_spent), 0);
        v_reason := 'daily_cap';
    ELSIF p_points > v_balance + v_reserved
          OR (v_wait_until IS NOT NULL AND v_wait_until <= now()) THEN
        v_left := v_balance;
        v_reason := 'balance';
    END IF;
    IF v_reason IS NOT NULL THEN
        IF v_waiting IS NOT NULL THEN
            UPDATE billing_creditreservation SET status = 'refused', finished_at = now()
             WHERE id = v_waiting;
        END IF;
        RETURN QUERY SELECT 'insufficient'::text, v_left, v_reason, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF v_waiting IS NULL THEN
        INSERT INTO billing_creditreservation (idempotency_key, account_id, session_id,
               agent_id, tool, points, status, value_per_point, created_at, wait_until)
        VALUES (p_key, v_account, p_session, p_agent, left(p_tool, 100), p_points,
                'waiting', p_value_per_point, now(), now() + make_interval(secs => p_wait_s));
    END IF;
    RETURN QUERY SELECT 'wait'::text, v_balance, ''::text, v_balance, 0::bigint;
END
$$;
"""

DROP = (
    "DROP FUNCTION IF EXISTS billing_credit_reserve(bigint, varchar, bigint, uuid, bigint, "
    "varchar, double precision, text, double precision, boolean);"
)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_model_charge_once_by_index"),
    ]

    operations = [
        migrations.RunSQL(CREATE, DROP),
    ]

"""Benchmark `billing`: what metering adds to a step, and the cost rankings at scale.

1. **Metering per step** (target p50 <= 0.5 ms): the work billing adds to a model step
   on a real session of the bench database, timed around the calls the engine makes:
   - the pre-call gate (`engine/budget_gate.model_gate`: the owner's budgets,
     today's rollups, the turn's spend and the credits, read by one query at a turn's
     first model step and kept in the run's context for its later steps; the budget
     check; the degradation level), with budgets and a credit account set so nothing
     is skipped, in turns of TURN_MODEL_STEPS model steps (each spending 1,240 tokens);
   - the usage rollup upsert, run alone in a rolled-back transaction (an upper bound:
     in `step_commit` it rides the step's one batched round trip).
   - an A/B on real engine-built steps (`bench/stepkit.py`, one session, arms rotated
     per cycle): `step_commit` of a model step (one ModelCall) and of a tool-results
     step with `step_metering` as shipped ("on"; "paid": the endpoint costs points, so
     the charge statement rides along too) and patched to add nothing ("off").
   The figures with the target: gate p50 + (commit p50 on - commit p50 off) per step.
2. **Rankings** (target <= 200 ms): 1,000,000 model calls of 10,000 users as daily
   rollups: each user active every other day of 30 with both agents (300,000 rows, ~3.3
   calls each), written with one `generate_series` INSERT; the same calls as spend rollups
   (SpendDaily, `_spend`: ~460,000 rows, 3 API keys a user, 4 model endpoints); then the
   top 100 users, agents, days, model endpoints and keys of the 30 days, p50 of repeated
   calls of `billing.rankings.cost_rankings`, and the 30- and 90-day spend series stacked
   by model and by agent (`billing.series.spend_series`). The rollups make the time
   depend on users (keys) x days, never on the number of calls.
"""

import time
from decimal import Decimal
from typing import Any

from . import fixtures
from .results_model import Result, figure
from .stats import percentile, summary

USERS = 10_000
DAYS = 30
CALLS = 1_000_000
# A user is active on one day in ACTIVE_EVERY: the rollup rows, not the calls, set the time.
ACTIVE_EVERY = 2
# The spend rollups: API keys per user (one of them used per day), a user in NO_KEY_EVERY
# without a key, and the endpoints: the two agents' models, a summariser, a fallback.
KEYS_PER_USER = 3
NO_KEY_EVERY = 20
ENDPOINTS = ("bench-large", "bench-small", "bench-summary", "bench-fallback")
SERIES_DAYS = (30, 90)
# Model steps per turn in the gate's measurement: a tool call or two, then the answer.
TURN_MODEL_STEPS = 3


def _gate_and_upsert(reps: int) -> dict[str, list[float]]:
    """The gate as a run calls it (its figures kept per turn), a paid endpoint's credits
    check and the rollup upsert alone; `gate_read_ms`/`gate_kept_ms` split the gate's
    times by whether it read."""
    import copy

    from django.db import connection, transaction

    from billing.models import CreditAccount, OwnerBudget
    from billing.services import notices_raise, usage_statement
    from engine.gates.budget import FiguresKeeper, gate_read, model_gate
    from engine.model.credits import model_credits_check
    from engine.run_cache import agent_runtime
    from llm.types import ChatMessage, ChatRequest
    from record.models import Agent, Session

    session = fixtures.sessions_create("bench-echo", 1, username="bench-billing")[0]
    Agent.objects.filter(slug="bench-echo").update(
        budget_turn_tokens=10**9, budget_session_cost=Decimal(10**6), budget_day_tokens=10**9
    )
    OwnerBudget.objects.update_or_create(owner_id=session.owner_id, defaults={"day_tokens": 10**9})
    CreditAccount.objects.update_or_create(
        owner_id=session.owner_id, defaults={"balance": 10**6, "low_water_mark": 100}
    )
    session = Session.objects.get(pk=session.pk)
    agent = agent_runtime(session.agent_id).agent
    paid = copy.copy(agent.model)
    paid.credits_per_1k_tokens = Decimal(1)
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content="Echo the user."),
            ChatMessage(role="user", content="What did I order last week? " * 4),
        )
    )
    gate_ms: list[float] = []
    read_ms: list[float] = []
    kept_ms: list[float] = []
    upsert_ms: list[float] = []
    cover_ms: list[float] = []
    keep = FiguresKeeper()
    for i in range(reps + 20):
        if i % TURN_MODEL_STEPS == 0:
            session.turn += 1  # in memory only: the kept figures are of the last turn
        started = time.perf_counter()
        read = gate_read(session, agent, keep)  # as model_phase calls it, with its notices
        notices_raise(read.notices)
        model_gate(session, agent, request, read)
        gate = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        model_credits_check(session, paid, request, 512, read.figures, keep.points_since)
        cover = (time.perf_counter() - started) * 1000
        keep.spent_points(2)  # the step's charge, as model_phase counts it
        session.input_tokens += 1200  # what the step's commit adds to the run's session
        session.output_tokens += 40
        sql, params = usage_statement(  # type: ignore[misc]
            owner_id=session.owner_id,
            agent_id=agent.pk,
            session_id=session.pk,
            input_tokens=120,
            output_tokens=40,
            cost=Decimal("0.0012"),
            model_calls=1,
        )
        with transaction.atomic():
            started = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
            upsert = (time.perf_counter() - started) * 1000
            transaction.set_rollback(True)
        if i >= 20:  # warm-up: connections, caches
            gate_ms.append(gate)
            (read_ms if i % TURN_MODEL_STEPS == 0 else kept_ms).append(gate)
            upsert_ms.append(upsert)
            cover_ms.append(cover)
    return {
        "cover_ms": cover_ms,
        "gate_ms": gate_ms,
        "gate_read_ms": read_ms,
        "gate_kept_ms": kept_ms,
        "upsert_ms": upsert_ms,
    }


ARMS = ("off", "on", "paid")


def _metering_ab(cycles: int) -> dict[str, dict[str, list[float]]]:
    """`step_commit` wall time per arm and step kind, on real engine-built steps.

    - off: `step_metering` patched to add nothing (the engine without metering);
    - on: as shipped, the model on an unpaid endpoint: the usage upsert on the model
      step, the usage and tool-usage upserts on the tool step;
    - paid: as `on`, the endpoint costing credit points: plus the model call's charge.
    The arms rotate per cycle, so drift on a shared machine hits all three alike."""
    import copy

    from billing.models import CreditAccount
    from engine.moves import turn as commit_module
    from engine.moves.turn import metered_commit as step_commit
    from record.models import ModelCall

    from . import stepkit

    real = commit_module.step_metering
    ((session, owner),) = stepkit.leased_sessions("bench-noop", 1)
    CreditAccount.objects.update_or_create(
        owner_id=session.owner_id, defaults={"balance": 10**12, "daily_cap": None}
    )
    endpoint = session.agent.model
    paid = copy.copy(endpoint)
    paid.credits_per_1k_tokens = Decimal(1)
    out: dict[str, dict[str, list[float]]] = {
        arm: {"model_step_ms": [], "tool_step_ms": []} for arm in ARMS
    }

    def timed(step: Any) -> float:
        started = time.perf_counter()
        step_commit(step)
        return (time.perf_counter() - started) * 1000

    try:
        for cycle in range(cycles + 30):
            arm = ARMS[(cycle + cycle // len(ARMS)) % len(ARMS)]
            commit_module.step_metering = real if arm != "off" else (lambda *a, **k: [])  # type: ignore[assignment]
            step, rows = stepkit.intents_step(session, owner, 1, f"m{cycle}")
            step.model_calls.append(
                ModelCall(
                    turn=session.turn,
                    step=0,
                    endpoint=paid if arm == "paid" else endpoint,
                    endpoint_name=endpoint.name,
                    api=endpoint.api,
                    model=endpoint.model,
                    input_tokens=1200,
                    output_tokens=40,
                    cost=Decimal("0.0012"),
                    outcome="success",
                    purpose="step",  # a db_default the batched insert cannot send
                )
            )
            model_ms = timed(step)
            tool_ms = timed(stepkit.results_step(session, owner, rows))
            step_commit(stepkit.loop_step(session, owner))
            if cycle >= 30:  # warm-up
                out[arm]["model_step_ms"].append(model_ms)
                out[arm]["tool_step_ms"].append(tool_ms)
    finally:
        commit_module.step_metering = real
    return out


def _rollups() -> dict[str, Any]:
    """10,000 users and their 30 days of rollups on two agents, 1,000,000 calls in all."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from billing.models import UsageDaily
    from record.models import Agent

    user_table = get_user_model()._meta.db_table
    agents = list(
        Agent.objects.filter(slug__in=["bench-echo", "bench-demo"]).values_list("pk", flat=True)
    )
    rows = USERS * DAYS * len(agents) // ACTIVE_EVERY
    per_row = CALLS / rows
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{UsageDaily._meta.db_table}"')
        cursor.execute(
            f"""INSERT INTO "{user_table}" (username, password, is_superuser, first_name, last_name,
                                            email, is_staff, is_active, date_joined)
                SELECT 'bench-rank-' || n, '!', false, '', '', '', false, true, now()
                  FROM generate_series(1, %s) n
                ON CONFLICT (username) DO NOTHING""",
            [USERS],
        )
        # Calls per row vary around the mean (1..2x), so the sum is about CALLS.
        cursor.execute(
            f"""INSERT INTO "{UsageDaily._meta.db_table}"
                    (owner_id, agent_id, day, input_tokens, output_tokens, cost,
                     model_calls, tool_calls, credits_spent)
                SELECT u.id, a.id, current_date - d, c * 900, c * 250, c * 0.0011 + (u.id %% 97) * 0.0001,
                       c, c / 2, c * 3
                  FROM (SELECT id FROM "{user_table}" WHERE username LIKE 'bench-rank-%%') u
                 CROSS JOIN unnest(%s::bigint[]) AS a(id)
                 CROSS JOIN generate_series(0, %s) d
                 CROSS JOIN LATERAL (SELECT greatest(1, round(%s * (0.5 + ((u.id * 7 + d * 13 + a.id) %% 100) / 100.0)))::int AS c) calls
                 WHERE (u.id + d) %% %s = 0""",
            [agents, DAYS - 1, per_row, ACTIVE_EVERY],
        )
        cursor.execute(f'ANALYZE "{UsageDaily._meta.db_table}"')
        cursor.execute(f'SELECT count(*), sum(model_calls) FROM "{UsageDaily._meta.db_table}"')
        count, calls = cursor.fetchone()
    return {
        "rows": int(count),
        "calls": int(calls),
        "load_s": round(time.perf_counter() - started, 1),
    }


def _spend() -> dict[str, Any]:
    """The spend rollups of the same calls (`_rollups` first): per user, agent and active
    day, the agent's model endpoint, plus a summariser on a third of them and a fallback
    on a tenth; the day's key one of the user's KEYS_PER_USER API keys (key 0, sessions
    opened without a key, for one user in NO_KEY_EVERY). One INSERT of ApiKey rows, one
    of SpendDaily rows, both from `generate_series`."""
    from django.db import connection

    from accounts.models import ApiKey
    from billing.models import SpendDaily, UsageDaily

    usage = UsageDaily._meta.db_table
    spend = SpendDaily._meta.db_table
    keys = ApiKey._meta.db_table
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{spend}"')
        cursor.execute(f"DELETE FROM \"{keys}\" WHERE name LIKE 'bench-rank-%%'")
        cursor.execute(
            f"""INSERT INTO "{keys}" (owner_id, name, prefix, key_hash, roles, is_active,
                                      created_at)
                SELECT u.owner_id, 'bench-rank-' || n, 'bk' || n, md5(u.owner_id || '-' || n),
                       '{{}}', true, now()
                  FROM (SELECT DISTINCT owner_id FROM "{usage}") u
                 CROSS JOIN generate_series(1, %s) n""",
            [KEYS_PER_USER],
        )
        # A day's rows split its UsageDaily calls between its endpoints; the main endpoint
        # costs most per call, so the ranking by model is not by row count alone. A user is
        # active on days of one parity (owner + d even), so the fallback's condition must
        # not depend on the owner and the day through their parity alone: with an odd
        # owner factor it held on even dates only (no fallback row on an odd one).
        cursor.execute(
            f"""WITH user_keys AS (
                    SELECT owner_id, array_agg(id ORDER BY id) AS ids FROM "{keys}"
                     WHERE name LIKE 'bench-rank-%%' GROUP BY owner_id),
                agents AS (
                    SELECT agent_id, row_number() OVER (ORDER BY agent_id) AS n
                      FROM (SELECT DISTINCT agent_id FROM "{usage}") a)
                INSERT INTO "{spend}" (owner_id, day, agent_id, endpoint, api_key_id, shard,
                                       input_tokens, output_tokens, cost, model_calls)
                SELECT r.owner_id, r.day, r.agent_id, e.endpoint,
                       CASE WHEN r.owner_id %% %s = 0 THEN 0
                            ELSE k.ids[1 + (r.day - date '2000-01-01') / 2 %% %s] END,
                       0, c * 900, c * 250, c * e.per_call, c
                  FROM "{usage}" r
                  JOIN agents a USING (agent_id)
                  JOIN user_keys k USING (owner_id)
                 CROSS JOIN LATERAL (
                       SELECT 1 + ((r.owner_id + r.day - date '2000-01-01') %% 3 = 0)::int
                                + ((r.owner_id * 2 + r.day - date '2000-01-01') %% 10 = 0)::int
                              AS n) split
                 CROSS JOIN LATERAL (
                       SELECT greatest(1, round(r.model_calls::numeric / split.n))::int AS c) calls
                  JOIN (VALUES (%s, 1, 0.0031), (%s, 2, 0.0009),
                               (%s, 0, 0.0002), (%s, -1, 0.0004)) AS e(endpoint, agent_n, per_call)
                    ON e.agent_n = a.n
                    OR (e.agent_n = 0 AND (r.owner_id + r.day - date '2000-01-01') %% 3 = 0)
                    OR (e.agent_n = -1
                        AND (r.owner_id * 2 + r.day - date '2000-01-01') %% 10 = 0)""",
            [NO_KEY_EVERY, KEYS_PER_USER, *ENDPOINTS],
        )
        # VACUUM, not ANALYZE alone: it sets the visibility map that index-only scans
        # need, as autovacuum does for the settled days of a real table.
        cursor.execute(f'VACUUM ANALYZE "{spend}"')
        cursor.execute(
            f"""SELECT count(*), sum(model_calls), count(DISTINCT api_key_id),
                       count(DISTINCT endpoint)
                  FROM "{spend}"
            """
        )
        count, calls, key_count, endpoints = cursor.fetchone()
    return {
        "rows": int(count),
        "calls": int(calls),
        "keys": int(key_count),
        "endpoints": int(endpoints),
        "load_s": round(time.perf_counter() - started, 1),
    }


def _rankings(reps: int) -> dict[str, list[float]]:
    from django.utils import timezone

    from billing.rankings import cost_rankings

    end = timezone.localdate()
    start = end.fromordinal(end.toordinal() - (DAYS - 1))
    times: dict[str, list[float]] = {}
    for group in ("user", "agent", "day", "model", "key"):
        cost_rankings(group=group, start=start, end=end)  # warm the cache
        times[group] = []
        for _ in range(reps):
            started = time.perf_counter()
            rows = cost_rankings(group=group, start=start, end=end, order="-cost", limit=100)
            times[group].append((time.perf_counter() - started) * 1000)
        assert rows, group
    return times


def _series(reps: int) -> dict[str, list[float]]:
    """`spend_series` per stack and period, ending today (the fixture's last day)."""
    from django.utils import timezone

    from billing.series import spend_series

    end = timezone.localdate()
    times: dict[str, list[float]] = {}
    for stack in ("model", "agent"):
        for days in SERIES_DAYS:
            start = end.fromordinal(end.toordinal() - (days - 1))
            name = f"{stack}_{days}d"
            spend_series(stack=stack, start=start, end=end)  # warm the cache
            times[name] = []
            for _ in range(reps):
                started = time.perf_counter()
                series = spend_series(stack=stack, start=start, end=end)
                times[name].append((time.perf_counter() - started) * 1000)
            assert series.total > 0, name
    return times


def run(*, gate_reps: int = 300, ranking_reps: int = 10, ab_cycles: int = 1200) -> Result:
    result = Result(
        name="billing",
        title="Metering per step and cost rankings over 1M calls",
        params={
            "gate_reps": gate_reps,
            "ranking_reps": ranking_reps,
            "ab_cycles": ab_cycles,
            "users": USERS,
            "days": DAYS,
        },
    )
    metering = _gate_and_upsert(gate_reps)
    both = [g + u for g, u in zip(metering["gate_ms"], metering["upsert_ms"], strict=True)]
    ab = _metering_ab(ab_cycles)
    q = percentile

    def added(arm: str, kind: str) -> float:
        return q(ab[arm][kind], 50) - q(ab["off"][kind], 50)

    gate = q(metering["gate_ms"], 50)
    data = _rollups()
    spend = _spend()
    rankings = _rankings(ranking_reps)
    series = _series(ranking_reps)
    result.figures = [
        figure(
            "metering_model_step_p50_ms",
            "metering in a real model step: gate + commit with minus without metering, p50",
            gate + added("on", "model_step_ms"),
            "ms",
            le=0.5,
        ),
        figure(
            "metering_paid_model_step_p50_ms",
            "the same, the endpoint costing points (plus its credits check and charge), p50",
            gate + q(metering["cover_ms"], 50) + added("paid", "model_step_ms"),
            "ms",
            le=0.5,
        ),
        figure(
            "metering_tool_step_p50_ms",
            "metering in a real tool step: commit with minus without metering, p50",
            added("on", "tool_step_ms"),
            "ms",
            le=0.5,
        ),
        figure(
            "metering_p50_ms",
            "metering per step (gate + usage upsert alone), p50",
            q(both, 50),
            "ms",
        ),
        figure(
            "metering_p95_ms",
            "metering per step (gate + usage upsert alone), p95",
            q(both, 95),
            "ms",
        ),
        figure(
            "gate_p50_ms",
            "pre-call gate (budgets, credits, degradation), p50",
            q(metering["gate_ms"], 50),
            "ms",
        ),
        figure(
            "gate_read_p50_ms",
            "pre-call gate at a turn's first model step (its one query), p50",
            q(metering["gate_read_ms"], 50),
            "ms",
        ),
        figure(
            "gate_kept_p50_ms",
            "pre-call gate at a turn's later model steps (kept figures), p50",
            q(metering["gate_kept_ms"], 50),
            "ms",
        ),
        figure(
            "credits_check_p50_ms",
            "a paid endpoint's credits check before the call (from the gate's figures), p50",
            q(metering["cover_ms"], 50),
            "ms",
        ),
        figure(
            "upsert_p50_ms",
            "usage rollup upsert alone (own round trip), p50",
            q(metering["upsert_ms"], 50),
            "ms",
        ),
        figure(
            "rankings_users_p50_ms",
            "top 100 users over 30 days, 1M calls of 10k users (300k rollup rows), p50",
            q(rankings["user"], 50),
            "ms",
            le=200,
        ),
        figure(
            "rankings_agents_p50_ms",
            "top agents over 30 days, p50",
            q(rankings["agent"], 50),
            "ms",
            le=200,
        ),
        figure(
            "rankings_days_p50_ms", "days over 30 days, p50", q(rankings["day"], 50), "ms", le=200
        ),
        figure(
            "rankings_models_p50_ms",
            f"top 100 model endpoints over 30 days ({spend['rows'] // 1000}k spend rows), p50",
            q(rankings["model"], 50),
            "ms",
            le=200,
        ),
        figure(
            "rankings_keys_p50_ms",
            f"top 100 API keys over 30 days ({spend['keys'] // 1000}k keys), p50",
            q(rankings["key"], 50),
            "ms",
            le=200,
        ),
        *(
            figure(
                f"series_{stack}_{days}d_p50_ms",
                f"spend per day over {days} days stacked by {stack}, p50",
                q(series[f"{stack}_{days}d"], 50),
                "ms",
                le=200,
            )
            for stack in ("model", "agent")
            for days in SERIES_DAYS
        ),
    ]
    result.details = {
        "rollups": data,
        "spend_rollups": spend,
        "gate_ms": summary(metering["gate_ms"]),
        "gate_read_ms": summary(metering["gate_read_ms"]),
        "gate_kept_ms": summary(metering["gate_kept_ms"]),
        "turn_model_steps": TURN_MODEL_STEPS,
        "upsert_ms": summary(metering["upsert_ms"]),
        "credits_check_ms": summary(metering["cover_ms"]),
        "step_commit_ms": {
            arm: {kind: summary(values) for kind, values in kinds.items()}
            for arm, kinds in ab.items()
        },
        "rankings_ms": {k: summary(v) for k, v in rankings.items()},
        "series_ms": {k: summary(v) for k, v in series.items()},
    }
    return result

"""Benchmark `billing`: what metering adds to a step, and the cost rankings at scale.

1. **Metering per step** (target p50 <= 0.5 ms): the work billing adds to a model step
   on a real session of the bench database, timed around the calls the engine makes:
   - the pre-call gate (`sessions/engine/budget_gate.model_gate`: one query for the
     owner's budgets, today's rollups, the turn's spend and the credits; the budget
     check; the degradation level), with budgets and a credit account set so nothing
     is skipped;
   - the usage rollup upsert, run alone in a rolled-back transaction (an upper bound:
     in `step_commit` it rides the step's one batched round trip).
   The figure with the target is the gate plus the upsert alone, p50.
2. **Rankings** (target <= 200 ms): 1,000,000 model calls of 10,000 users as daily
   rollups: each user active every other day of 30 with both agents (300,000 rows, ~3.3
   calls each), written with one `generate_series` INSERT; then the top 100 users, agents and days of the 30 days,
   p50 of repeated calls of `billing.rankings.cost_rankings`. The rollups make the time
   depend on users x days, never on the number of calls.
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


def _gate_and_upsert(reps: int) -> dict[str, list[float]]:
    from django.db import connection, transaction

    from billing.models import CreditAccount, OwnerBudget
    from billing.services import usage_statement
    from llm.types import ChatMessage, ChatRequest
    from sessions.engine.budget_gate import model_gate
    from sessions.engine.runtime_cache import agent_runtime
    from sessions.models import Agent, Session

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
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content="Echo the user."),
            ChatMessage(role="user", content="What did I order last week? " * 4),
        )
    )
    gate_ms: list[float] = []
    upsert_ms: list[float] = []
    for i in range(reps + 20):
        started = time.perf_counter()
        model_gate(session, agent, request)
        gate = (time.perf_counter() - started) * 1000
        sql, params = usage_statement(  # type: ignore[misc]
            owner_id=session.owner_id,
            agent_id=agent.pk,
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
            upsert_ms.append(upsert)
    return {"gate_ms": gate_ms, "upsert_ms": upsert_ms}


def _rollups() -> dict[str, Any]:
    """10,000 users and their 30 days of rollups on two agents, 1,000,000 calls in all."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from billing.models import UsageDaily
    from sessions.models import Agent

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


def _rankings(reps: int) -> dict[str, list[float]]:
    from django.utils import timezone

    from billing.rankings import cost_rankings

    end = timezone.localdate()
    start = end.fromordinal(end.toordinal() - (DAYS - 1))
    times: dict[str, list[float]] = {}
    for group in ("user", "agent", "day"):
        cost_rankings(group=group, start=start, end=end)  # warm the cache
        times[group] = []
        for _ in range(reps):
            started = time.perf_counter()
            rows = cost_rankings(group=group, start=start, end=end, order="-cost", limit=100)
            times[group].append((time.perf_counter() - started) * 1000)
        assert rows, group
    return times


def run(*, gate_reps: int = 300, ranking_reps: int = 10) -> Result:
    result = Result(
        name="billing",
        title="Metering per step and cost rankings over 1M calls",
        params={"gate_reps": gate_reps, "ranking_reps": ranking_reps, "users": USERS, "days": DAYS},
    )
    metering = _gate_and_upsert(gate_reps)
    both = [g + u for g, u in zip(metering["gate_ms"], metering["upsert_ms"], strict=True)]
    data = _rollups()
    rankings = _rankings(ranking_reps)
    q = percentile
    result.figures = [
        figure(
            "metering_p50_ms",
            "metering per step (gate + usage upsert alone), p50",
            q(both, 50),
            "ms",
            le=0.5,
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
    ]
    result.details = {
        "rollups": data,
        "gate_ms": summary(metering["gate_ms"]),
        "upsert_ms": summary(metering["upsert_ms"]),
        "rankings_ms": {k: summary(v) for k, v in rankings.items()},
    }
    return result

"""The daily rollups as a reader sees them: a key's rows (one per session shard) summed."""

import uuid
from types import SimpleNamespace
from typing import Any

from django.db import connection
from django.db.models import Sum

from billing.models import UsageDaily
from billing.services import usage_statement

USAGE = ("input_tokens", "output_tokens", "cost", "model_calls", "tool_calls", "credits_spent")


def usage_totals(**filters: Any) -> SimpleNamespace:
    sums = UsageDaily.objects.filter(**filters).aggregate(**{c: Sum(c) for c in USAGE})
    return SimpleNamespace(**{c: sums[c] or 0 for c in USAGE})


def rollup_shard(session_id: uuid.UUID) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT billing_rollup_shard(%s)", [session_id])
        return int(cursor.fetchone()[0])


def sessions_in_shards(*shards: str) -> list[uuid.UUID]:
    """Session ids whose rollup shards are alike or not as `shards` spells them
    ("AAB": the first two in one shard, the third in another)."""
    picked: list[uuid.UUID] = []
    taken: dict[str, int] = {}
    for label in shards:
        while True:
            candidate = uuid.uuid4()
            shard = rollup_shard(candidate)
            if label in taken:
                if shard == taken[label]:
                    break
            elif shard not in taken.values():
                taken[label] = shard
                break
        picked.append(candidate)
    return picked


def write_usage(*, owner: Any, agent: Any, cost: Any, session_id: Any = None) -> None:
    """Today's spend of an owner's agent, as a step's commit adds it to the rollups."""
    statement = usage_statement(
        owner_id=owner.pk,
        agent_id=agent.pk,
        session_id=session_id or uuid.uuid4(),
        cost=cost,
        model_calls=1,
    )
    assert statement is not None
    with connection.cursor() as cursor:
        cursor.execute(*statement)

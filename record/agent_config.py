"""An agent's configuration as one JSON snapshot: what an agent version stores, what its
content hash is taken of, and what an evaluation's candidate copy is built from.

Pure over a model instance's fields (`_meta`), so the backfill migration's historical
models give the same snapshot and hash as the live ones.
"""

import hashlib
import json
from decimal import Decimal
from typing import Any

# Not the agent's behaviour: its identity, its switch, its rollout (a raise of the
# candidate's percentage is a rollout move, not a new configuration) and its bookkeeping.
UNVERSIONED = frozenset(
    {
        "id",
        "slug",
        "name",
        "enabled",
        "value",
        "candidate_model",
        "candidate_percent",
        "rollout_gate",
        "created_at",
        "updated_at",
    }
)


def agent_config_snapshot(agent: Any) -> dict[str, Any]:
    """Every versioned field as JSON: a model endpoint by its name, a cost as a string."""
    snapshot: dict[str, Any] = {}
    for field in agent._meta.concrete_fields:
        if field.name in UNVERSIONED:
            continue
        if field.is_relation:
            related = getattr(agent, field.name)
            snapshot[field.name] = related.name if related is not None else None
            continue
        value = getattr(agent, field.attname)
        if isinstance(value, Decimal):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        snapshot[field.name] = value
    return snapshot


def agent_config_hash(snapshot: dict[str, Any]) -> str:
    canonical = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()

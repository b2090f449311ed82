"""Before and after of an edit, as the fields that changed (pure Python).

Nested objects (a tool's JSON Schema, a workflow's nodes) are compared key by key down to
`DEPTH` levels, so an edit of one node reads `nodes.refund.args.amount`, not the whole
definition twice; lists are compared whole.
"""

from typing import Any

DEPTH = 6
ABSENT = "(absent)"


def _flat(value: Any, prefix: str, depth: int, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value and depth > 0:
        for key, inner in value.items():
            _flat(inner, f"{prefix}.{key}" if prefix else str(key), depth - 1, out)
    else:
        out[prefix] = value


def flatten(value: dict[str, Any], depth: int = DEPTH) -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [1]} -> {"a.b": 1, "c": [1]}."""
    out: dict[str, Any] = {}
    for key, inner in value.items():
        _flat(inner, str(key), depth - 1, out)
    return out


def changes(
    before: dict[str, Any] | None, after: dict[str, Any] | None, depth: int = DEPTH
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the changed paths' values before, after); a path on one side only is ABSENT on the
    other."""
    old = flatten(before or {}, depth)
    new = flatten(after or {}, depth)
    changed = sorted(k for k in set(old) | set(new) if old.get(k, ABSENT) != new.get(k, ABSENT))
    return (
        {k: old.get(k, ABSENT) for k in changed},
        {k: new.get(k, ABSENT) for k in changed},
    )

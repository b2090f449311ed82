"""The limits a definition and its expressions are held to (docs/security.md "Limits on
definitions and expressions").

Definitions are pure Python (no Django here): the workflows app copies the settings in when
Django starts, and again when a test changes one (workflows/apps.py).
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Limits:
    expression_cost: int = 60_000  # EXPRESSION_COST_LIMIT
    expression_nesting: int = 2  # EXPRESSION_MAX_NESTING
    nodes: int = 500  # WORKFLOW_MAX_NODES
    visits: int = 1000  # WORKFLOW_MAX_VISITS
    branches: int = 32  # WORKFLOW_MAX_BRANCHES
    map_concurrency: int = 50  # WORKFLOW_MAX_MAP_CONCURRENCY


_current = Limits()


def limits() -> Limits:
    return _current


def limits_set(**changes: int) -> None:
    global _current
    _current = replace(_current, **changes)

"""A tool's estimates for its credit pool request: `value` and `cost`, CEL over the call's
`args` and the `session` (engine/gates/credit_pool.py evaluates them). Checked when a config
file is applied and when the admin saves a tool, within the expression limits."""

from workflows.expressions import ExpressionError, expression_compile

ESTIMATE_NAMES = frozenset({"args", "session"})


def estimate_problems(source: str) -> list[str]:
    """What is wrong with an estimate's expression (empty: nothing)."""
    try:
        compiled = expression_compile(source)
    except ExpressionError as exc:
        return [exc.message]
    unknown = sorted(compiled.names - ESTIMATE_NAMES)
    if unknown:
        return [f"names {', '.join(unknown)}; it may read {', '.join(sorted(ESTIMATE_NAMES))}"]
    return []

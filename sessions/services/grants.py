"""What a key may do with a session: run it with its role, set its value (README "Keys and
roles"). Every entry that lets a key drive a session asks here."""

from collections.abc import Sequence

from record.errors import Forbidden


def session_value_check(*, value: float, agent_value: float, value_max: float | None) -> None:
    """A client may ask for a session value up to the agent's own value (what it gets anyway)
    or, above that, up to what an operator granted its key (`ApiKey.max_value`). The value
    orders the broker's queues and the claims on waiting credits, so a higher one is a
    privilege, not a preference (403 `value_not_allowed`, details: the maximum)."""
    limit = agent_value if value_max is None else max(agent_value, value_max)
    if value > limit:
        raise Forbidden(
            f"value {value:g} is above what this API key may set (at most {limit:g}); "
            "an operator grants more with the key's max_value",
            details={"field": "value", "max_value": limit},
            code="value_not_allowed",
        )


def session_role_check(*, role: str, key_roles: Sequence[str]) -> None:
    """A key acts on a session (posts a turn, answers its question, resumes or forks it)
    only if it holds the session's role: the role decides which tools the model may call,
    and the session's role is fixed when it opens, perhaps by another key of the same
    owner with more roles. An empty role (opened by a key without roles) is every key's."""
    if role and role not in key_roles:
        raise Forbidden(
            f"this API key does not hold the role '{role}' the session runs with "
            f"(the key holds: {', '.join(key_roles) or 'no role'})",
            details={"role": role, "key_roles": list(key_roles)},
            code="role_not_held",
        )

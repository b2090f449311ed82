"""Whether a call waits for a person, and who may not be that person."""

from typing import Any

from django.conf import settings

from tools.execution import ToolSnapshot, validator_for
from tools.validation import check_arguments

from .conditions import ConditionError, evaluate

HIGHEST_RISK = 3


def approval_reason(
    tool: ToolSnapshot, arguments: Any, level: int | None = None, why: str = ""
) -> str | None:
    """Why this call needs approval, or None when it may run.

    `level` is the call's risk level (declared or assessed, tools/risk.py).
    """
    if tool.requires_approval:
        stated = (
            arguments.get(tool.approval_reason_argument)
            if tool.approval_reason_argument and isinstance(arguments, dict)
            else None
        )
        return str(stated) if stated else f"{tool.name} always requires approval"
    level = tool.risk_level if level is None else level
    if level is not None and level >= HIGHEST_RISK:
        return f"{tool.name} has risk level {level}" + (f" ({why})" if why else "")
    if tool.approval_when:
        # Judged on what would run: the schema's safe coercions ("80" -> 80) first.
        checked = check_arguments(validator_for(tool), arguments)
        try:
            holds = evaluate(
                tool.approval_when, checked.arguments if not checked.errors else arguments
            )
        except (ConditionError, KeyError, TypeError):
            # A condition that cannot be read (edited into the row by hand) errs on the safe side.
            return f"{tool.name}: its approval condition could not be evaluated"
        if holds:
            return f"{tool.name}: the approval condition holds for these arguments"
    return None


def four_eyes_forbids(*, session_owner_id: int | None, decider_id: int | None) -> bool:
    """True when the decider owns the session the approval belongs to and APPROVAL_FOUR_EYES
    is on: a person never approves their own session's call, whatever else they may do
    (superusers included). The deadline's expiry is not a person's decision."""
    return (
        bool(settings.APPROVAL_FOUR_EYES)
        and decider_id is not None
        and session_owner_id == decider_id
    )

"""Model routing: simple turns to a small model, escalation to the agent's own when it falters.

An agent's `routing` (`{"small": endpoint, "when": CEL, "escalate_on": [...]}`) sends a model
step to the small endpoint when its CEL rule holds for the turn: `message` (the user's
message), `length` (its characters), `dialogue` (`intent`, `slots`), `failures` (tool calls
that failed earlier in this turn), `iteration` (model calls so far this turn). A small
model's answer with an invalid tool call (a tool it was not offered, arguments that are not
JSON) or, when JSON was asked for, invalid JSON, is asked again of the agent's model in the
same step. Each model call records its tier and why.
"""

from dataclasses import dataclass
from typing import Any

from engine.model.structured import answer_check
from llm.types import ChatRequest, ChatResponse
from record.models import Agent, ModelEndpoint, Session
from workflows.expressions import (
    EvaluationError,
    ExpressionError,
    ExpressionLimitError,
    expression_compile,
)

SMALL, MAIN = "small", "main"
ESCALATIONS = ("invalid_tool_call", "invalid_json")


@dataclass(frozen=True)
class Route:
    endpoint: ModelEndpoint | None  # None: the agent's own model
    tier: str
    reason: str


def _turn_scope(session: Session, history: list[Any]) -> dict[str, Any]:
    turn = [m for m in history if getattr(m, "turn", None) == session.turn]
    users = [m for m in turn if m.role == "user"]
    message = users[-1].content if users else ""
    failures = sum(
        1
        for m in turn
        if m.role == "tool"
        and isinstance(m.data, dict)
        and m.data.get("status") in ("failed", "timeout", "rejected")
    )
    state = session.dialogue_state or {}
    return {
        "message": message,
        "length": len(message),
        "dialogue": {"intent": state.get("intent") or "", "slots": state.get("slots") or {}},
        "failures": failures,
        "iteration": session.iteration,
    }


def route(session: Session, agent: Agent, history: list[Any], degraded: bool) -> Route:
    """Where this step's model call goes, and why."""
    routing = agent.routing or {}
    small_name, rule = routing.get("small"), routing.get("when")
    if not small_name or not rule:
        return Route(None, MAIN, "")
    if degraded:
        return Route(None, MAIN, "degraded: the degradation tier decides")
    small = ModelEndpoint.objects.filter(name=small_name, enabled=True).first()
    if small is None:
        return Route(None, MAIN, f"small model {small_name} is not available")
    try:
        holds = expression_compile(str(rule)).evaluate(_turn_scope(session, history))
    except ExpressionLimitError as exc:
        reason = f"expression_limit: agent '{agent.slug}', field 'routing.when': {exc.message}"
        return Route(None, MAIN, reason[:200])
    except (ExpressionError, EvaluationError) as exc:
        return Route(None, MAIN, f"routing rule not usable: {exc}"[:200])
    if holds is True:
        return Route(small, SMALL, f"when held: {rule}"[:200])
    return Route(None, MAIN, "when did not hold")


def escalation(agent: Agent, request: ChatRequest, response: ChatResponse | None) -> str:
    """Why the small model's answer goes to the agent's model instead ('' if it stands)."""
    # Absent: both reasons; an empty list is the author's "never escalate".
    listed = (agent.routing or {}).get("escalate_on")
    wanted = set(ESCALATIONS if listed is None else listed)
    if response is None:
        return "the small model did not answer"
    if "invalid_tool_call" in wanted:
        offered = {t.name for t in request.tools}
        for call in response.tool_calls:
            if call.arguments_error or call.name not in offered:
                return f"invalid_tool_call: {call.name}"
    answer = request.response_format
    if (
        "invalid_json" in wanted
        and answer is not None
        and not response.tool_calls
        and answer_check(response.text, answer).problem
    ):
        return "invalid_json"
    return ""

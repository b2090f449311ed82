"""Reads of evaluations: the recorded sessions an owner may evaluate, a recorded turn's
figures (the baseline, and a replay's alike), an evaluation's report."""

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet, Sum

from sessions.errors import InvalidInput, NotFound
from sessions.events import EventType
from sessions.models import Event, Message, ModelCall, Refusal, Session, ToolCall

from .models import Evaluation, EvaluationTurn
from .scoring import Side

MAX_SESSIONS = 200
MAX_TURNS = 1000
OUTCOMES = ("ok", "tool_failures", "stopped", "error")


@dataclass(frozen=True)
class SessionFilter:
    agent: str | None = None
    since: date | None = None
    until: date | None = None
    outcome: str | None = None
    search: str | None = None


def sessions_pick(
    *, owner_id: int | None, ids: list[str] | None = None, where: SessionFilter | None = None
) -> list[Session]:
    """The recorded conversations to replay: by id (another owner's is NotFound: an owner
    sees only its own; `owner_id` None is staff, any owner) or by filter. Replays,
    workflow runs and ephemeral sessions are never picked."""
    rows: QuerySet[Session] = Session.objects.filter(
        evaluation_id__isnull=True, workflow_version__isnull=True, ephemeral=False
    ).select_related("agent")
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
    if ids is not None:
        wanted: list[UUID] = []
        for raw in ids:
            try:
                wanted.append(UUID(str(raw)))
            except ValueError:
                raise NotFound(f"session {raw} not found", code="session_not_found") from None
        found = {s.pk: s for s in rows.filter(pk__in=wanted)}
        missing = [str(pk) for pk in wanted if pk not in found]
        if missing:
            raise NotFound(f"session {missing[0]} not found", code="session_not_found")
        return [found[pk] for pk in dict.fromkeys(wanted)]
    where = where or SessionFilter()
    if where.agent:
        rows = rows.filter(agent__slug=where.agent)
    if where.since:
        rows = rows.filter(created_at__date__gte=where.since)
    if where.until:
        rows = rows.filter(created_at__date__lte=where.until)
    if where.outcome:
        if where.outcome not in OUTCOMES:
            raise InvalidInput(
                f"outcome must be one of {', '.join(OUTCOMES)}", details={"field": "outcome"}
            )
        rows = rows.filter(last_turn_outcome=where.outcome)
    if where.search:
        rows = rows.filter(
            Q(pk__in=Message.objects.filter(content__icontains=where.search).values("session_id"))
        )
    return list(rows.order_by("-created_at")[: MAX_SESSIONS + 1])


def recorded_turns(session_id: UUID | str) -> list[int]:
    """The session's turns that began with a user's message, in order."""
    return sorted(
        set(
            Message.objects.filter(session_id=session_id, role="user", turn__gt=0).values_list(
                "turn", flat=True
            )
        )
    )


def turn_opening(session_id: UUID | str, turn: int) -> Message | None:
    return (
        Message.objects.filter(session_id=session_id, role="user", turn=turn).order_by("id").first()
    )


def turn_side(session_id: UUID | str, turn: int) -> Side:
    """A turn's calls, outcome, answer, tokens, cost and latency, as the record has them (the
    model's own arguments, before an approver's edit; a replay's calls not sent are listed
    too, and apart as would_have_called)."""
    calls = list(
        ToolCall.objects.filter(session_id=session_id, turn=turn).order_by("step", "position", "id")
    )
    steps = {s: i for i, s in enumerate(sorted({c.step for c in calls}))}
    answer = (
        Message.objects.filter(session_id=session_id, turn=turn, role="assistant")
        .exclude(content="")
        .order_by("-seq", "-id")
        .values_list("content", flat=True)
        .first()
    )
    finished = (
        Event.objects.filter(
            session_id=session_id, type=EventType.TURN_FINISHED.value, data__turn=turn
        )
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    figures = ModelCall.objects.filter(session_id=session_id, turn=turn).aggregate(
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
        cost=Sum("cost"),
        model_ms=Sum("total_ms"),
    )
    tool_ms = sum(c.elapsed_ms or 0 for c in calls)
    side: dict[str, Any] = {
        "calls": [
            {
                "tool": c.tool_name,
                "arguments": c.proposed_input if c.proposed_input is not None else c.input,
                "step": steps[c.step],
                "status": c.status,
            }
            for c in calls
        ],
        "outcome": (finished or {}).get("outcome", ""),
        "answer": answer or "",
        "input_tokens": figures["input_tokens"] or 0,
        "output_tokens": figures["output_tokens"] or 0,
        "cost": str(figures["cost"] or Decimal(0)),
        "latency_ms": (figures["model_ms"] or 0) + tool_ms,
    }
    not_sent = [c for c in calls if c.refusal == Refusal.NOT_SENT]
    if not_sent:
        side["would_have_called"] = [{"tool": c.tool_name, "arguments": c.input} for c in not_sent]
    return side  # type: ignore[return-value]


def evaluation_for_owner(*, evaluation_id: int | str, owner_id: int) -> Evaluation:
    try:
        pk = int(evaluation_id)
    except (TypeError, ValueError):
        pk = -1
    found = Evaluation.objects.filter(pk=pk, owner_id=owner_id).first()
    if found is None:
        raise NotFound(f"evaluation {evaluation_id} not found", code="evaluation_not_found")
    return found


def evaluation_turns(evaluation: Evaluation) -> list[EvaluationTurn]:
    """Its scored turns, those that differ first (the trajectory, then the outcome, then
    the least similar answer), then in the record's order."""
    rows = list(evaluation.turns.order_by("id"))
    return sorted(
        rows,
        key=lambda t: (t.trajectory_match, t.outcome_match, t.answer_similarity),
    )


def turn_report(row: EvaluationTurn) -> dict[str, Any]:
    def side(data: dict[str, Any], candidate: bool) -> dict[str, Any]:
        shown = {
            "calls": [
                {"tool": c["tool"], "arguments": c["arguments"]} for c in data.get("calls", [])
            ],
            "outcome": data.get("outcome", ""),
            "answer": data.get("answer", ""),
            "input_tokens": data.get("input_tokens", 0),
            "output_tokens": data.get("output_tokens", 0),
            "cost": data.get("cost", "0"),
            "latency_ms": data.get("latency_ms", 0),
        }
        if candidate:
            shown["would_have_called"] = data.get("would_have_called", [])
        return shown

    return {
        "session": str(row.session_id),
        "turn": row.turn,
        "replay": str(row.replay_id) if row.replay_id else None,
        "trajectory_match": row.trajectory_match,
        "outcome_match": row.outcome_match,
        "answer_exact": row.answer_exact,
        "answer_similarity": row.answer_similarity,
        "judge_score": row.judge_score,
        "baseline": side(row.baseline, False),
        "candidate": side(row.candidate, True),
    }


def evaluation_report(evaluation: Evaluation) -> dict[str, Any]:
    """The contract's view (DESIGN.md "Evaluations"): state, progress, totals, turns."""
    return {
        "id": evaluation.pk,
        "state": evaluation.state,
        "agent": evaluation.agent.slug if evaluation.agent else None,
        "candidate": evaluation.candidate,
        "allow_read_only_calls": evaluation.allow_read_only_calls,
        "progress": {"done": evaluation.done, "total": evaluation.total},
        "totals": evaluation.totals,
        "spent": str(evaluation.spent),
        "budget": None if evaluation.budget_cost is None else str(evaluation.budget_cost),
        "error": evaluation.error,
        "created_at": evaluation.created_at.isoformat(),
        "finished_at": evaluation.finished_at.isoformat() if evaluation.finished_at else None,
        "turns": [turn_report(t) for t in evaluation_turns(evaluation)],
    }


def evaluations_of_owner(*, owner_id: int, limit: int = 50) -> list[Evaluation]:
    return list(
        Evaluation.objects.filter(owner_id=owner_id).select_related("agent").order_by("-id")[:limit]
    )


def latest_candidate_evaluation(agent_id: int, candidate: dict[str, Any]) -> Evaluation | None:
    """The newest finished evaluation of this agent's sessions on `candidate`."""
    return (
        Evaluation.objects.filter(agent_id=agent_id, candidate=candidate, state="finished")
        .order_by("-finished_at", "-id")
        .first()
    )

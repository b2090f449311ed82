"""Reads of evaluations: the recorded sessions an owner may evaluate, a recorded turn's
figures (the baseline, and a replay's alike), an evaluation's report."""

import json
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q, QuerySet

from record.errors import InvalidInput, NotFound
from record.events import EventType
from record.models import Event, Message, ModelCall, Refusal, Session, ToolCall
from record.rows import json_value

from .models import Evaluation, EvaluationTurn
from .scoring import Side

MAX_SESSIONS = 200
MAX_TURNS = 1000
OUTCOMES = ("ok", "tool_failures", "stopped", "error")
# The candidate that replays workflow runs: {"workflow_version": "<slug>@<number>"}.
WORKFLOW_VERSION = "workflow_version"
# A workflow run's outcome as the filter names it, and the run states it means.
RUN_OUTCOMES = {"finished": ("finished",), "failed": ("error",), "cancelled": ("cancelled",)}


@dataclass(frozen=True)
class SessionFilter:
    agent: str | None = None
    since: date | None = None
    until: date | None = None
    outcome: str | None = None
    search: str | None = None


def sessions_pick(
    *,
    owner_id: int | None,
    ids: list[str] | None = None,
    where: SessionFilter | None = None,
    same_as: int | None = None,
    workflow: str | None = None,
) -> list[Session]:
    """The recorded conversations to replay: by id (another owner's is NotFound: an owner
    sees only its own; `owner_id` None is staff, any owner), by filter, or the saved set of
    an earlier evaluation (`same_as`, the owner's). Replays, workflow runs and ephemeral
    sessions are never picked. `workflow`: its recorded runs that ended instead of
    conversations (a workflow version's evaluation; `where.outcome` is then finished,
    failed or cancelled)."""

    if same_as is not None:
        earlier = Evaluation.objects.filter(pk=same_as)
        if owner_id is not None:
            earlier = earlier.filter(owner_id=owner_id)
        if not earlier.exists():
            raise NotFound(f"evaluation {same_as} not found", code="evaluation_not_found")
        ids = [
            str(pk)
            for pk in Evaluation.sessions.through.objects.filter(evaluation_id=same_as).values_list(
                "session_id", flat=True
            )
        ]
    rows: QuerySet[Session] = Session.objects.filter(
        evaluation_id__isnull=True, ephemeral=False
    ).select_related("agent")
    if workflow is None:
        rows = rows.filter(workflow_version__isnull=True)
    else:
        rows = _runs_filter(rows, workflow, where.outcome if where else None)
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
    if where.outcome and workflow is None:
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


def _runs_filter(rows: QuerySet[Session], workflow: str, outcome: str | None) -> QuerySet[Session]:
    """Recorded runs of `workflow` (instead of conversations) that have ended, by their
    outcome: a run still going has no whole record to replay."""
    ended = [state for states in RUN_OUTCOMES.values() for state in states]
    rows = rows.filter(workflow_version__workflow__slug=workflow, state__in=ended)
    if outcome:
        if outcome not in RUN_OUTCOMES:
            raise InvalidInput(
                f"a run's outcome is one of {', '.join(RUN_OUTCOMES)}",
                details={"field": "outcome"},
            )
        rows = rows.filter(state__in=RUN_OUTCOMES[outcome])
    return rows


def workflow_version_parse(value: Any) -> tuple[str, int] | None:
    """`"<slug>@<number>"` as (slug, number); None when it is not that."""
    if not isinstance(value, str) or "@" not in value:
        return None
    slug, _, number = value.rpartition("@")
    if not slug or not number.isdigit() or int(number) < 1:
        return None
    return slug, int(number)


def candidate_workflow(candidate: Any) -> str | None:
    """The workflow whose runs a candidate replays (its slug), None for any other candidate:
    which recorded sessions to pick (runs of it, not conversations)."""
    if isinstance(candidate, dict) and len(candidate) == 1 and WORKFLOW_VERSION in candidate:
        parsed = workflow_version_parse(candidate[WORKFLOW_VERSION])
        return parsed[0] if parsed else None
    return None


def recorded_turns(session_id: UUID | str) -> list[int]:
    """The session's turns that began with a user's message, in order."""
    return sorted(
        set(
            Message.objects.filter(session_id=session_id, role="user", turn__gt=0).values_list(
                "turn", flat=True
            )
        )
    )


def recorded_turns_of(session_ids: list[UUID]) -> list[tuple[UUID, int]]:
    """(session, turn) of every turn a user's message began, in the order of `session_ids`,
    then by turn."""
    rank = {pk: i for i, pk in enumerate(session_ids)}
    return sorted(
        set(
            Message.objects.filter(session_id__in=session_ids, role="user", turn__gt=0).values_list(
                "session_id", "turn"
            )
        ),
        key=lambda pair: (rank[pair[0]], pair[1]),
    )


def turn_opening(session_id: UUID | str, turn: int) -> Message | None:
    return (
        Message.objects.filter(session_id=session_id, role="user", turn=turn).order_by("id").first()
    )


# One round trip for a turn's figures: its calls in order (each with its step's rank in the
# turn), its last non-empty answer, its turn.finished outcome, its model calls' sums.
_TURN_SQL = f"""
SELECT
  (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'tool', c.tool_name,
            'arguments', coalesce(c.proposed_input, c.input),
            'input', c.input,
            'step', c.rank,
            'status', c.status,
            'refusal', c.refusal,
            'elapsed_ms', coalesce(c.elapsed_ms, 0)) ORDER BY c.step, c.position, c.id), '[]')
     FROM (SELECT *, dense_rank() OVER (ORDER BY step) - 1 AS rank
             FROM "{ToolCall._meta.db_table}" WHERE session_id = %(s)s AND turn = %(t)s) c),
  (SELECT content FROM "{Message._meta.db_table}"
    WHERE session_id = %(s)s AND turn = %(t)s AND role = 'assistant' AND content <> ''
    ORDER BY seq DESC NULLS LAST, id DESC LIMIT 1),
  (SELECT data ->> 'outcome' FROM "{Event._meta.db_table}"
    WHERE session_id = %(s)s AND type = %(finished)s AND (data ->> 'turn')::int = %(t)s
    ORDER BY seq DESC LIMIT 1),
  m.input_tokens, m.output_tokens, m.cost, m.model_ms
FROM (SELECT coalesce(sum(input_tokens), 0) AS input_tokens,
             coalesce(sum(output_tokens), 0) AS output_tokens,
             coalesce(sum(cost), 0) AS cost, coalesce(sum(total_ms), 0) AS model_ms
        FROM "{ModelCall._meta.db_table}" WHERE session_id = %(s)s AND turn = %(t)s) m
"""  # nosec B608 - table names from the models, values bound


def turn_side(session_id: UUID | str, turn: int) -> Side:
    """A turn's calls, outcome, answer, tokens, cost and latency (model time plus tool time),
    as the record has them: the model's own arguments, before an approver's edit; a
    replay's calls not sent are listed too, and apart as would_have_called."""
    with connection.cursor() as cursor:
        cursor.execute(
            _TURN_SQL,
            {"s": str(session_id), "t": turn, "finished": EventType.TURN_FINISHED.value},
        )
        row = cursor.fetchone()
    raw_calls, answer, outcome, input_tokens, output_tokens, cost, model_ms = row
    calls = json_value(raw_calls) or []
    side: dict[str, Any] = {
        "calls": [
            {
                "tool": c["tool"],
                "arguments": c["arguments"],
                "step": c["step"],
                "status": c["status"],
            }
            for c in calls
        ],
        "outcome": outcome or "",
        "answer": answer or "",
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "cost": str(Decimal(cost)),
        "latency_ms": int(model_ms) + sum(int(c["elapsed_ms"]) for c in calls),
    }
    not_sent = [c for c in calls if c["refusal"] == Refusal.NOT_SENT]
    if not_sent:
        side["would_have_called"] = [{"tool": c["tool"], "arguments": c["input"]} for c in not_sent]
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


# A call of another agent (engine/model/context.py AGENT_TOOL_PREFIX; the engine is not
# imported here): a workflow's agent node, an agent's `agent.<slug>` tool.
AGENT_CALL_PREFIX = "agent."


def _call_key(call: dict[str, Any]) -> str:
    return json.dumps([call.get("tool"), call.get("arguments")], sort_keys=True, default=str)


def replay_calls_from_record(data: dict[str, Any]) -> list[bool]:
    """Per call of a replay's side: answered from the record without running anything.
    A replay never runs another agent's loop (engine/gates/replay.py): an agent call it
    made was answered by the recorded one, unless it was not sent ("would have called")."""
    not_sent = {_call_key(c) for c in data.get("would_have_called") or []}
    return [
        str(c.get("tool", "")).startswith(AGENT_CALL_PREFIX) and _call_key(c) not in not_sent
        for c in data.get("calls", [])
    ]


def turn_report(row: EvaluationTurn) -> dict[str, Any]:
    def side(data: dict[str, Any], candidate: bool) -> dict[str, Any]:
        calls = [{"tool": c["tool"], "arguments": c["arguments"]} for c in data.get("calls", [])]
        if candidate:
            for call, recorded in zip(calls, replay_calls_from_record(data), strict=True):
                if recorded:  # only on such calls: every other one is as before
                    call["from_record"] = True
        shown = {
            "calls": calls,
            "outcome": data.get("outcome", ""),
            "answer": data.get("answer", ""),
            "input_tokens": data.get("input_tokens", 0),
            "output_tokens": data.get("output_tokens", 0),
            "cost": data.get("cost", "0"),
            "latency_ms": data.get("latency_ms", 0),
        }
        if "path" in data:
            # A workflow run's: the nodes it visited in order, how it ended, its output.
            shown["path"] = data["path"]
            shown["output"] = data.get("output")
            if data.get("error"):
                shown["error"] = data["error"]
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


def evaluation_recorded_on(evaluation: Evaluation) -> list[str]:
    """The agent configuration versions its sessions' turns ran on ("support@5"), in
    order: what the baseline is, beside the candidate. A session records the version of
    its last turn (Session.agent_version); sessions older than versions name none."""
    rows = (
        evaluation.sessions.filter(agent_version__isnull=False)
        .values_list("agent_version__agent__slug", "agent_version__number")
        .distinct()
        .order_by("agent_version__agent__slug", "agent_version__number")
    )
    return [f"{slug}@{number}" for slug, number in rows]


def evaluation_report(evaluation: Evaluation) -> dict[str, Any]:
    """The contract's view (DESIGN.md "Evaluations"): state, progress, totals, turns."""
    return {
        "id": evaluation.pk,
        "state": evaluation.state,
        "agent": evaluation.agent.slug if evaluation.agent else None,
        "candidate": evaluation.candidate,
        "recorded_on": evaluation_recorded_on(evaluation),
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


def replays_unscored(evaluation_id: int) -> dict[tuple[str, int], Session]:
    """The replays of an evaluation no scored turn names yet, by (recorded session, turn):
    those a worker that died had opened (the earliest of each)."""
    scored = EvaluationTurn.objects.filter(
        evaluation_id=evaluation_id, replay_id__isnull=False
    ).values("replay_id")
    found: dict[tuple[str, int], Session] = {}
    for replay in (
        Session.objects.filter(evaluation_id=evaluation_id)
        .exclude(pk__in=scored)
        .order_by("-created_at")
    ):
        named = (replay.metadata or {}).get("replay") or {}
        if "session" in named and "turn" in named:
            found[(str(named["session"]), int(named["turn"]))] = replay
    return found

"""Evaluations of a workflow version: recorded workflow runs replayed on a candidate version.

The candidate is `{"workflow_version": "<workflow slug>@<number>"}`. Each recorded run of
that workflow (any of its versions) is started again on the candidate version with the
run's own input, on the same engine, in a run of its own marked as the evaluation's
(`Session.evaluation_id`, `metadata["replay"]` naming the recorded run): so its calls are
answered from the record as a conversation's replay's are (engine/gates/replay.py) — a
tool node's or an agent node's call with the same tool and arguments gets the recorded
result, a human node gets the approver's recorded decision (matched by node), a
side-effecting call the record lacks is never sent ("would have called"), a read-only one
runs only if the evaluation allows it, a wait is over at once. Its llm and choice nodes
call the candidate version's models for real, as the evaluations' own user on a disabled
copy of the workflow's runtime agent: never in a user's usage, credits or rankings; the
cost is the evaluation's.

A run is scored beside its record by its path (the nodes it visited, in order, and the
calls they made), its outcome (finished or failed), its output (equal, and similar by the
configured embedder), tokens, cost and latency.
"""

import json
import time
from typing import Any
from uuid import UUID

from django.db import transaction

from engine import turn_start
from memory.tokens import count_message_tokens
from record.errors import InvalidInput
from record.events import EventType
from record.models import Agent, Event, Message, ModelEndpoint, Session
from record.rows import json_value
from workflows.models import WorkflowVersion
from workflows.selectors import version_definition
from workflows.services import runtime_agent_values, version_endpoint
from workflows.state import RunState

from . import scoring, selectors
from .scoring import Side, TurnScore

KIND = selectors.WORKFLOW_VERSION
_OUTCOME_OF_STATE = {"finished": "finished", "error": "failed", "cancelled": "cancelled"}


def candidate_version(value: Any) -> WorkflowVersion:
    """The version `"<slug>@<number>"` names; InvalidInput naming the field otherwise."""
    parsed = selectors.workflow_version_parse(value)
    if parsed is None:
        raise InvalidInput(
            'workflow_version must be "<workflow slug>@<version number>", e.g. "refund@3"',
            details={"field": f"candidate.{KIND}"},
        )
    slug, number = parsed
    version = (
        WorkflowVersion.objects.filter(workflow__slug=slug, number=number)
        .select_related("workflow")
        .first()
    )
    if version is None:
        raise InvalidInput(
            f"workflow {slug} has no version {number}",
            details={"field": f"candidate.{KIND}"},
            code="unknown_workflow_version",
        )
    return version


def runs_check(sessions: list[Session], version: WorkflowVersion) -> None:
    """Every session must be a recorded run of the candidate's workflow (any version)."""
    versions = set(
        WorkflowVersion.objects.filter(workflow_id=version.workflow_id).values_list("pk", flat=True)
    )
    wrong = [s for s in sessions if s.workflow_version_id not in versions]
    if wrong:
        raise InvalidInput(
            f"session {wrong[0].pk} is not a run of workflow {version.workflow.slug}",
            details={"field": "sessions"},
            code="not_runs_of_workflow",
        )


def candidate_agent_apply(copy: Agent, candidate: dict[str, Any]) -> None:
    """Set the candidate agent (a disabled copy of the workflow's runtime agent) to what the
    candidate version asks: its model endpoint, its nodes' tools, its rules."""
    version = candidate_version(candidate[KIND])
    definition = version_definition(version.pk)
    default = ModelEndpoint.objects.filter(pk=copy.model_id).values_list("name", flat=True).first()
    for name, value in runtime_agent_values(
        definition, version_endpoint(definition, default)
    ).items():
        setattr(copy, name, value)


def run_replay_open(
    *, evaluation_id: int, candidate: dict[str, Any], read_only_calls: bool,
    agent: Agent, source: Session, turn: int, owner_id: int,
) -> Session:  # fmt: skip
    """The replay's run: the candidate version started with the recorded run's input (not
    checked against the version's input schema: a version that cannot take it fails its
    run, which the score shows). Run by the caller; no worker is woken."""
    version = candidate_version(candidate[KIND])
    definition = version_definition(version.pk)
    opening = selectors.turn_opening(source.pk, turn)
    assert opening is not None  # the turn was picked by its user message
    data = json_value(opening.data) or {}
    value = data.get("input") if isinstance(data, dict) and "input" in data else None
    if value is None:
        try:
            value = json.loads(opening.content)
        except ValueError:
            value = {}
    with transaction.atomic():
        replay = Session.objects.create(
            agent=agent,
            owner_id=owner_id,
            role=source.role,
            value=source.value,
            evaluation_id=evaluation_id,
            turn=turn - 1,
            workflow_version=version,
            # The version's own deadline from now, as a run it starts has.
            workflow_state=RunState.start(
                definition.start, value, deadline_at=_deadline(definition)
            ).to_json(),
            metadata={
                "replay": {"session": str(source.pk), "turn": turn, "read_only_calls": read_only_calls}
            },
        )  # fmt: skip
        message = Message(
            session=replay,
            role="user",
            content=opening.content,
            data={"input": value},
            token_count=count_message_tokens(opening.content),
        )
        turn_start(session=replay, lease_owner=None, message=message)
    return replay


def _deadline(definition: Any) -> float | None:
    return time.time() + float(definition.deadline_s) if definition.deadline_s else None


def _path(session_id: UUID | str) -> list[str]:
    """The nodes the run visited, in the order it started them."""
    return [
        str((data or {}).get("node", ""))
        for data in Event.objects.filter(type=EventType.NODE_STARTED.value, session_id=session_id)
        .order_by("seq")
        .values_list("data", flat=True)
    ]


def run_side(session_id: UUID | str, turn: int) -> Side:
    """A run's figures for the score: the turn's calls, tokens, cost and latency as a
    conversation's turn has them (selectors.turn_side), with its path, its outcome
    (finished, failed, cancelled, or the state it stopped in) and its output; `answer` is
    the output as canonical JSON text, which the report and the similarity read."""
    side: dict[str, Any] = dict(selectors.turn_side(session_id, turn))
    row = Session.objects.filter(pk=session_id).values("state", "workflow_state").first()
    assert row is not None
    state = row["workflow_state"] or {}
    output = state.get("result")
    side["path"] = _path(session_id)
    side["outcome"] = _OUTCOME_OF_STATE.get(row["state"], row["state"])
    side["output"] = output
    side["answer"] = "" if output is None else _canonical(output)
    if isinstance(state.get("error"), dict):
        side["error"] = str(state["error"].get("message", ""))[:500]
    return side  # type: ignore[return-value]


def _canonical(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _calls(side: Side) -> list[str]:
    # A run's node calls in the order of its path; their steps differ between a run and its
    # replay (a replay runs no call inside the node step), so the steps are not compared.
    return [_canonical([c["tool"], c.get("arguments")]) for c in side["calls"]]


def run_score(baseline: Side, candidate: Side, embed: Any) -> TurnScore:
    """The path matches when the same nodes ran in the same order and made the same calls;
    the outcome when both finished (or both failed); the answer is the output."""
    score = scoring.turn_score(baseline, candidate, embed)
    score["trajectory_match"] = baseline.get("path") == candidate.get("path") and sorted(
        _calls(baseline)
    ) == sorted(_calls(candidate))
    return score

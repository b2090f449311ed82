"""Writes of evaluations: create one (its sessions, its candidate), run it (each recorded
turn replayed on the candidate, scored beside the record), cancel it, and the rollout
gate's audited override.

A replay runs on the same engine as the recorded turn, in a session of its own: the
history before that turn copied from the record, the turn's user message posted again,
`evaluation_id` set and `metadata["replay"]` naming what it replays, so its tool calls
are answered from the record and a side effect is never sent (engine/gates/replay.py).
It belongs to the evaluations' own user, so it never counts in a user's usage, credits
or rankings; its cost is the evaluation's (`spent`, within `budget_cost`).
"""

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Now
from django.utils import timezone

from audit.models import AuditAction
from audit.services import audit_record
from memory.embeddings import embed_texts
from record.errors import Conflict, InvalidInput
from record.models import Agent, Message, ModelEndpoint, Session
from record.rows import json_value
from record.states import STARTS_TURN, State
from runtime.tasks import task_send
from sessions.services import message_post, session_run_pending

from . import candidates, lease, scoring, selectors, workflow_replay
from .models import Evaluation, EvaluationTransition, EvaluationTurn
from .states import EvaluationState, move_allowed

logger = logging.getLogger(__name__)

RUN_TASK = "evaluations.tasks.evaluation_run"
# The user every replay belongs to: its usage is nobody's.
EVALUATIONS_USER = "evaluations"
CANDIDATE_KINDS = ("model", "system_prompt", "agent_version", "workflow_version")
MAX_PROMPT_CHARS = 100_000
# How often a replay whose turn a worker took is looked at again.
_POLL_S = 0.1


class IllegalMove(Conflict):
    code = "illegal_transition"


def _candidate_check(candidate: Any) -> dict[str, Any]:
    if not isinstance(candidate, dict) or len(candidate) != 1:
        raise InvalidInput(
            "candidate must be an object with one of: " + ", ".join(CANDIDATE_KINDS),
            details={"field": "candidate"},
        )
    kind, value = next(iter(candidate.items()))
    if kind == "model":
        if not isinstance(value, str) or not ModelEndpoint.objects.filter(name=value).exists():
            raise InvalidInput(
                f"unknown model endpoint {value!r}",
                details={"field": "candidate.model"},
                code="unknown_model",
            )
    elif kind == "system_prompt":
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_PROMPT_CHARS:
            raise InvalidInput(
                f"system_prompt must be a non-empty string of at most {MAX_PROMPT_CHARS} characters",
                details={"field": "candidate.system_prompt"},
            )
    elif kind == workflow_replay.KIND:
        workflow_replay.candidate_version(value)
    elif kind == "agent_version":
        candidates.agent_version_find(value)  # whose agent it is: evaluation_check
    else:
        raise InvalidInput(
            f"unknown candidate {kind!r}; one of: " + ", ".join(CANDIDATE_KINDS),
            details={"field": "candidate"},
        )
    return {kind: value}


def _judge_check(judge: Any) -> dict[str, Any] | None:
    if judge is None:
        return None
    if (
        not isinstance(judge, dict)
        or not isinstance(judge.get("model"), str)
        or not isinstance(judge.get("rubric"), str)
        or not judge["rubric"].strip()
        or set(judge) - {"model", "rubric"}
    ):
        raise InvalidInput(
            'judge must be {"model": name, "rubric": str}', details={"field": "judge"}
        )
    if not ModelEndpoint.objects.filter(name=judge["model"], enabled=True).exists():
        raise InvalidInput(
            f"unknown model endpoint {judge['model']!r}",
            details={"field": "judge.model"},
            code="unknown_model",
        )
    return {"model": judge["model"], "rubric": judge["rubric"]}


@dataclass(frozen=True)
class Checked:
    candidate: dict[str, Any]
    judge: dict[str, Any] | None
    total: int


def evaluation_check(
    *,
    sessions: list[Session],
    candidate: Any,
    judge: Any = None,
    budget_cost: Decimal | None = None,
) -> Checked:
    """What `evaluation_create` refuses (InvalidInput, naming the field), before anything is
    written: the admin's form asks it too."""
    spec = _candidate_check(candidate)
    judged = _judge_check(judge)
    if not sessions:
        raise InvalidInput(
            "no recorded session matches", details={"field": "sessions"}, code="no_sessions"
        )
    if len(sessions) > selectors.MAX_SESSIONS:
        raise InvalidInput(
            f"at most {selectors.MAX_SESSIONS} sessions per evaluation",
            details={"field": "sessions", "limit": selectors.MAX_SESSIONS},
        )
    if workflow_replay.KIND in spec:
        workflow_replay.runs_check(
            sessions, workflow_replay.candidate_version(spec[workflow_replay.KIND])
        )
    if len({s.agent_id for s in sessions}) != 1:
        raise InvalidInput(
            "the sessions must all be of one agent",
            details={"field": "sessions"},
            code="mixed_agents",
        )
    if "agent_version" in spec:
        candidates.agent_version_of_agent(spec["agent_version"], sessions[0].agent)
    total = sum(len(selectors.recorded_turns(s.pk)) for s in sessions)
    if not total:
        raise InvalidInput(
            "the sessions have no recorded turn", details={"field": "sessions"}, code="no_sessions"
        )
    if total > selectors.MAX_TURNS:
        raise InvalidInput(
            f"at most {selectors.MAX_TURNS} turns per evaluation",
            details={"field": "sessions", "limit": selectors.MAX_TURNS},
        )
    if budget_cost is not None and budget_cost <= 0:
        raise InvalidInput("budget must be positive", details={"field": "budget"})
    return Checked(candidate=spec, judge=judged, total=total)


def evaluation_create(
    *,
    owner: User,
    actor: str,
    sessions: list[Session],
    candidate: Any,
    allow_read_only_calls: bool = False,
    judge: Any = None,
    budget_cost: Decimal | None = None,
) -> Evaluation:
    """A queued evaluation of `sessions` (picked by `selectors.sessions_pick`, so the
    caller's own) on `candidate`, run by a worker once this commits.

    The sessions share one agent; the candidate is applied to a disabled copy of it
    (`candidate_agent`: nobody can open a session on it) that the replays run on.
    """
    checked = evaluation_check(
        sessions=sessions, candidate=candidate, judge=judge, budget_cost=budget_cost
    )
    spec, judged, total = checked.candidate, checked.judge, checked.total
    agent = sessions[0].agent
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            owner=owner,
            actor=actor[:150],
            agent=agent,
            candidate=spec,
            allow_read_only_calls=allow_read_only_calls,
            judge=judged,
            budget_cost=budget_cost,
            total=total,
        )
        evaluation.sessions.set(sessions)
        evaluation.candidate_agent = _candidate_agent(agent, spec, evaluation.pk)
        evaluation.save(update_fields=["candidate_agent"])
        # A person replays recorded conversations (another owner's, for a superuser) and
        # spends on model calls: on the record, naming the sessions but not what they say.
        audit_record(
            action=AuditAction.EVALUATION_CREATE,
            actor=actor,
            owner_id=owner.pk,
            object_type=Evaluation._meta.label_lower,
            object_id=evaluation.pk,
            object_repr=str(evaluation),
            after={
                "agent": agent.slug,
                "candidate": spec,
                "judge": judged,
                "budget_cost": budget_cost,
                "allow_read_only_calls": allow_read_only_calls,
                "turns": total,
            },
            data={"sessions": [str(s.pk) for s in sessions]},
        )
        transaction.on_commit(lambda: task_send(RUN_TASK, (evaluation.pk,)))
    return evaluation


def _candidate_agent(agent: Agent, spec: dict[str, Any], evaluation_id: int) -> Agent:
    """A disabled copy of `agent` with the candidate applied: the replays' agent."""
    copy = Agent.objects.get(pk=agent.pk)
    copy.pk = None
    copy.slug = f"eval-{evaluation_id}-{agent.slug}"[:100]
    copy.name = f"Evaluation {evaluation_id}: candidate of {agent.slug}"[:200]
    copy.enabled = False
    copy.candidate_model = None
    copy.candidate_percent = 0
    copy.rollout_gate = {}
    if "model" in spec:
        copy.model = ModelEndpoint.objects.get(name=spec["model"])
    if "system_prompt" in spec:
        copy.system_prompt = spec["system_prompt"]
    if workflow_replay.KIND in spec:
        workflow_replay.candidate_agent_apply(copy, spec)
    if "agent_version" in spec:
        candidates.agent_version_apply(copy, spec["agent_version"])
    copy.save()
    return copy


def _move(
    evaluation: Evaluation,
    to: EvaluationState,
    *,
    actor: str = "system",
    reason: str = "",
    **fields: Any,
) -> bool:
    """One move, if the table allows it from the state this row had (a conditional
    UPDATE on its version, with its Transition row); False when another writer won."""
    if not move_allowed(evaluation.state, to):
        return False
    with transaction.atomic():
        moved = Evaluation.objects.filter(pk=evaluation.pk, version=evaluation.version).update(
            state=to.value, version=F("version") + 1, **fields
        )
        if not moved:
            return False
        EvaluationTransition.objects.create(
            evaluation=evaluation,
            from_state=evaluation.state,
            to_state=to.value,
            reason=reason,
            actor=actor,
            version=evaluation.version + 1,
        )
    evaluation.refresh_from_db()
    return True


def evaluation_cancel(*, evaluation: Evaluation, actor: str) -> Evaluation:
    """Stop it: a running evaluation stops before its next turn."""
    evaluation.refresh_from_db()
    with transaction.atomic():  # the move and its audit entry together
        if not _move(
            evaluation,
            EvaluationState.CANCELLED,
            actor=actor,
            reason="cancelled",
            finished_at=timezone.now(),
        ):
            raise IllegalMove(f"evaluation {evaluation.pk} has already ended ({evaluation.state})")
        audit_record(
            action=AuditAction.EVALUATION_CANCEL,
            actor=actor,
            owner_id=evaluation.owner_id,
            object_type=Evaluation._meta.label_lower,
            object_id=evaluation.pk,
            object_repr=str(evaluation),
            after={"state": evaluation.state},
        )
    return evaluation


# Scored turns are written this many at a time (with the progress and the spend, and the
# cancel read back): a worker that dies replays at most these again.
FLUSH_TURNS = 10


def evaluation_run(*, evaluation_id: int) -> str:
    """The worker's job: replay every recorded turn not scored yet, then the totals.

    Resumable: a worker that died mid-way leaves the turns written so far (every
    FLUSH_TURNS) and its lease lapses; the sweeper sends the task again and the next
    worker takes the rest, reusing the replays the dead one opened (no model call made
    twice for a turn whose replay ended). Only the lease's holder runs it and writes
    (evaluations/lease.py). A cancel stops it at the next write; a spent budget (its
    figure kept here, turn by turn) before the next turn, and it fails, saying so.
    """
    evaluation = Evaluation.objects.select_related("candidate_agent").get(pk=evaluation_id)
    holder = lease.lease_owner_new()
    if not lease.lease_take(evaluation_id=evaluation.pk, owner=holder):
        return evaluation.state  # ended, or another worker runs it
    evaluation.refresh_from_db()
    with lease.lease_kept(evaluation_id=evaluation.pk, owner=holder):
        try:
            return _evaluation_run_leased(evaluation, holder)
        except lease.LeaseLost:
            logger.warning("evaluation lease lost, stopping: evaluation=%s", evaluation_id)
            return str(Evaluation.objects.values_list("state", flat=True).get(pk=evaluation.pk))


def _evaluation_run_leased(evaluation: Evaluation, holder: str) -> str:
    evaluation_id = evaluation.pk
    if evaluation.state == EvaluationState.QUEUED:
        _move(evaluation, EvaluationState.RUNNING, reason="started")
    if evaluation.state != EvaluationState.RUNNING:
        return evaluation.state
    replays_owner = _replays_user().pk
    opened = selectors.replays_unscored(evaluation.pk)
    sessions = {
        s.pk: s for s in evaluation.sessions.select_related("agent").order_by("created_at", "id")
    }
    done = set(evaluation.turns.values_list("session_id", "turn"))
    pending: list[EvaluationTurn] = []
    spent = evaluation.spent
    try:
        for session_id, turn in selectors.recorded_turns_of(list(sessions)):
            if (session_id, turn) in done:
                continue
            if evaluation.budget_cost is not None and spent >= evaluation.budget_cost:
                _turns_write(evaluation, pending, holder)
                evaluation.refresh_from_db()
                _move(
                    evaluation,
                    EvaluationState.FAILED,
                    reason="budget",
                    error=f"its budget of {evaluation.budget_cost} was spent after "
                    f"{evaluation.done} of {evaluation.total} turns",
                    finished_at=timezone.now(),
                )
                return evaluation.state
            row = _turn_evaluate(
                evaluation,
                sessions[session_id],
                turn,
                replays_owner,
                opened.get((str(session_id), turn)),
            )
            pending.append(row)
            spent += Decimal(row.candidate["cost"])
            if len(pending) >= FLUSH_TURNS:
                state = _turns_write(evaluation, pending, holder)
                if state != EvaluationState.RUNNING:
                    return state
        state = _turns_write(evaluation, pending, holder)
        if state != EvaluationState.RUNNING:
            return state
    except lease.LeaseLost:
        raise
    except Exception as exc:
        logger.exception("evaluation failed: evaluation=%s", evaluation_id)
        evaluation.refresh_from_db()
        _move(
            evaluation,
            EvaluationState.FAILED,
            reason="error",
            error=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        return evaluation.state
    evaluation.refresh_from_db()
    rows = [selectors.turn_report(t) for t in evaluation.turns.all()]
    _move(
        evaluation,
        EvaluationState.FINISHED,
        reason="every turn replayed",
        totals=scoring.totals(rows),
        finished_at=timezone.now(),
    )
    return evaluation.state


def _turns_write(evaluation: Evaluation, pending: list[EvaluationTurn], holder: str) -> str:
    """Write the scored turns with the progress and the spend, renewing the lease; the
    evaluation's state (a cancel made meanwhile stops the run). Fenced by the lease: a
    worker that lost it (taken over after it was thought dead) writes nothing and stops
    (LeaseLost), so no turn is scored and no cost charged twice."""
    cost = sum((Decimal(t.candidate["cost"]) for t in pending), Decimal(0))
    with transaction.atomic():
        held = Evaluation.objects.filter(pk=evaluation.pk, lease_owner=holder).update(
            done=F("done") + len(pending), spent=F("spent") + cost, leased_until=lease.lease_until()
        )
        if not held:
            raise lease.LeaseLost(evaluation.pk)
        EvaluationTurn.objects.bulk_create(pending)
        state = Evaluation.objects.values_list("state", flat=True).get(pk=evaluation.pk)
    pending.clear()
    return str(state)


def _replays_user() -> User:
    user, created = get_user_model().objects.get_or_create(
        username=EVALUATIONS_USER, defaults={"is_active": False}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def _turn_evaluate(
    evaluation: Evaluation,
    source: Session,
    turn: int,
    owner_id: int,
    opened: Session | None = None,
) -> EvaluationTurn:
    """Replay one recorded turn and score it (not written yet). `opened`: its replay as a
    worker that died opened it (its turn finished, or run on from where it stopped); a
    workflow run's replay is workflow_replay.py's."""
    if opened is not None:
        replay = opened
    elif workflow_replay.KIND in evaluation.candidate:
        assert evaluation.candidate_agent is not None
        replay = workflow_replay.run_replay_open(
            evaluation_id=evaluation.pk,
            candidate=evaluation.candidate,
            read_only_calls=evaluation.allow_read_only_calls,
            agent=evaluation.candidate_agent,
            source=source,
            turn=turn,
            owner_id=owner_id,
        )
    else:
        replay = _replay_open(evaluation, source, turn, owner_id)
    _replay_wait(replay, turn, timeout_s=float(source.agent.turn_timeout_s or 0) or 600.0)
    if workflow_replay.KIND in evaluation.candidate:
        baseline = workflow_replay.run_side(source.pk, turn)
        candidate = workflow_replay.run_side(replay.pk, turn)
        score = workflow_replay.run_score(baseline, candidate, embed_texts)
    else:
        baseline = selectors.turn_side(source.pk, turn)
        candidate = selectors.turn_side(replay.pk, turn)
        score = scoring.turn_score(baseline, candidate, embed_texts)
    judge_score = None
    if evaluation.judge:
        from .judge import judge_turn  # noqa: PLC0415 - only evaluations with a judge need it

        judge_score = judge_turn(
            evaluation.judge,
            opening=_opening_text(source.pk, turn),
            baseline=baseline,
            candidate=candidate,
        )
    return EvaluationTurn(
        evaluation=evaluation,
        session=source,
        turn=turn,
        replay=replay,
        baseline=baseline,
        candidate=candidate,
        judge_score=judge_score,
        **score,
    )


def _opening_text(session_id: Any, turn: int) -> str:
    opening = selectors.turn_opening(session_id, turn)
    return opening.content if opening else ""


# The record's history before the turn, copied into the replay in one statement (no rows
# through Python), renumbered from 1; the replay's message_seq set in the same statement.
_HISTORY_COPY_SQL = f"""
WITH copied AS (
  INSERT INTO "{Message._meta.db_table}" (session_id, seq, turn, role, status, content,
      tool_calls, tool_call_id, name, data, token_count, token_counter, archived_at, created_at)
  SELECT %(replay)s, row_number() OVER (ORDER BY seq), turn, role, status, content,
      tool_calls, tool_call_id, name, data, token_count, token_counter, archived_at, now()
    FROM "{Message._meta.db_table}"
   WHERE session_id = %(source)s AND turn < %(turn)s AND seq IS NOT NULL
  RETURNING 1)
UPDATE "{Session._meta.db_table}" SET message_seq = (SELECT count(*) FROM copied)
 WHERE id = %(replay)s
RETURNING message_seq
"""
# The turn's opening: the user's message that began it, posted again in the replay.
_OPENING_SQL = f"""
SELECT content, extra_context, turn_options FROM "{Message._meta.db_table}"
 WHERE session_id = %(source)s AND role = 'user' AND turn = %(turn)s ORDER BY id LIMIT 1
"""  # nosec B608 - table names from the models, values bound


def _replay_open(evaluation: Evaluation, source: Session, turn: int, owner_id: int) -> Session:
    """The replay's session: the record's history before `turn`, then its user message
    posted again (which starts the turn)."""
    assert evaluation.candidate_agent is not None
    with transaction.atomic():
        replay = Session.objects.create(
            agent=evaluation.candidate_agent,
            owner_id=owner_id,
            role=source.role,
            value=source.value,
            evaluation_id=evaluation.pk,
            turn=turn - 1,
            metadata={
                "replay": {
                    "session": str(source.pk),
                    "turn": turn,
                    "read_only_calls": evaluation.allow_read_only_calls,
                }
            },
        )
        with connection.cursor() as cursor:
            names: dict[str, Any] = {"replay": replay.pk, "source": source.pk, "turn": turn}
            cursor.execute(_OPENING_SQL + ";" + _HISTORY_COPY_SQL, names)
            content, extra_context, turn_options = cursor.fetchone()
            cursor.nextset()
            (replay.message_seq,) = cursor.fetchone()
        # In the same commit: a replay a resumed run finds always has its turn to run.
        message_post(
            session=replay,
            content=content,
            extra_context=json_value(extra_context),
            turn_options=json_value(turn_options),
        )
    return replay


def _replay_wait(replay: Session, turn: int, *, timeout_s: float) -> None:
    """Run the replay's turn here (or let the worker that took it finish it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ran = session_run_pending(session_id=replay.pk)
        if ran.stopped == "idle":
            return  # nothing left to run: the turn has ended
        row = Session.objects.filter(pk=replay.pk).values("state", "last_turn_number").first()
        assert row is not None
        if row["last_turn_number"] == turn and State(row["state"]) in STARTS_TURN:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replay of turn {turn} did not end within {timeout_s:.0f} s")
        time.sleep(_POLL_S)


def rollout_override_audit(
    *, agent: Agent, actor: str, before: int, after: int, reason: str, evaluation_id: int | None
) -> None:
    """A superuser raised candidate_percent past the rollout gate: recorded, with why."""
    audit_record(
        action=AuditAction.ROLLOUT_OVERRIDE,
        actor=actor,
        object_type="agent_sessions.agent",
        object_id=agent.pk,
        object_repr=agent.slug,
        before={"candidate_percent": before},
        after={"candidate_percent": after},
        reason=reason,
        data={"evaluation": evaluation_id, "gate": agent.rollout_gate},
    )


def evaluations_sweep() -> list[int]:
    """The sweeper's part (beat): an unfinished evaluation nobody runs is sent again. A
    running one whose lease lapsed (its worker died) is handed back and marked resumed
    (a transition running → running saying so); a queued one whose task was lost too.
    Each is given a pickup grace (one lease) before it counts as lapsed again, so a sweep
    does not send the same one every tick."""
    resumed: list[int] = []
    with transaction.atomic():
        lapsed = list(
            Evaluation.objects.select_for_update(skip_locked=True)
            .filter(state__in=lease.RUNS)
            .filter(
                Q(leased_until__lt=Now())
                | Q(leased_until__isnull=True, created_at__lt=Now() - _pickup_grace())
            )
            .only("pk", "state", "version", "lease_owner")[:SWEEP_BATCH]
        )
        for evaluation in lapsed:
            running = evaluation.state == EvaluationState.RUNNING
            Evaluation.objects.filter(pk=evaluation.pk).update(
                lease_owner="",
                leased_until=lease.lease_until(),
                resumes=F("resumes") + int(running),
            )
            if running:
                EvaluationTransition.objects.create(
                    evaluation=evaluation,
                    from_state=evaluation.state,
                    to_state=evaluation.state,
                    reason=f"resumed: the lease of {evaluation.lease_owner or 'its worker'} lapsed",
                    actor="sweeper",
                    version=evaluation.version,
                )
            resumed.append(evaluation.pk)
            transaction.on_commit(partial(task_send, RUN_TASK, (evaluation.pk,)))
    if resumed:
        logger.info("evaluations sent again: %s", resumed)
    return resumed


# At most this many evaluations sent again per sweep.
SWEEP_BATCH = 100


def _pickup_grace() -> Any:
    return Value(timedelta(seconds=settings.EVALUATION_LEASE_S))

"""The step commit on the database: one version bump, one Transition, one event per legal move; nothing for an illegal one."""

import itertools
import json
import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import UsageDaily
from engine.moves.turn import metered_commit
from engine.store import commit as commit_module
from engine.store.commit import Committed, StaleSession, Step, step_commit
from record import publisher
from record.events import EventSpec, EventType, StopReason
from record.models import Checkpoint, Event, Message, ModelCall, Session, Transition
from record.states import TRANSITIONS, IllegalTransition, State, Trigger

ALLOWED = sorted(TRANSITIONS.items())


def _move(session: Session, trigger: Trigger, reason: str = "", actor: str = "") -> Committed:
    """The plain case of a step: a move of the state table and nothing else."""
    return step_commit(Step(session=session, trigger=trigger, reason=reason, actor=actor))


ILLEGAL = [pair for pair in itertools.product(State, Trigger) if pair not in TRANSITIONS]


def _snapshot(session: Session) -> tuple:
    row = Session.objects.get(pk=session.pk)
    return (
        row.state,
        row.version,
        row.event_seq,
        row.message_seq,
        row.step,
        Transition.objects.filter(session=session).count(),
        Event.objects.filter(session=session).count(),
        Checkpoint.objects.filter(session=session).count(),
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("pair", "target"), ALLOWED, ids=[f"{s}-{t}" for (s, t), _ in ALLOWED])
def test_allowed_move_bumps_version_and_records_transition_and_event(make_session, pair, target):
    state, trigger = pair
    session = make_session(state=state.value, version=5, event_seq=2)

    committed = _move(session, trigger, reason="because", actor="tester")

    row = Session.objects.get(pk=session.pk)
    assert row.state == target.value
    assert row.version == 6 == committed.version
    assert committed.state is target
    # The caller's copy is in step with the row.
    assert (session.state, session.version) == (target.value, 6)

    transitions = list(Transition.objects.filter(session=session))
    assert len(transitions) == 1
    move = transitions[0]
    assert (move.from_state, move.to_state, move.trigger) == (
        state.value,
        target.value,
        trigger.value,
    )
    assert (move.reason, move.actor, move.version) == ("because", "tester", 6)

    events = list(Event.objects.filter(session=session))
    assert len(events) == 1
    assert events[0].type == "state.changed"
    assert events[0].seq == 3 == row.event_seq
    assert events[0].data == {
        "from": state.value,
        "to": target.value,
        "trigger": trigger.value,
        "reason": "because",
    }
    # A plain move writes no messages and no checkpoint.
    assert row.message_seq == 0 and row.step == 0
    assert not Message.objects.filter(session=session).exists()
    assert not Checkpoint.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_every_illegal_move_changes_nothing(make_session, make_agent):
    agent = make_agent()
    for state in State:
        session = make_session(agent=agent, state=state.value, version=3)
        before = _snapshot(session)
        for trigger in Trigger:
            if (state, trigger) in TRANSITIONS:
                continue
            with pytest.raises(IllegalTransition):
                _move(session, trigger)
            assert session.state == state.value and session.version == 3
        assert _snapshot(session) == before
    assert not Transition.objects.exists()
    assert not Event.objects.exists()
    assert len(ILLEGAL) == len(State) * len(Trigger) - len(TRANSITIONS)


@pytest.mark.django_db
def test_a_stale_version_is_refused_and_changes_nothing(make_session):
    session = make_session(state=State.IDLE.value)
    stale = Session.objects.get(pk=session.pk)
    _move(session, Trigger.USER_MESSAGE)
    before = _snapshot(session)

    with pytest.raises(StaleSession):
        _move(stale, Trigger.USER_MESSAGE)

    assert _snapshot(session) == before
    assert stale.version == 0 and stale.state == State.IDLE.value


@pytest.mark.django_db
def test_a_stale_lease_owner_is_refused(make_session):
    session = make_session(state=State.PROCESSING.value, lease_owner="worker-a")
    before = _snapshot(session)

    with pytest.raises(StaleSession):
        step_commit(Step(session=session, trigger=Trigger.ANSWER, lease_owner="worker-b"))
    assert _snapshot(session) == before

    # The owner of the lease may move it.
    step_commit(Step(session=session, trigger=Trigger.ANSWER, lease_owner="worker-a"))
    assert Session.objects.get(pk=session.pk).state == State.FINISHED.value


@pytest.mark.django_db
def test_a_step_may_not_touch_columns_outside_its_whitelist(make_session):
    session = make_session(state=State.PROCESSING.value)
    before = _snapshot(session)
    with pytest.raises(ValueError, match="may not set state"):
        step_commit(Step(session=session, trigger=Trigger.ANSWER, set_fields={"state": "idle"}))
    with pytest.raises(ValueError, match="may not add to version"):
        step_commit(Step(session=session, trigger=Trigger.ANSWER, add_fields={"version": 1}))
    assert _snapshot(session) == before


@pytest.mark.django_db
def test_a_step_numbers_messages_and_events_without_gaps(make_session):
    session = make_session(state=State.PROCESSING.value, message_seq=4, event_seq=10)
    step_commit(
        Step(
            session=session,
            trigger=Trigger.ANSWER,
            messages=[
                Message(role="assistant", content="a"),
                Message(role="assistant", content="b"),
            ],
            events=[EventSpec(EventType.PROGRESS, {"stage": "preparing_tool", "turn": 0})],
            after_events=[
                EventSpec(
                    EventType.TURN_FINISHED,
                    {
                        "turn": 0,
                        "stop_reason": StopReason.ANSWER,
                        "iterations": 1,
                        "usage": {"input_tokens": 0, "output_tokens": 0, "cost": "0"},
                        "outcome": "ok",
                        "calls": {"ok": 0, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0},
                    },
                )
            ],
            checkpoint={"phase": "answer"},
        )
    )
    assert list(
        Message.objects.filter(session=session).order_by("seq").values_list("seq", "content")
    ) == [
        (5, "a"),
        (6, "b"),
    ]
    events = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "type"))
    assert events == [
        (11, "state.changed"),
        (12, "message.completed"),
        (13, "message.completed"),
        (14, "progress"),
        (15, "turn.finished"),
    ]
    checkpoint = Checkpoint.objects.get(session=session)
    assert checkpoint.step == 1 and checkpoint.message_seq == 6
    assert checkpoint.context == {"phase": "answer", "state": "finished"}
    assert checkpoint.size_bytes == len('{"phase":"answer","state":"finished"}')


@pytest.mark.django_db(transaction=True)
def test_concurrent_movers_exactly_one_wins(make_session):
    session = make_session(state=State.IDLE.value, version=7)
    copies = [Session.objects.get(pk=session.pk), Session.objects.get(pk=session.pk)]
    barrier = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def mover(index: int) -> None:
        try:
            # Each thread opens its own connection.
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            barrier.wait(timeout=10)
            outcomes[index] = _move(copies[index], Trigger.USER_MESSAGE, actor=f"t{index}")
        except Exception as exc:  # noqa: BLE001 - the outcome is what we check
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=mover, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()

    stale = [o for o in outcomes if isinstance(o, StaleSession)]
    won = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(stale) == 1 and len(won) == 1, outcomes
    row = Session.objects.get(pk=session.pk)
    assert row.version == 8 and row.state == State.PROCESSING.value
    assert Transition.objects.filter(session=session).count() == 1
    assert Event.objects.filter(session=session, type="state.changed").count() == 1


@pytest.mark.django_db(transaction=True)
def test_each_event_payload_is_dumped_once_for_its_row_and_its_frame(make_session, monkeypatch):
    """One json.dumps per payload: the row's jsonb parameter and the published frame
    share its text (the frame's text is what dumping the frame would give)."""
    session = make_session(state=State.PROCESSING.value)
    text = 'it\'s \\ "quoted" ünïcødé ✓ \u2028'
    # Every json.dumps, however it was bound (Django's, psycopg's, ours), ends in encode().
    dumped: list[Any] = []
    original_encode = json.JSONEncoder.encode

    def encode(self: json.JSONEncoder, obj: Any) -> str:
        dumped.append(obj)
        return original_encode(self, obj)

    published: list[tuple[list[Any], Any]] = []
    original_publish = commit_module.publish

    def publish(session_id: Any, frames: list[Any], *texts: Any) -> None:
        published.append((frames, texts))
        original_publish(session_id, frames, *texts)  # builds the frames' texts

    monkeypatch.setattr(json.JSONEncoder, "encode", encode)
    monkeypatch.setattr(commit_module, "publish", publish)
    step_commit(
        Step(
            session=session,
            trigger=Trigger.ANSWER,
            messages=[Message(role="assistant", content=text)],
            events=[EventSpec(EventType.PROGRESS, {"stage": text, "turn": 0})],
        )
    )
    monkeypatch.undo()

    payloads = list(Event.objects.filter(session=session).values_list("data", flat=True))
    assert len(payloads) == 3 and sum(text in p.values() for p in payloads) == 2
    for payload in payloads:
        # Dumped as itself or inside a whole frame: once in all.
        uses = [
            o for o in dumped if o == payload or (isinstance(o, dict) and o.get("data") == payload)
        ]
        assert len(uses) == 1, uses
    [(frames, texts)] = published
    texts = texts[0] if texts else [None] * len(frames)
    rows = dict(Event.objects.filter(session=session).values_list("seq", "data"))
    assert [f["data"] for f in frames] == [rows[f["seq"]] for f in frames]
    assert [publisher.frame_text(f, t) for f, t in zip(frames, texts, strict=True)] == [
        json.dumps(f) for f in frames
    ]


@pytest.mark.django_db
def test_the_owners_shared_rows_come_last_in_the_batch_so_a_step_holds_them_only_to_commit(
    make_session, settings
):
    """The rollups (and credit rows) are shared by every session of the owner: a row
    lock lasts until the commit, so they are written after the step's own rows."""
    settings.DB_PREPARED_STATEMENTS = False  # the batch as its statements' text
    session = make_session(state=State.PROCESSING.value)
    call = ModelCall(
        turn=session.turn,
        endpoint_name="primary",
        api="openai",
        input_tokens=10,
        output_tokens=5,
        outcome="success",
    )

    with CaptureQueriesContext(connection) as queries:
        # Through a move: it puts the step's charges on it (the store knows no billing).
        metered_commit(
            Step(
                session=session,
                trigger=Trigger.ANSWER,
                messages=[Message(role="assistant", content="done")],
                model_calls=[call],
                checkpoint={"phase": "answer"},
            )
        )

    [batch] = [q["sql"] for q in queries.captured_queries if UsageDaily._meta.db_table in q["sql"]]
    statements = batch.split(";\n")
    shared = [i for i, sql in enumerate(statements) if '"billing_' in sql or " billing_" in sql]
    assert shared and shared == list(range(shared[0], len(statements)))
    own = statements[: shared[0]]
    for table in (Session, Message, ModelCall, Event, Transition, Checkpoint):
        assert any(table._meta.db_table in sql for sql in own), table
    rollup = UsageDaily.objects.get(owner_id=session.owner_id, agent_id=session.agent_id)
    assert (rollup.input_tokens, rollup.output_tokens, rollup.model_calls) == (10, 5, 1)


@pytest.mark.django_db(transaction=True)
def test_an_event_over_event_max_bytes_is_cut_before_it_is_written_or_published(
    make_session, monkeypatch
):
    session = make_session(state=State.PROCESSING.value)
    published: list[tuple[list[Any], Any]] = []
    monkeypatch.setattr(
        commit_module, "publish", lambda _s, frames, texts: published.append((frames, texts))
    )
    output = {"blob": "x" * 1_200_000}
    finished = {
        "call_id": "c1",
        "tool": "export",
        "status": "success",
        "error": "",
        "turn": 1,
        "output": output,
    }

    step_commit(
        Step(
            session=session,
            trigger=Trigger.ANSWER,
            events=[EventSpec(EventType.TOOL_FINISHED, finished)],  # type: ignore[arg-type]
        )
    )

    row = Event.objects.get(session=session, type="tool.finished")
    size = len(json.dumps(output))
    assert row.data["output"] == {"truncated": True, "original_bytes": size}
    assert row.data["truncated"] == {"output": size}
    assert row.data["call_id"] == "c1" and row.data["status"] == "success"
    [(frames, texts)] = published
    frame = next(f for f in frames if f["type"] == "tool.finished")
    text = publisher.frame_text(frame, texts[frames.index(frame)])
    assert json.loads(text)["data"] == row.data
    assert len(text.encode()) <= 1024 * 1024

"""What the edges call: creating sessions, posting and queueing messages, cancelling, sweeping."""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from record.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from record.models import Agent, Event, Message, Session, Transition
from record.states import RUNNABLE, State
from sessions import selectors, services
from sessions.sweep_status import _client, _slot_key, sweep_age_s, sweep_mark_completed

pytestmark = pytest.mark.django_db


def _row(session: Session) -> Session:
    return Session.objects.get(pk=session.pk)


# session_create ----------------------------------------------------------------


def test_session_create_defaults_the_role_to_the_keys_first_role(make_agent, owner):
    agent = make_agent(slug="helper")
    session = services.session_create(
        owner=owner, agent_slug="helper", key_roles=["support", "analyst"]
    )
    assert session.role == "support"
    assert session.agent == agent and session.owner == owner
    assert (session.state, session.version, session.turn) == ("idle", 0, 0)


def test_session_create_takes_a_granted_role_and_metadata(make_agent, owner):
    make_agent(slug="helper")
    session = services.session_create(
        owner=owner,
        agent_slug="helper",
        key_roles=["support", "analyst"],
        role="analyst",
        metadata={"ticket": 7},
    )
    assert session.role == "analyst"
    assert _row(session).metadata == {"ticket": 7}


def test_session_create_refuses_a_role_the_key_does_not_grant(make_agent, owner):
    make_agent(slug="helper")
    with pytest.raises(InvalidInput) as info:
        services.session_create(
            owner=owner, agent_slug="helper", key_roles=["support"], role="admin"
        )
    assert info.value.details == {"field": "role"}
    assert "admin" in info.value.message and "support" in info.value.message
    assert not Session.objects.exists()


def test_session_create_refuses_an_unknown_agent(owner, make_agent):
    make_agent(slug="helper")
    with pytest.raises(InvalidInput) as info:
        services.session_create(owner=owner, agent_slug="nobody", key_roles=["support"])
    assert info.value.code == "unknown_agent"
    assert info.value.status == 400
    assert info.value.details == {"field": "agent"}


def test_session_create_refuses_a_disabled_agent(owner, make_agent):
    make_agent(slug="retired", enabled=False)
    with pytest.raises(InvalidInput) as info:
        services.session_create(owner=owner, agent_slug="retired", key_roles=["support"])
    assert info.value.code == "unknown_agent"


def test_session_create_without_roles_has_an_empty_role(owner, make_agent):
    make_agent(slug="helper")
    assert services.session_create(owner=owner, agent_slug="helper", key_roles=[]).role == ""


# message_post --------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "   ", "\n\t "])
def test_message_post_refuses_empty_content(make_session, content):
    session = make_session()
    with pytest.raises(InvalidInput) as info:
        services.message_post(session=session, content=content)
    assert info.value.details == {"field": "content"}
    assert not Message.objects.exists()
    assert _row(session).version == 0


@override_settings(MAX_MESSAGE_CHARS=50)
def test_message_post_refuses_content_over_the_limit(make_session):
    session = make_session()
    services.message_post(session=session, content="x" * 50)  # the limit itself is fine
    with pytest.raises(PayloadTooLarge) as info:
        services.message_post(session=session, content="x" * 51)
    assert info.value.status == 413
    assert info.value.details == {"field": "content", "limit": 50}
    assert Message.objects.count() == 1


def test_a_message_into_an_idle_session_starts_turn_one(make_session):
    session = make_session()
    posted = services.message_post(session=session, content="hello")

    assert posted.created is True
    message = posted.message
    assert (message.seq, message.turn, message.status, message.role) == (1, 1, "final", "user")
    row = _row(session)
    assert row.state == State.PROCESSING.value
    assert (row.turn, row.queued_count, row.message_seq, row.version, row.iteration) == (
        1,
        0,
        1,
        1,
        0,
    )
    move = Transition.objects.get(session=session)
    assert (move.from_state, move.to_state, move.trigger, move.turn) == (
        "idle",
        "processing",
        "user_message",
        1,
    )
    assert list(
        Event.objects.filter(session=session).order_by("seq").values_list("seq", "type")
    ) == [
        (1, "state.changed"),
        (2, "message.completed"),
    ]
    # Nobody holds the lease yet; the sweeper may pick the run up after the grace period.
    assert row.lease_owner is None and row.lease_expires_at is not None


def test_a_message_while_processing_is_queued_and_listed_last(make_session):
    session = make_session()
    first = services.message_post(session=session, content="first").message
    second = services.message_post(session=session, content="second").message

    assert second.seq is None and second.status == "queued"
    row = _row(session)
    assert row.state == State.PROCESSING.value
    assert (row.queued_count, row.turn, row.version) == (1, 1, 1)

    # The running turn's messages come first, then the queued one.
    Message.objects.create(
        session=session, seq=2, turn=1, role="assistant", content="working on it"
    )
    history = selectors.message_history(session=row, limit=20)
    assert [m.content for m in history] == ["first", "working on it", "second"]
    assert history[0].pk == first.pk
    assert [m.content for m in selectors.message_history(session=row, limit=2)] == [
        "working on it",
        "second",
    ]


@pytest.mark.parametrize("state", [State.FINISHED, State.CANCELLED, State.ERROR])
def test_a_message_after_a_turn_ended_starts_the_next_turn(make_session, state):
    session = make_session(
        state=state.value, turn=3, iteration=5, cancel_requested=True, last_error="boom"
    )
    posted = services.message_post(session=session, content="again")
    row = _row(session)
    assert row.state == State.PROCESSING.value
    assert (row.turn, row.iteration, row.cancel_requested, row.last_error) == (4, 0, False, "")
    assert posted.message.turn == 4


def test_idempotency_key_repeat_returns_the_same_message(make_session):
    session = make_session()
    first = services.message_post(session=session, content="hello", idempotency_key="k1")
    again = services.message_post(session=session, content="hello", idempotency_key="k1")

    assert first.created is True and again.created is False
    assert again.message.pk == first.message.pk
    assert Message.objects.filter(session=session).count() == 1
    assert _row(session).version == 1


def test_idempotency_key_with_different_content_is_a_conflict(make_session):
    session = make_session()
    services.message_post(session=session, content="hello", idempotency_key="k1")
    with pytest.raises(Conflict) as info:
        services.message_post(session=session, content="something else", idempotency_key="k1")
    assert info.value.status == 409
    assert info.value.code == "idempotency_key_reused"
    assert Message.objects.filter(session=session).count() == 1


def test_the_same_idempotency_key_in_another_session_is_independent(make_session, make_agent):
    agent = make_agent()
    a, b = make_session(agent=agent), make_session(agent=agent)
    services.message_post(session=a, content="hello", idempotency_key="k1")
    posted = services.message_post(session=b, content="other", idempotency_key="k1")
    assert posted.created is True


# session_cancel ---------------------------------------------------------------------


@pytest.mark.parametrize("state", sorted(RUNNABLE))
def test_cancel_on_a_running_session_sets_the_flag(make_session, state):
    session = make_session(state=state.value)
    assert services.session_cancel(session=session) is True
    row = _row(session)
    # The worker stops at its next step boundary; the state is not touched here.
    assert row.cancel_requested is True and row.state == state.value and row.version == 0


@pytest.mark.parametrize("state", [State.IDLE, State.FINISHED, State.CANCELLED, State.ERROR])
def test_cancel_with_nothing_running_returns_false(make_session, state):
    session = make_session(state=state.value)
    assert services.session_cancel(session=session) is False
    row = _row(session)
    assert row.cancel_requested is False and row.state == state.value and row.version == 0
    assert not Event.objects.filter(session=session).exists()


@pytest.mark.parametrize(
    "state", [State.AWAITING_APPROVAL, State.WAITING_TIMER, State.PAUSED_FOR_USER]
)
def test_cancel_while_waiting_on_a_person_or_clock_cancels_at_once(make_session, state):
    session = make_session(state=state.value, turn=2)
    assert (
        services.session_cancel(session=session, reason="user gave up", actor="api:owner") is True
    )
    row = _row(session)
    assert row.state == State.CANCELLED.value and row.version == 1
    move = Transition.objects.get(session=session)
    assert (move.from_state, move.trigger, move.actor) == (state.value, "cancel", "api:owner")
    last = Event.objects.filter(session=session).order_by("-seq").first()
    assert last.type == "turn.finished" and last.data["stop_reason"] == "cancelled"


# session_get ----------------------------------------------------------------------------


def test_session_get_reports_missing_sessions_as_not_found(make_session):
    session = make_session()
    assert services.session_get(session_id=session.pk) == session
    with pytest.raises(NotFound):
        services.session_get(session_id="00000000-0000-0000-0000-000000000000")
    with pytest.raises(NotFound):
        services.session_get(session_id="not-a-uuid")


# sessions_sweep ----------------------------------------------------------------------------


def _expire(session: Session, seconds_ago: float = 5) -> None:
    Session.objects.filter(pk=session.pk).update(
        lease_owner="dead-worker", lease_expires_at=timezone.now() - timedelta(seconds=seconds_ago)
    )


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_sweep_claims_an_expired_runnable_session_once(make_session, settings):
    expired = make_session(state=State.PROCESSING.value)
    _expire(expired)

    claimed = services.sessions_sweep()

    assert claimed == [str(expired.pk)]
    row = _row(expired)
    assert row.lease_owner is None
    grace = timedelta(seconds=settings.SESSION_PICKUP_GRACE_S)
    assert row.lease_expires_at == _db_now() + grace  # same transaction, same now()
    # Not again right away: its lease now runs for the pickup grace.
    assert services.sessions_sweep() == []


def test_sweep_leaves_live_leases_and_idle_sessions_alone(make_session, make_agent):
    agent = make_agent()
    live = make_session(agent=agent, state=State.TOOL_WAIT.value)
    Session.objects.filter(pk=live.pk).update(
        lease_owner="busy-worker", lease_expires_at=timezone.now() + timedelta(minutes=1)
    )
    idle = make_session(agent=agent, state=State.IDLE.value)
    finished = make_session(agent=agent, state=State.FINISHED.value)
    _expire(finished)
    waiting = make_session(agent=agent, state=State.AWAITING_APPROVAL.value)
    _expire(waiting)
    queued = make_session(agent=agent, state=State.FINISHED.value, queued_count=1)
    _expire(queued)
    never_leased = make_session(agent=agent, state=State.TOOL_LOOP.value)

    claimed = set(services.sessions_sweep())

    assert claimed == {str(queued.pk), str(never_leased.pk)}
    assert str(live.pk) not in claimed and str(idle.pk) not in claimed
    assert _row(live).lease_owner == "busy-worker"


def test_session_get_for_owner_hides_other_owners_and_bad_ids(make_session):
    session = make_session()
    assert (
        selectors.session_get_for_owner(session_id=session.pk, owner_id=session.owner_id) == session
    )
    for session_id, owner_id in [
        (session.pk, session.owner_id + 1000),
        ("not-a-uuid", session.owner_id),
        (None, session.owner_id),
    ]:
        with pytest.raises(NotFound):
            selectors.session_get_for_owner(session_id=session_id, owner_id=owner_id)


def test_a_sweep_that_finds_nothing_logs_nothing_at_info(make_session, caplog):
    make_session(state=State.IDLE.value)
    with caplog.at_level(logging.DEBUG, logger="sessions.services"):
        assert services.sessions_sweep() == []
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_a_sweep_that_requeues_logs_one_info_line(make_session, caplog):
    first = make_session(state=State.PROCESSING.value)
    second = make_session(state=State.TOOL_LOOP.value)
    _expire(first)
    _expire(second)
    with caplog.at_level(logging.INFO, logger="sessions.services"):
        claimed = services.sessions_sweep()
    assert set(claimed) == {str(first.pk), str(second.pk)}
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("sessions.services")]
    assert len(lines) == 1, lines
    assert "requeued 2 session(s)" in lines[0]
    assert str(first.pk) in lines[0] and str(second.pk) in lines[0]


def test_a_sweep_records_its_completion_for_readyz(make_session):
    stale = time.time() - 3600
    sweep_mark_completed(at=stale)
    assert sweep_age_s() >= 3599
    services.sessions_sweep()
    assert sweep_age_s() < 5


def test_beat_on_two_hosts_sweeps_once_per_interval(make_session, settings):
    # Two beats (one per worker host) each send a sweep every interval: the first of an
    # interval sweeps, the other finds the slot taken and does nothing.
    settings.SWEEPER_INTERVAL_S = 30.0
    _client(settings.REDIS_URL).delete(_slot_key())
    first = make_session(state=State.PROCESSING.value)
    _expire(first)
    assert services.sessions_sweep_scheduled() == [str(first.pk)]
    second = make_session(state=State.TOOL_LOOP.value)
    _expire(second)
    assert services.sessions_sweep_scheduled() == []
    assert _row(second).lease_expires_at < _db_now()  # untouched
    # The slot lapses within the interval (here: removed), and the next sweep runs.
    _client(settings.REDIS_URL).delete(_slot_key())
    assert services.sessions_sweep_scheduled() == [str(second.pk)]
    assert 0 < _client(settings.REDIS_URL).pttl(_slot_key()) <= 24_000


# row locks ----------------------------------------------------------------------------------------


def _in_thread(work, *, hold: threading.Event | None = None, done: threading.Event | None = None):  # type: ignore[no-untyped-def]
    """Run `work` on its own connection, in a transaction that fails on a lock wait over 3 s
    and, with `hold`, stays open (its locks held) until `hold` is set."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '3s'")
                outcome["value"] = work()
                if done is not None:
                    done.set()
                if hold is not None:
                    hold.wait(30)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome["error"] = exc
            if done is not None:
                done.set()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True)
def test_posts_lock_only_their_session_row_not_the_agent(make_agent, make_session):
    agent = make_agent()
    first, second, third = (make_session(agent=agent) for _ in range(3))
    release = threading.Event()
    first_posted = threading.Event()
    threads = []
    try:
        # 1. A post into the first session whose transaction stays open.
        holder, held = _in_thread(
            lambda: services.message_post(session=first, content="one"),
            hold=release,
            done=first_posted,
        )
        threads.append(holder)
        assert first_posted.wait(10) and "error" not in held, held
        # 2. A post into another session of the same agent does not wait for it.
        other, posted = _in_thread(lambda: services.message_post(session=second, content="two"))
        threads.append(other)
        other.join(10)
        assert not other.is_alive() and "error" not in posted, posted
        # 3. An admin edit of the agent does not wait for the open post either, and
        # 4. while that edit is uncommitted (the agent row locked), a third session posts.
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '3s'")
            assert Agent.objects.filter(pk=agent.pk).update(name="edited") == 1
            late, late_posted = _in_thread(
                lambda: services.message_post(session=third, content="three")
            )
            threads.append(late)
            late.join(10)
            assert not late.is_alive() and "error" not in late_posted, late_posted
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert "error" not in held, held
    assert [Message.objects.get(session=s).content for s in (first, second, third)] == [
        "one",
        "two",
        "three",
    ]
    assert Agent.objects.get(pk=agent.pk).name == "edited"


@pytest.mark.django_db(transaction=True)
def test_posts_into_one_session_still_wait_for_each_other(make_session):
    session = make_session()
    release, first_posted = threading.Event(), threading.Event()
    holder, held = _in_thread(
        lambda: services.message_post(session=session, content="one"),
        hold=release,
        done=first_posted,
    )
    try:
        assert first_posted.wait(10) and "error" not in held, held
        waiting, outcome = _in_thread(lambda: services.message_post(session=session, content="two"))
        waiting.join(10)
        # The session row is locked by the open post: the second one hit the lock timeout.
        assert "lock timeout" in str(outcome.get("error", "")), outcome
    finally:
        release.set()
        holder.join(30)
    assert list(Message.objects.filter(session=session).values_list("content", flat=True)) == [
        "one"
    ]


@pytest.mark.django_db
def test_the_sweep_publishes_step_pacing_from_the_database_round_trip(settings):
    """A database slower than PACING_DB_SLOW_MS: the sweep publishes a pause for the
    runner; a fast one publishes none. The workers' model p95 counts the same way."""
    from runtime import health
    from sessions.services import steps_pace

    settings.PACING_DB_SLOW_MS = 0.0001
    settings.PACING_MAX_DELAY_S = 2.0
    try:
        slow = steps_pace()
        assert 0 < slow.delay_s <= 2.0 and slow.reasons[0].startswith("database round trip")
        assert health.pacing_read() == slow
        settings.PACING_DB_SLOW_MS = 10_000
        health.report_publish(
            health.Report(
                name="w@pace", pid=1, at=0.0, inflight=0, steps=0, step_p50_s=0.0,
                step_p95_s=0.0, error_rate=0.0, model_p95_s=90.0, cpu_percent=0.0,
                rss_mb=1.0, accepting=True, reasons=[],
            ),
            ttl_s=30,
        )  # fmt: skip
        settings.PACING_MODEL_SLOW_S = 30.0
        by_model = steps_pace()
        assert by_model.delay_s == pytest.approx(1.333, abs=0.001), by_model
        health.report_withdraw("w@pace")
        assert steps_pace().delay_s == 0.0
        assert health.pacing_read().delay_s == 0.0
    finally:
        health.report_withdraw("w@pace")
        health._redis().delete(health._pacing_key())


def test_ephemeral_sessions_idle_past_their_ttl_are_pruned_with_what_they_hold(make_session):
    """Only ephemeral ones, only at rest, only once idle for EPHEMERAL_SESSION_TTL_S."""
    old = timezone.now() - timedelta(hours=2)
    gone = make_session(ephemeral=True, state=State.FINISHED.value)
    idle = make_session(ephemeral=True, state=State.IDLE.value)
    recent = make_session(ephemeral=True, state=State.FINISHED.value)
    waiting = make_session(ephemeral=True, state=State.AWAITING_APPROVAL.value)
    kept = make_session(state=State.FINISHED.value)  # not ephemeral
    Message.objects.create(session=gone, seq=1, turn=1, role="user", content="hi")
    Event.objects.create(session=gone, seq=1, type="state.changed", data={})
    Session.objects.filter(pk__in=[gone.pk, idle.pk, waiting.pk, kept.pk]).update(updated_at=old)

    assert services.ephemeral_sessions_prune(older_than_s=3600, batch=1) == 2
    left = set(Session.objects.values_list("pk", flat=True))
    assert left == {recent.pk, waiting.pk, kept.pk}
    assert not Message.objects.filter(session_id=gone.pk).exists()
    assert not Event.objects.filter(session_id=gone.pk).exists()
    assert services.ephemeral_sessions_prune(older_than_s=3600) == 0

"""openai_compat.services: a session seeded with a request's history; one turn posted, or refused
while another runs; a keyed request's claim on its first request's turn (retries)."""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from openai_compat.services import (
    SessionBusy,
    TurnPosted,
    chat_request_claim,
    chat_session_create,
    chat_turn_post,
)
from openai_compat.wire import HistoryItem
from record.errors import Conflict, Forbidden, NotFound, PayloadTooLarge
from record.models import Event, Message, RequestKey, Session, ToolCall
from sessions.services import KeyedRequest
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _session(**fields: Any) -> Session:
    session: Session = SessionFactory(**fields)  # type: ignore[assignment]
    return session


@pytest.fixture
def owner() -> User:
    AgentFactory(slug="helper", model=ModelEndpointFactory(name="rules", api="rules"))
    user: User = UserFactory(username="ada")  # type: ignore[assignment]
    return user


def test_a_new_session_holds_the_history_as_turn_zero(owner: User) -> None:
    session = chat_session_create(
        owner=owner,
        key_roles=["support"],
        agent_slug="helper",
        history=[HistoryItem("user", "I am Ada"), HistoryItem("assistant", "Hello Ada")],
        content="who am I?",
        api_key_id=41,
    )
    session.refresh_from_db()
    assert (session.message_seq, session.state, session.role) == (2, "idle", "support")
    # The key that sent the request is charged with the session's model calls.
    assert session.api_key_id == 41
    rows = list(session.messages.order_by("seq").values_list("seq", "turn", "role", "content"))
    assert rows == [(1, 0, "user", "I am Ada"), (2, 0, "assistant", "Hello Ada")]
    assert all(m.token_count > 0 for m in session.messages.all())


def test_an_oversized_history_message_opens_no_session(owner: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.MAX_MESSAGE_CHARS = 5
    with pytest.raises(PayloadTooLarge) as refused:
        chat_session_create(
            owner=owner,
            key_roles=[],
            agent_slug="helper",
            history=[HistoryItem("user", "much too long")],
            content="hi",
        )
    assert refused.value.details["field"] == "messages[0]"
    assert not Session.objects.exists()


def test_a_turn_is_posted_after_the_events_and_tokens_it_noted(owner: User) -> None:
    session = chat_session_create(
        owner=owner,
        key_roles=[],
        agent_slug="helper",
        history=[HistoryItem("user", "x")],
        content="hi",
    )
    Session.objects.filter(pk=session.pk).update(event_seq=7, input_tokens=30, output_tokens=4)
    posted = chat_turn_post(session_id=session.pk, owner_id=owner.pk, key_roles=[], content="hi")
    assert (posted.session_id, posted.after_seq, posted.tokens_before) == (session.pk, 7, (30, 4))
    session.refresh_from_db()
    assert session.state == "processing" and session.turn == 1
    assert session.event_seq > 7
    last = Message.objects.filter(session=session).order_by("-seq").first()
    assert last is not None and (last.seq, last.role, last.content) == (2, "user", "hi")


@pytest.mark.parametrize("state", ["processing", "tool_wait", "awaiting_approval", "waiting_timer"])
def test_a_busy_session_refuses_the_turn_and_stores_nothing(owner: User, state: str) -> None:
    session = _session(agent=AgentFactory(slug=f"a-{state}"), owner=owner, state=state)
    with pytest.raises(SessionBusy):
        chat_turn_post(
            session_id=session.pk, owner_id=owner.pk, key_roles=["support"], content="hi"
        )
    assert not Message.objects.filter(session=session).exists()


def test_queued_messages_make_a_session_busy_too(owner: User) -> None:
    session = _session(agent=AgentFactory(slug="q"), owner=owner, queued_count=1)
    with pytest.raises(SessionBusy):
        chat_turn_post(
            session_id=session.pk, owner_id=owner.pk, key_roles=["support"], content="hi"
        )


def test_another_owners_session_is_not_found(owner: User) -> None:
    session = _session(agent=AgentFactory(slug="mine"), owner=UserFactory(username="eve"))
    with pytest.raises(NotFound):
        chat_turn_post(
            session_id=session.pk, owner_id=owner.pk, key_roles=["support"], content="hi"
        )
    with pytest.raises(NotFound):
        chat_turn_post(session_id="nonsense", owner_id=owner.pk, key_roles=[], content="hi")


def test_a_key_without_the_sessions_role_posts_no_turn(owner: User) -> None:
    session = _session(agent=AgentFactory(slug="guarded"), owner=owner, role="admin")
    with pytest.raises(Forbidden) as refused:
        chat_turn_post(
            session_id=session.pk, owner_id=owner.pk, key_roles=["support"], content="hi"
        )
    assert refused.value.code == "role_not_held"
    assert refused.value.details == {"role": "admin", "key_roles": ["support"]}
    session.refresh_from_db()
    assert (session.state, session.turn, session.messages.count()) == ("idle", 0, 0)
    posted = chat_turn_post(
        session_id=session.pk, owner_id=owner.pk, key_roles=["admin", "support"], content="hi"
    )
    assert posted.session_id == session.pk
    assert Message.objects.filter(session=session, role="user").count() == 1


def test_a_stateless_requests_session_is_ephemeral_and_left_out_of_lists(owner: User) -> None:
    from sessions.selectors import session_list_for_owner

    kept = SessionFactory(owner=owner)
    stateless = chat_session_create(
        owner=owner, key_roles=["support"], agent_slug="helper", history=[], content="hi",
        ephemeral=True,
    )  # fmt: skip
    assert Session.objects.get(pk=stateless.pk).ephemeral
    assert list(session_list_for_owner(owner_id=owner.pk)) == [kept]
    assert set(session_list_for_owner(owner_id=owner.pk, ephemeral=True)) == {kept, stateless}


# Retried requests: chat_request_claim ------------------------------------------------------


class Starts:
    """`start()` for the claim: posts a turn into a new session, counting the calls."""

    def __init__(self, owner: User) -> None:
        self.owner = owner
        self.sessions: list[Session] = []

    def __call__(self) -> TurnPosted:
        session: Session = SessionFactory(owner=self.owner, agent__slug="helper-x")  # type: ignore[assignment]
        self.sessions.append(session)
        return chat_turn_post(
            session_id=session.pk, owner_id=self.owner.pk, key_roles=["support"], content="hi"
        )


KEY = KeyedRequest(key="k-1", fingerprint="a" * 64)


def _finish(session: Session, stop_reason: str, **data: Any) -> None:
    seq = Session.objects.get(pk=session.pk).event_seq + 1
    Event.objects.create(
        session=session,
        seq=seq,
        type="turn.finished",
        data={"stop_reason": stop_reason, "turn": 1, **data},
    )


def test_a_retry_while_the_turn_runs_re_attaches_and_posts_nothing(owner: User) -> None:
    start = Starts(owner)
    first = chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    again = chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    assert (first.reattached, again.reattached) == (False, True)
    assert again.posted == first.posted
    assert len(start.sessions) == 1
    assert Message.objects.filter(role="user").count() == 1
    # The record counts the requests: the first one's disconnect sees the retry came.
    assert (first.attempt, again.attempt) == (1, 2)
    assert RequestKey.objects.get().attempts == 2


def test_the_same_key_with_another_request_is_409_idempotency_key_reused(owner: User) -> None:
    start = Starts(owner)
    chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    other = KeyedRequest(key="k-1", fingerprint="b" * 64)
    with pytest.raises(Conflict) as refused:
        chat_request_claim(owner_id=owner.pk, keyed=other, start=start)
    assert refused.value.code == "idempotency_key_reused"
    assert len(start.sessions) == 1
    # Keys are the owner's: another owner's key of the same name is theirs alone.
    bob: User = UserFactory(username="bob")  # type: ignore[assignment]
    assert not chat_request_claim(owner_id=bob.pk, keyed=other, start=Starts(bob)).reattached


def test_an_answered_turn_or_one_failed_after_a_side_effect_is_re_attached(owner: User) -> None:
    start = Starts(owner)
    chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    _finish(start.sessions[0], "answer")
    assert chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start).reattached

    key = KeyedRequest(key="k-2", fingerprint="c" * 64)
    chat_request_claim(owner_id=owner.pk, keyed=key, start=start)
    session = start.sessions[-1]
    ToolCall.objects.create(
        session=session,
        turn=1,
        step=1,
        call_id="c1",
        tool_name="notify",
        idempotency_key=f"{session.pk}:c1",
        dispatched_at=timezone.now(),
    )
    _finish(session, "model_unavailable")
    assert chat_request_claim(owner_id=owner.pk, keyed=key, start=start).reattached
    assert len(start.sessions) == 2


def test_a_failure_a_retry_may_cure_without_a_side_effect_runs_again(owner: User) -> None:
    start = Starts(owner)
    chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    _finish(start.sessions[0], "model_unavailable")
    again = chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    assert not again.reattached
    assert len(start.sessions) == 2
    record = RequestKey.objects.get()
    assert (record.session_id, record.attempts) == (start.sessions[1].pk, 1)


def test_a_derived_key_matches_only_a_recent_first_attempt(owner: User) -> None:
    start = Starts(owner)
    derived = KeyedRequest(key="retry:x", fingerprint="d" * 64, first=True)
    chat_request_claim(owner_id=owner.pk, keyed=derived, start=start)
    retry = KeyedRequest(key="retry:x", fingerprint="d" * 64, window_s=60)
    assert chat_request_claim(owner_id=owner.pk, keyed=retry, start=start).reattached
    # A first attempt again (a new call with the same body) posts its own turn.
    assert not chat_request_claim(owner_id=owner.pk, keyed=derived, start=start).reattached
    RequestKey.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    assert not chat_request_claim(owner_id=owner.pk, keyed=retry, start=start).reattached
    assert len(start.sessions) == 3


def test_a_turn_left_by_its_client_is_cancelled_only_if_it_runs_with_nobody_back(
    owner: User,
) -> None:
    """relay's cancel after the grace asks `selectors.turn_left_running`."""
    from openai_compat.selectors import turn_left_running

    start = Starts(owner)
    claim = chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    session_id, after_seq = claim.posted.session_id, claim.posted.after_seq

    def left(attempt: int) -> bool:
        return turn_left_running(
            record_id=claim.record_id, attempt=attempt, session_id=session_id, after_seq=after_seq
        )

    assert left(claim.attempt)
    retry = chat_request_claim(owner_id=owner.pk, keyed=KEY, start=start)
    assert not left(claim.attempt)  # its retry waits on it
    assert left(retry.attempt)
    _finish(start.sessions[0], "answer")
    assert not left(retry.attempt)  # ended: nothing to cancel

"""Long conversations through the real engine (in-process runs, a real model server on
127.0.0.1 that records every request): no request over the window, the turn-3 fact still
seen at turn 200 through the rolling summary, originals archived and never deleted, a failed
summary falling back to trimming, the offline rules model summarising, forks keeping it."""

import json
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from engine import session_run
from engine.model.context import SUMMARY_HEADING, SUMMARY_NAME
from engine.model.summaries import (
    INSTRUCTIONS,
    SUMMARY_RETRY_BASE_S,
    parse_sections,
    render_summary,
    summary_retry_at,
)
from memory.tokens import MESSAGE_OVERHEAD_TOKENS, count_tokens
from record.models import Agent, Checkpoint, Message, ModelCall, ModelEndpoint, Session
from sessions.admin.timeline import session_timeline
from sessions.services import message_post, session_fork
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory
from tests.fakes.model_servers import FakeModelServer, Recorded, Reply

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "FAKE_CONTEXT_TEST_KEY"
WINDOW = 2000
FACT = "Please remember: my account number is 4471."
FILLER = "about the parcel tracking, the delivery window and the courier's notes " * 2


def _broker_messages() -> Iterator[tuple[Any, bytes, dict[str, Any]]]:
    """(list, raw message, its headers) of every task message waiting in the broker's queue."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key in client.scan_iter(f"{settings.CELERY_TASK_DEFAULT_QUEUE}*"):
        if client.type(key) == b"list":
            for raw in client.lrange(key, 0, -1):
                yield key, raw, json.loads(raw).get("headers") or {}


@pytest.fixture(autouse=True)
def _runs_dequeued(transactional_db: None) -> Iterator[None]:
    """These long conversations queue a run message per turn that no worker takes in the
    in-process lane; left behind they read as queue pressure (billing/pressure.py) and
    degrade later tests' steps to the cheaper model. Taken out after each test."""
    import redis
    from django.conf import settings

    from record import dispatch

    yield
    dispatch._sender.submit(lambda: None).result(timeout=10)  # what the sender still had
    ids = [str(pk) for pk in Session.objects.values_list("pk", flat=True)]
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key, raw, headers in list(_broker_messages()):
        if any(i in str(headers.get("argsrepr")) for i in ids):
            client.lrem(key, 1, raw)


def wire_tokens(request: Recorded) -> int:
    """The request's size as the platform estimates it, read from what went over the wire."""
    total = 0
    for message in request.messages:
        content = message.get("content") or ""
        total += MESSAGE_OVERHEAD_TOKENS + count_tokens(
            content if isinstance(content, str) else json.dumps(content)
        )
    return total


def is_summary_request(request: Recorded) -> bool:
    first = request.messages[0] if request.messages else {}
    return first.get("role") == "system" and first.get("content") == INSTRUCTIONS


def fake_model(request: Recorded) -> Reply:
    """A model that answers briefly and, asked for a summary, keeps the user's
    first-person facts (merging the previous summary), as a real one is told to."""
    if not is_summary_request(request):
        return Reply(text="Noted. " + FILLER, usage=None, text_splits=10_000)
    prompt = request.messages[-1]["content"]
    previous: dict[str, Any] = {}
    found = re.search(r"Previous summary:\n(\{.*?\})\n\n", prompt, re.DOTALL)
    if found:
        previous = json.loads(found.group(1))
    facts = list(previous.get("facts") or [])
    for line in prompt.splitlines():
        if line.startswith("user: ") and " my " in line and line[6:] not in facts:
            facts.append(line[6:])
    users = [line[6:] for line in prompt.splitlines() if line.startswith("user: ")]
    summary = {
        "intent": users[-1] if users else previous.get("intent", ""),
        "facts": facts,
        "actions": ["answered the user's questions"],
        "open_items": [],
    }
    return Reply(text="```json\n" + json.dumps(summary) + "\n```", usage=(50, 20))


@pytest.fixture
def endpoint(openai_server: FakeModelServer, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(KEY_ENV, "sk-context-test")

    def make(name: str, **fields: Any) -> Any:
        fields.setdefault("context_window", WINDOW)
        return ModelEndpointFactory(
            name=f"{name}-{uuid.uuid4().hex[:8]}",
            api="openai",
            base_url=openai_server.base_url,
            model="fake-model",
            api_key_env=KEY_ENV,
            first_token_timeout_s=3.0,
            total_timeout_s=10.0,
            **fields,
        )

    return make


def turn(session: Session, text: str) -> None:
    message_post(session=session, content=text)
    assert session_run(session_id=session.pk).stopped == "idle"


def user_text(n: int) -> str:
    return FACT if n == 3 else f"Question {n} {FILLER}"


def test_two_hundred_turns_in_a_small_window_keep_the_turn_three_fact(
    openai_server: FakeModelServer, endpoint: Any
) -> None:
    main = endpoint("main", context_window=8000)  # the agent's window is the tighter one
    agent = AgentFactory(
        slug=f"long-{uuid.uuid4().hex[:8]}",
        model=main,
        context_window=WINDOW,
        system_prompt="You are a support assistant.",
        tools=[],
    )
    session: Session = SessionFactory.create(agent=agent, owner=UserFactory(username="long-talker"))
    openai_server.script(*([fake_model] * 400))

    for n in range(1, 201):
        turn(session, user_text(n))

    requests = openai_server.requests
    answers = [r for r in requests if not is_summary_request(r)]
    summaries = [r for r in requests if is_summary_request(r)]
    assert len(answers) == 200
    assert max(wire_tokens(r) for r in requests) <= WINDOW
    # The fact of turn 3 is in what the model sees at turn 200, through the summary at the head.
    last = answers[-1].messages
    assert last[-1] == {"role": "user", "content": user_text(200)}
    head = [m["content"] for m in last if m["role"] == "system"]
    assert any(c.startswith(SUMMARY_HEADING) and "4471" in c for c in head), head
    assert not any(m["role"] == "user" and m["content"] == FACT for m in last)
    # Rolling summaries: many, each from the cheap path (here the agent's own model).
    assert len(summaries) >= 10
    recorded = ModelCall.objects.filter(session=session)
    assert recorded.filter(purpose="summary", outcome="success").count() == len(summaries)
    assert recorded.filter(purpose="step").count() == 200
    # Metered like any call: the session's usage counts the summaries' tokens too.
    fresh = Session.objects.get(pk=session.pk)
    assert fresh.input_tokens == sum(c.input_tokens for c in recorded)
    assert fresh.output_tokens == sum(c.output_tokens for c in recorded)
    assert sum(c.input_tokens for c in recorded.filter(purpose="summary")) == 50 * len(summaries)
    # Originals archived, never deleted; each summary a message in the history.
    messages = Message.objects.filter(session=session)
    summary_rows = messages.filter(name=SUMMARY_NAME)
    assert summary_rows.count() == len(summaries)
    assert messages.filter(role="user").count() == 200
    assert messages.filter(role="assistant").count() == 200
    archived = messages.filter(archived_at__isnull=False)
    assert archived.filter(role="user").count() > 150
    latest = summary_rows.order_by("-seq").first()
    assert latest is not None and latest.archived_at is None and latest.data
    assert (
        latest.data["through_seq"]
        == archived.exclude(name=SUMMARY_NAME)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    # The admin sees each step's partitions.
    context = (
        Checkpoint.objects.filter(session=session, context__has_key="context")
        .order_by("-step")
        .values_list("context", flat=True)
        .first()
    )
    assert context is not None
    tokens = context["context"]
    assert tokens["window"] == WINDOW
    assert 0 < tokens["history"] <= tokens["history_limit"]
    assert tokens["input"] == MESSAGE_OVERHEAD_TOKENS + count_tokens(user_text(200))


def test_a_failed_summary_falls_back_to_trimming_never_to_a_failed_turn(
    openai_server: FakeModelServer, endpoint: Any
) -> None:
    main = endpoint("main")
    summariser = endpoint("summariser")
    agent = AgentFactory(
        slug=f"fallback-{uuid.uuid4().hex[:8]}",
        model=main,
        summary_model=summariser,
        context_window=WINDOW,
        tools=[],
    )
    session: Session = SessionFactory.create(agent=agent, owner=UserFactory(username="unlucky"))

    def broken_summaries(request: Recorded) -> Reply:
        if is_summary_request(request):
            return Reply(status=400, error_message="this model cannot summarise")
        return fake_model(request)

    openai_server.script(*([broken_summaries] * 200))
    for n in range(1, 41):
        turn(session, user_text(n))

    requests = openai_server.requests
    # One failed attempt, then the retry waits (30 s): not a failed call per step.
    assert sum(is_summary_request(r) for r in requests) == 1
    assert max(wire_tokens(r) for r in requests) <= WINDOW
    assert Message.objects.filter(session=session, role="assistant").count() == 40
    assert not Message.objects.filter(session=session, archived_at__isnull=False).exists()
    assert not Message.objects.filter(session=session, name=SUMMARY_NAME).exists()
    failed = ModelCall.objects.filter(session=session, purpose="summary")
    assert failed.exists() and not failed.filter(outcome="success").exists()
    assert (
        not ModelCall.objects.filter(session=session, purpose="step")
        .exclude(outcome="success")
        .exists()
    )
    assert Session.objects.get(pk=session.pk).last_error == ""

    # Once the wait is over, the next step tries again; a second failure doubles the wait.
    failed.update(created_at=timezone.now() - timedelta(seconds=SUMMARY_RETRY_BASE_S + 1))
    turn(session, user_text(41))
    turn(session, user_text(42))
    assert sum(is_summary_request(r) for r in openai_server.requests) == 2
    retry_at = summary_retry_at(Session.objects.get(pk=session.pk))
    assert retry_at is not None
    assert retry_at - timezone.now() > timedelta(seconds=SUMMARY_RETRY_BASE_S + 5)


def test_the_offline_rules_model_summarises_deterministically_and_forks_keep_it() -> None:
    rules = ModelEndpointFactory(name="rules", api="rules")
    agent = AgentFactory(
        slug=f"offline-{uuid.uuid4().hex[:8]}",
        model=rules,
        context_window=WINDOW,
        rules=[{"answer": "Noted. " + FILLER}],
        tools=[],
    )
    owner = UserFactory(username="offline")
    session: Session = SessionFactory.create(agent=agent, owner=owner)
    for n in range(1, 41):
        turn(session, user_text(n))

    summary = Message.objects.filter(session=session, name=SUMMARY_NAME).order_by("-seq").first()
    assert summary is not None and summary.data
    assert FACT in summary.content and summary.content.startswith(SUMMARY_HEADING)
    assert summary.data["sections"]["facts"][0] == FACT
    assert summary.data["model"] == rules.name

    # The admin timeline marks the archived messages and shows each model step's partitions.
    items, _ = session_timeline(session.pk, limit=2000)
    assert any(i.kind == "message" and "[archived: a summary" in i.summary for i in items)
    steps = [i.summary for i in items if i.kind == "checkpoint" and "tokens: system" in i.summary]
    assert steps and all(f"of a {WINDOW:,} window" in s for s in steps)

    # A fork keeps the summary and what it archived, and goes on from it.
    source = Session.objects.get(pk=session.pk)
    fork = session_fork(session=source, step=source.step, actor="test")
    through = summary.data["through_seq"]
    copied = Message.objects.filter(session=fork)
    assert (
        copied.filter(name=SUMMARY_NAME).count()
        == Message.objects.filter(session=session, name=SUMMARY_NAME).count()
    )
    assert set(copied.filter(archived_at__isnull=False).values_list("seq", flat=True)) == set(
        range(1, through + 1)
    )


def test_summary_sections_parse_and_render_within_their_tokens() -> None:
    text = 'Sure!\n```json\n{"intent": "track a parcel", "facts": ["my id is 7"], "actions": "looked up", "open_items": []}\n```'
    sections = parse_sections(text)
    assert sections == {
        "intent": "track a parcel",
        "facts": ["my id is 7"],
        "actions": ["looked up"],
        "open_items": [],
    }
    assert parse_sections("no json here") is None
    assert parse_sections('{"unrelated": 1}') is None
    many = {
        "intent": "x",
        "facts": [f"fact {n} " + "word " * 10 for n in range(30)],
        "actions": [f"action {n} " + "word " * 10 for n in range(30)],
        "open_items": ["one"],
    }
    rendered = render_summary(many, 200)
    assert count_tokens(rendered) + MESSAGE_OVERHEAD_TOKENS <= 200
    assert "fact 0 " in rendered and "fact 29" not in rendered and "action 0 " not in rendered


def test_the_window_is_the_tightest_of_the_agent_and_the_endpoints_a_step_may_call() -> None:
    from engine.model.calls import request_window

    roomy = ModelEndpointFactory.create(name=f"roomy-{uuid.uuid4().hex[:6]}", context_window=8000)
    small: ModelEndpoint = ModelEndpointFactory.create(
        name=f"small-{uuid.uuid4().hex[:6]}", context_window=3000
    )
    agent: Agent = AgentFactory.create(
        slug=f"window-{uuid.uuid4().hex[:8]}", model=roomy, fallback_model=small
    )
    session: Session = SessionFactory.create(agent=agent)
    assert request_window(agent, session) == 3000
    small.enabled = False  # a disabled fallback is never called
    assert request_window(agent, session) == 8000
    agent.context_window = 2500
    assert request_window(agent, session) == 2500


def transcript_lines(request: Recorded) -> list[str]:
    prompt = request.messages[-1]["content"]
    return prompt.split("Conversation to condense:\n", 1)[1].splitlines()


def test_a_summary_covers_only_what_fitted_the_summary_models_window(
    openai_server: FakeModelServer, endpoint: Any
) -> None:
    """The summary model's window holds a few messages of the oldest third: the summary
    claims those, not the chunk's end, and the rest stays in the context."""
    main = endpoint("main")
    # Room for the instructions, the reply and about two transcript lines.
    narrow = endpoint("narrow", context_window=1050)
    agent = AgentFactory(
        slug=f"narrow-{uuid.uuid4().hex[:8]}",
        model=main,
        summary_model=narrow,
        context_window=WINDOW,
        tools=[],
    )
    session: Session = SessionFactory.create(agent=agent, owner=UserFactory(username="narrow"))
    openai_server.script(*([fake_model] * 200))
    n = 0
    while not Message.objects.filter(session=session, name=SUMMARY_NAME).exists():
        n += 1
        assert n < 40, "no summary was made"
        turn(session, user_text(n))

    request = next(r for r in openai_server.requests if is_summary_request(r))
    sent = transcript_lines(request)
    summary = Message.objects.get(session=session, name=SUMMARY_NAME)
    assert summary.data is not None
    through = summary.data["through_seq"]
    last_sent = Message.objects.get(session=session, seq=through)
    # The summary ends at the last message the summary model read...
    assert sent[-1] == f"{last_sent.role}: {last_sent.content[:600]}"
    assert summary.data["messages"] == len(sent)
    # ...the message after it was not read, is not archived, and the next step still sees it.
    after = Message.objects.get(session=session, seq=through + 1)
    assert after.archived_at is None and after.role in ("user", "assistant")
    assert set(
        Message.objects.filter(session=session, archived_at__isnull=False).values_list(
            "seq", flat=True
        )
    ) == set(range(summary.data["from_seq"], through + 1))
    turn(session, user_text(n + 1))
    seen = [m.get("content") for m in openai_server.requests[-1].messages]
    assert after.content in seen


def test_a_summary_in_prose_keeps_the_prose_as_its_facts(
    openai_server: FakeModelServer, endpoint: Any
) -> None:
    main = endpoint("main")
    agent = AgentFactory(
        slug=f"prose-{uuid.uuid4().hex[:8]}", model=main, context_window=WINDOW, tools=[]
    )
    session: Session = SessionFactory.create(agent=agent, owner=UserFactory(username="prose"))
    prose = "The user's account number is 4471.\nThey asked about parcel tracking."

    def prose_model(request: Recorded) -> Reply:
        if is_summary_request(request):
            return Reply(text=prose, usage=(50, 20))
        return fake_model(request)

    openai_server.script(*([prose_model] * 200))
    n = 0
    while not Message.objects.filter(session=session, name=SUMMARY_NAME).exists():
        n += 1
        assert n < 40, "no summary was made"
        turn(session, user_text(n))

    summary = Message.objects.get(session=session, name=SUMMARY_NAME)
    assert summary.data is not None
    assert summary.data["sections"]["facts"] == [
        "The user's account number is 4471.",
        "They asked about parcel tracking.",
    ]
    assert "- The user's account number is 4471." in summary.content
    # The next summary merges it like a JSON one: the prose facts go in as the previous summary.
    while Message.objects.filter(session=session, name=SUMMARY_NAME).count() < 2:
        n += 1
        assert n < 80, "no second summary was made"
        turn(session, user_text(n))
    second = [r for r in openai_server.requests if is_summary_request(r)][1]
    assert "4471" in second.messages[-1]["content"].split("Conversation to condense:")[0]


def _summaries_enqueued(session: Session) -> int:
    """`summarise_ahead` messages for this session waiting in the broker."""
    from record import dispatch

    dispatch._sender.submit(lambda: None).result(timeout=10)  # the sender thread has sent
    return sum(
        1
        for _, _, headers in _broker_messages()
        if headers.get("task") == dispatch.SUMMARY_AHEAD_TASK
        and str(session.pk) in str(headers.get("argsrepr"))
    )


def test_a_summary_is_made_ahead_off_the_step_and_the_step_at_the_limit_uses_it(
    openai_server: FakeModelServer, endpoint: Any
) -> None:
    """Past 60 % the committed step enqueues the summary task; the task (run here as a
    worker would) makes the summary once, whatever it is delivered twice; the step that
    reaches 90 % uses it without a model call of its own."""
    from engine import summary_ahead_make
    from record.models import SummaryDraft

    main = endpoint("main")
    agent = AgentFactory(
        slug=f"ahead-{uuid.uuid4().hex[:8]}", model=main, context_window=WINDOW, tools=[]
    )
    session: Session = SessionFactory.create(agent=agent, owner=UserFactory(username="ahead"))
    openai_server.script(*([fake_model] * 200))

    def summary_requests() -> int:
        return sum(is_summary_request(r) for r in openai_server.requests)

    n = 0
    while not _summaries_enqueued(session):
        n += 1
        assert n < 40, "no summary was enqueued"
        turn(session, user_text(n))
    assert summary_requests() == 0  # enqueued, not made in the step
    assert not Message.objects.filter(session=session, name=SUMMARY_NAME).exists()

    assert summary_ahead_make(session_id=str(session.pk))
    assert not summary_ahead_make(session_id=str(session.pk))  # delivered twice: made once
    assert summary_requests() == 1
    draft = SummaryDraft.objects.get(session=session)
    assert draft.ready and draft.base_through == 0 and draft.claimed_at is None
    recorded = ModelCall.objects.filter(session=session, purpose="summary")
    assert recorded.count() == 1 and recorded.get().outcome == "success"  # metered like a step's

    while not Message.objects.filter(session=session, name=SUMMARY_NAME).exists():
        n += 1
        assert n < 60, "the step never reached the summary watermark"
        turn(session, user_text(n))
    summary = Message.objects.get(session=session, name=SUMMARY_NAME)
    assert summary.data is not None and summary.data["prepared"] is True
    assert summary.content == draft.content and summary.data["through_seq"] == draft.through_seq
    assert summary_requests() == 1  # the step made no summary call of its own
    archived = Message.objects.filter(session=session, archived_at__isnull=False)
    assert set(archived.values_list("seq", flat=True)) == set(
        range(draft.from_seq, draft.through_seq + 1)
    )


def test_the_transcript_ends_between_units_never_inside_a_tool_round() -> None:
    from engine.model.summaries import fitted_transcript

    def message(seq: int, role: str, content: str, **fields: Any) -> Message:
        return Message(seq=seq, turn=1, role=role, content=content, **fields)

    call = {"id": "c1", "name": "lookup", "arguments": {"n": 1}}
    messages = (
        message(1, "user", "Where is parcel 7? " * 5),
        message(2, "assistant", "", tool_calls=[call]),
        message(3, "tool", "parcel 7 is in Lyon " * 10, name="lookup", tool_call_id="c1"),
        message(4, "assistant", "It is in Lyon."),
    )
    # Room for the question and the call, not for the call's result: the call stays out too.
    room = count_tokens("user: " + messages[0].content + "\n") + 40
    text, rows, sent = fitted_transcript(messages, room)
    assert [m.seq for m in sent] == [1] and len(rows) == 1 and "lookup" not in text
    # Everything fits: everything is sent.
    _, _, sent = fitted_transcript(messages, 10_000)
    assert [m.seq for m in sent] == [1, 2, 3, 4]
    # Not even the first unit fits: a tool round goes whole (call and result), capped.
    text, rows, sent = fitted_transcript(messages[1:], 10)
    assert [m.seq for m in sent] == [2, 3] and count_tokens(text) <= 10

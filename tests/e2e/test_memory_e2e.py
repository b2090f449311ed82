"""On the real stack: "remember that ..." is kept by the worker after the turn (a Celery task),
and the owner's next session sees it in its context; the offline embedder, no endpoint."""

import time
import uuid

import pytest

from memory.models import MemoryItem
from record.models import Session
from tests.e2e.support import (
    api,
    create_session,
    get_messages,
    post_message,
    turns_finished,
    wait_events,
)
from tests.factories import AgentFactory, ModelEndpointFactory, api_key_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_remembered_fact_reaches_the_next_session(live_stack):
    slug = f"memory-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["recall"],
        rules=[
            {"when": {"user": "colour", "last_tool": None},
             "tool_calls": [{"tool": "recall", "args": {"query": "favourite colour"}}]},
            {"when": {"last_tool": "recall"}, "answer": "You said: {{ result.memories.0.content }}"},
            {"answer": "Noted."},
        ],
    )  # fmt: skip
    key = api_key_for(f"rememberer-{uuid.uuid4().hex[:6]}")
    with api(live_stack, key) as client:
        first = create_session(client, slug)
        post_message(client, first, "Please remember that my favourite colour is teal.")
        wait_events(client, first, turns_finished(1), timeout=60)
        owner_id = Session.objects.get(pk=first).owner_id
        deadline = time.monotonic() + 60
        while not MemoryItem.objects.filter(owner_id=owner_id).exists():
            assert time.monotonic() < deadline, live_stack.log_tail("worker")
            time.sleep(0.2)
        item = MemoryItem.objects.get(owner_id=owner_id)
        assert (item.content, item.subject, item.source) == (
            "my favourite colour is teal", "favourite colour", "user"
        )  # fmt: skip
        assert str(item.source_session_id) == first

        second = create_session(client, slug)
        post_message(client, second, "what is my favourite colour?")
        wait_events(client, second, turns_finished(1), timeout=60)
        answers = [m["content"] for m in get_messages(client, second) if m["role"] == "assistant"]
        assert answers[-1] == "You said: my favourite colour is teal", answers

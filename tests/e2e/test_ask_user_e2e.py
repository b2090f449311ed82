"""`ask_user` on the live stack: the question arrives on the session's stream, the session waits
holding no worker, the user's next message (over the websocket) answers and the same turn goes on."""

import asyncio
import json
import uuid

import pytest
import websockets

from record.models import Session
from tests.e2e.support import api, create_session, post_message, wait_events
from tests.factories import AgentFactory, ModelEndpointFactory, api_key_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _agent() -> str:
    slug = f"asking-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["ask_user"],
        rules=[
            {"when": {"user": "^book", "last_tool": None},
             "tool_calls": [{"tool": "ask_user", "args": {"question": "Which day?", "options": ["Mon", "Tue"]}}]},
            {"when": {"last_tool": "ask_user"}, "answer": "Booked for {{ result.answer }}"},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def test_the_question_streams_and_the_websocket_answer_continues_the_turn(live_stack):
    slug = _agent()
    key = api_key_for("asker")
    with api(live_stack, key) as client:
        session_id = create_session(client, slug)
        post_message(client, session_id, "book a table")
        events = wait_events(
            client,
            session_id,
            lambda es: any(
                e["type"] == "progress" and e["data"]["stage"] == "question" for e in es
            ),
            timeout=60,
            describe=lambda: live_stack.log_tail("worker"),
        )
        question = next(e for e in events if e["type"] == "progress")["data"]
        assert (question["question"], question["options"]) == ("Which day?", ["Mon", "Tue"])
        session = Session.objects.get(pk=session_id)
        assert (session.state, session.lease_owner) == ("paused_for_user", None)

        async def answer() -> None:
            url = f"{live_stack.ws}/ws/sessions/{session_id}/?after={events[-1]['seq']}"
            async with websockets.connect(
                url, additional_headers={"Authorization": f"Bearer {key}"}
            ) as ws:
                await ws.send(json.dumps({"type": "user_message", "content": "Tue"}))
                async with asyncio.timeout(30):
                    async for raw in ws:
                        if json.loads(raw)["type"] == "turn.finished":
                            return

        asyncio.run(answer())
        events = wait_events(
            client, session_id, lambda es: any(e["type"] == "turn.finished" for e in es), timeout=30
        )
    finished = [e for e in events if e["type"] == "turn.finished"]
    assert len(finished) == 1 and finished[0]["data"]["turn"] == 1  # the same turn
    answer_text = [e for e in events if e["type"] == "message.completed"][-1]["data"]["content"]
    assert answer_text == "Booked for Tue"

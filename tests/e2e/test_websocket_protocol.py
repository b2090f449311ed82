"""Frames a websocket client sends, and who may open a session's websocket."""

import asyncio
import json
import uuid

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import (
    api,
    collect_until,
    create_session,
    expect_silence,
    get_events,
    get_messages,
    get_session,
    post_message,
    recv_frame,
    set_model_options,
    stack_logs,
    turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import AgentFactory, api_key_for

# Run again with FAST_PATHS=off by make test (tests/lanes.py): the fallbacks on the real stack.
pytestmark = [pytest.mark.e2e, pytest.mark.fast_paths, pytest.mark.django_db(transaction=True)]


def _turn_finished(frame, _frames):
    return frame["type"] == "turn.finished"


def test_user_message_frame_starts_a_turn(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")

        async def scenario():
            async with ws_connect(live_stack, session_id, key) as ws:
                await ws.send(json.dumps({"type": "user_message", "content": "hi"}))
                frames = await collect_until(ws, _turn_finished, timeout=20)
                # The same idempotency key twice is one message, one turn.
                frame = {"type": "user_message", "content": "again", "idempotency_key": "k-1"}
                await ws.send(json.dumps(frame))
                await ws.send(json.dumps(frame))
                frames += await collect_until(
                    ws, _turn_finished, timeout=20, describe=stack_logs(live_stack)
                )
                await expect_silence(ws, 1.0)
                return frames

        frames = asyncio.run(scenario())
        messages = get_messages(client, session_id)
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "hi"),
        ("assistant", "Echo: hi"),
        ("user", "again"),
        ("assistant", "Echo: again"),
    ]
    assert messages[2]["idempotency_key"] == "k-1"
    finished = [f["data"] for f in frames if f["type"] == "turn.finished"]
    assert [(d["turn"], d["stop_reason"], d["iterations"]) for d in finished] == [
        (1, "answer", 1),
        (2, "answer", 1),
    ]
    assert not [f for f in frames if f["type"] == "error"], frames


def test_interrupt_frame_cancels_a_slow_turn(live_stack):
    demo_install()
    set_model_options("rules", latency_s=1.0)
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")

        async def scenario():
            async with ws_connect(live_stack, session_id, key) as ws:
                await ws.send(json.dumps({"type": "user_message", "content": DEMO_REQUEST}))
                frames = await collect_until(
                    ws, lambda f, _: f["type"] == "state.changed", timeout=10
                )
                await ws.send(json.dumps({"type": "interrupt"}))
                frames += await collect_until(
                    ws, _turn_finished, timeout=20, describe=stack_logs(live_stack)
                )
                await expect_silence(ws, 1.0)
                return frames

        frames = asyncio.run(scenario())
        session = get_session(client, session_id)
        history = get_events(client, session_id)
    debug = f"{[(f['seq'], f['type']) for f in frames]}\n{live_stack.log_tail('worker')}"
    last = frames[-1]
    assert last["type"] == "turn.finished" and last["data"]["stop_reason"] == "cancelled", debug
    states = [f["data"] for f in frames if f["type"] == "state.changed"]
    assert states[-1]["to"] == "cancelled" and states[-1]["trigger"] == "cancel", debug
    assert session["state"] == "cancelled", session
    # Stopped early: the report was never written.
    assert "generate_report" not in [f["data"].get("tool") for f in frames], debug
    assert history[-1]["seq"] == last["seq"]


def test_interrupt_frame_cancels_a_turn_while_the_answer_streams(live_stack):
    """An interrupt while the model streams its final answer cancels the turn (not answered)."""
    endpoint = AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}]).model
    endpoint.options = {"chunk_delay_s": 0.1}
    endpoint.save()
    words = " ".join(f"word{i}" for i in range(30))  # about 3 s of streaming
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")

        async def scenario():
            async with ws_connect(live_stack, session_id, key) as ws:
                await ws.send(json.dumps({"type": "user_message", "content": words}))
                # The model call is in flight once its first text arrives.
                frames = await collect_until(
                    ws, lambda f, _: f["type"] == "message.delta", timeout=15
                )
                await ws.send(json.dumps({"type": "interrupt"}))
                frames += await collect_until(
                    ws, _turn_finished, timeout=20, describe=stack_logs(live_stack)
                )
                await expect_silence(ws, 0.5)
                return frames

        frames = asyncio.run(scenario())
        session = get_session(client, session_id)
        messages = get_messages(client, session_id)
    debug = f"{[(f['seq'], f['type'], f['data']) for f in frames]}"
    last = frames[-1]
    assert last["type"] == "turn.finished" and last["data"]["stop_reason"] == "cancelled", debug
    assert [f["data"]["to"] for f in frames if f["type"] == "state.changed"] == [
        "processing",
        "cancelled",
    ], debug
    assert last["data"]["iterations"] == 1, debug
    assert session["state"] == "cancelled", session
    # The stream was cut short: the client never got the whole answer, and the
    # unfinished answer is not in the history.
    streamed = "".join(f["data"]["text"] for f in frames if f["type"] == "message.delta")
    assert streamed and f"Echo: {words}".startswith(streamed), debug
    assert streamed != f"Echo: {words}", debug
    assert [(m["role"], m["content"]) for m in messages] == [("user", words)]
    # Whatever usage the interrupted call had is counted once, in both places.
    usage = {k: str(v) for k, v in last["data"]["usage"].items()}
    assert usage == {k: str(v) for k, v in session["usage"].items()}, (usage, session["usage"])
    assert not [f for f in frames if f["type"] == "error"], debug


MALFORMED = [
    ("not json", "malformed_frame"),
    ("[1, 2, 3]", "malformed_frame"),
    ('"just a string"', "malformed_frame"),
    ('{"content": "no type"}', "malformed_frame"),
    ('{"type": 7}', "malformed_frame"),
    ('{"type": "dance"}', "unknown_frame_type"),
    ('{"type": "user_message", "content": 5}', "invalid_input"),
    ('{"type": "user_message"}', "invalid_input"),
    ('{"type": "user_message", "content": "x", "idempotency_key": 1}', "invalid_input"),
    ('{"type": "user_message", "content": "   "}', "invalid_input"),
]


def test_malformed_frames_get_an_error_and_change_nothing(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        post_message(client, session_id, "first")
        wait_events(
            client, session_id, turns_finished(1), 20, lambda: live_stack.log_tail("worker")
        )
        before_session = get_session(client, session_id)
        before_events = get_events(client, session_id)
        before_messages = get_messages(client, session_id)
        last_seq = before_events[-1]["seq"]

        async def scenario():
            errors = []
            async with ws_connect(live_stack, session_id, key, after=last_seq) as ws:
                for raw, _code in MALFORMED:
                    await ws.send(raw)
                    errors.append(await recv_frame(ws, timeout=5))
                await ws.send(b"\x00binary")
                errors.append(await recv_frame(ws, timeout=5))
                await expect_silence(ws, 1.0)
                # Nothing changed (checked while the socket is still open) ...
                after = await asyncio.to_thread(
                    lambda: (
                        get_session(client, session_id),
                        get_events(client, session_id),
                        get_messages(client, session_id),
                    )
                )
                # ... and the socket still works.
                await ws.send(json.dumps({"type": "user_message", "content": "second"}))
                frames = await collect_until(ws, _turn_finished, timeout=20)
            return errors, after, frames

        errors, after, frames = asyncio.run(scenario())

    expected_codes = [code for _raw, code in MALFORMED] + ["malformed_frame"]
    assert [e["data"]["code"] for e in errors] == expected_codes, errors
    for error in errors:
        assert error["type"] == "error" and error["seq"] is None, error
        assert error["session"] == session_id, error
        assert isinstance(error["data"]["message"], str) and error["data"]["message"]
    assert after == (before_session, before_events, before_messages)
    assert frames[0]["seq"] == last_seq + 1
    completed = [f["data"]["content"] for f in frames if f["type"] == "message.completed"]
    assert completed == ["second", "Echo: second"]


async def _closed_with(ws, timeout: float = 5) -> tuple[list[dict], int | None]:
    """Frames received until the server closes, and the close code."""
    frames = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                frames.append(json.loads(await ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None


def test_websocket_authentication_and_origin(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    other_key = api_key_for("mallory")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        post_message(client, session_id, "hello")
        history = wait_events(client, session_id, turns_finished(1), 20)
    allowed_origin = f"http://127.0.0.1:{live_stack.port}"

    async def refused(key=None, token=None, session=session_id, after=None):
        async with ws_connect(live_stack, session, key, token=token, after=after) as ws:
            return await _closed_with(ws)

    async def accepted(**kwargs):
        async with ws_connect(live_stack, session_id, **kwargs) as ws:
            frames = [await recv_frame(ws) for _ in history]
            await expect_silence(ws, 0.5)
            return frames

    async def scenario():
        results = {
            "no key": await refused(),
            "wrong key": await refused(key="not-a-real-key"),
            "wrong token": await refused(token="not-a-real-key"),
            "other owner": await refused(key=other_key),
            "no such session": await refused(key=key, session=str(uuid.uuid4())),
            "bad after": await refused(key=key, after="abc"),
            "after past the end": await refused(key=key, after=str(history[-1]["seq"] + 5)),
        }
        with pytest.raises(InvalidStatus) as bad_origin:
            async with ws_connect(live_stack, session_id, key, origin="http://evil.example"):
                pass
        results["bad origin"] = bad_origin.value.response.status_code
        with pytest.raises(InvalidStatus) as wrong_port:
            async with ws_connect(live_stack, session_id, key, origin="http://127.0.0.1:1"):
                pass
        results["wrong port"] = wrong_port.value.response.status_code
        results["header"] = await accepted(key=key)
        results["token"] = await accepted(token=key)
        results["allowed origin"] = await accepted(key=key, origin=allowed_origin)
        results["token and origin"] = await accepted(token=key, origin=allowed_origin)
        return results

    results = asyncio.run(scenario())

    def error_then_close(name, code, close_code):
        frames, closed = results[name]
        assert closed == close_code, (name, frames, closed)
        assert len(frames) == 1, (name, frames)
        assert frames[0]["type"] == "error" and frames[0]["seq"] is None, (name, frames)
        assert frames[0]["data"]["code"] == code, (name, frames)

    error_then_close("no key", "not_authenticated", 4401)
    error_then_close("wrong key", "not_authenticated", 4401)
    error_then_close("wrong token", "not_authenticated", 4401)
    error_then_close("other owner", "not_found", 4404)
    error_then_close("no such session", "not_found", 4404)
    error_then_close("bad after", "invalid_input", 4400)
    # Accepted, a client would take every frame up to it for one already seen and wait
    # for ever: it is told where the stream ends.
    error_then_close("after past the end", "invalid_input", 4400)
    past = results["after past the end"][0][0]["data"]["details"]
    assert past == {"field": "after", "last_seq": history[-1]["seq"]}
    assert results["bad origin"] == 403
    assert results["wrong port"] == 403
    expected = [(e["seq"], e["type"], e["data"]) for e in history]
    for name in ("header", "token", "allowed origin", "token and origin"):
        assert [(f["seq"], f["type"], f["data"]) for f in results[name]] == expected, name

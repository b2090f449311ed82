"""Hostile input against the real daphne: websocket frames that break the REST rules,
frames on refused sockets, unknown websocket paths, and bodies REST refuses
(issue 15, items 2-4). Each gets its error, the socket or server keeps working,
nothing is stored, and the server logs no traceback."""

import asyncio
import contextlib
import json

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

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
    turns_finished,
    wait_events,
    ws_connect,
)
from tests.factories import AgentFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _log_size(stack: Stack) -> int:
    return stack.logs["web"].stat().st_size


def _log_since(stack: Stack, offset: int) -> str:
    with stack.logs["web"].open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def _assert_no_traceback(stack: Stack, offset: int) -> None:
    # daphne logs an application error a moment after the response; give it that moment.
    asyncio.run(asyncio.sleep(0.3))
    log = _log_since(stack, offset)
    for marker in ("Traceback", "No route found", "AttributeError", "Internal Server Error"):
        assert marker not in log, log


def _turn_finished(frame, _frames):  # type: ignore[no-untyped-def]
    return frame["type"] == "turn.finished"


# A frame, the error code it gets, and what the error says: the field it names,
# the JSON path it points at, or (for nesting deep enough to hit the decoder's
# recursion limit, which depends on the stack) the reason.
DEEP = "nested deeper than 32 levels"
HOSTILE_FRAMES = [
    ('{"type": "user_message", "content": "a\\u0000b"}', "invalid_input", "field", "content"),
    ('{"type": "user_message", "content": "a\\ud800"}', "invalid_input", "path", "$.content"),
    ('{"type": "user_message", "content": "\\udfff"}', "invalid_input", "path", "$.content"),
    (
        '{"type": "user_message", "content": "hi", "idempotency_key": "k\\udc00"}',
        "invalid_input",
        "path",
        "$.idempotency_key",
    ),
    (
        json.dumps({"type": "user_message", "content": "hi", "idempotency_key": "k" * 201}),
        "invalid_input",
        "field",
        "idempotency_key",
    ),
    (
        json.dumps({"type": "user_message", "content": "hi", "idempotency_key": "k\x00"}),
        "invalid_input",
        "field",
        "idempotency_key",
    ),
    (
        '{"type": "user_message", "content": "hi", "extra": ' + "[" * 100 + "]" * 100 + "}",
        "invalid_input",
        "path",
        "$.extra" + "[0]" * 31,
    ),
    (
        '{"type": "user_message", "content": "hi", "extra": ' + "[" * 1000 + "]" * 1000 + "}",
        "invalid_input",
        "reason",
        DEEP,
    ),
    ("[" * 1000 + "]" * 1000, "invalid_input", "reason", DEEP),
    ('{"a":' * 5000 + "1" + "}" * 5000, "invalid_input", "reason", DEEP),
    ('{"type": "user_message", "content": "hi", "n": 1e400}', "invalid_input", "path", "$.n"),
    (
        '{"type": "user_message", "content": "hi", "n": ' + "9" * 3000 + "}",
        "invalid_input",
        "path",
        "$.n",
    ),
    (
        '{"type": "user_message", "content": "hi", "colour": "blue"}',
        "invalid_input",
        "field",
        "colour",
    ),
    ('{"type": "interrupt", "why": "\\ud800"}', "invalid_input", "path", "$.why"),
    ('{"type": "user_message", "content": NaN}', "malformed_frame", None, None),
]


def test_hostile_frames_get_an_error_frame_and_the_socket_stays_usable(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        post_message(client, session_id, "first")
        wait_events(
            client, session_id, turns_finished(1), 20, lambda: live_stack.log_tail("worker")
        )
        before = (
            get_session(client, session_id),
            get_events(client, session_id),
            get_messages(client, session_id),
        )
        last_seq = before[1][-1]["seq"]
        offset = _log_size(live_stack)

        async def scenario():  # type: ignore[no-untyped-def]
            errors = []
            async with ws_connect(live_stack, session_id, key, after=last_seq) as ws:
                for raw, *_expected in HOSTILE_FRAMES:
                    await ws.send(raw)
                    errors.append(await recv_frame(ws, timeout=5))
                await expect_silence(ws, 1.0)
                after = await asyncio.to_thread(
                    lambda: (
                        get_session(client, session_id),
                        get_events(client, session_id),
                        get_messages(client, session_id),
                    )
                )
                # The same socket still takes a valid message, with a key at the limit.
                valid = {"type": "user_message", "content": "second", "idempotency_key": "k" * 200}
                await ws.send(json.dumps(valid))
                frames = await collect_until(ws, _turn_finished, timeout=20)
            return errors, after, frames

        errors, after, frames = asyncio.run(scenario())
        messages = get_messages(client, session_id)

    for (raw, code, kind, expected), error in zip(HOSTILE_FRAMES, errors, strict=True):
        assert error["type"] == "error" and error["seq"] is None, (raw[:80], error)
        assert error["session"] == session_id
        data = error["data"]
        assert data["code"] == code, (raw[:80], data)
        assert isinstance(data["message"], str) and data["message"], data
        if kind == "field":
            assert expected in data["details"], (raw[:80], data)
            assert data["message"].startswith(f"{expected}: "), data
        elif kind is not None:
            assert data["details"][kind] == expected, (raw[:80], data)
    assert after == before
    completed = [f["data"]["content"] for f in frames if f["type"] == "message.completed"]
    assert completed == ["second", "Echo: second"]
    assert messages[-2]["idempotency_key"] == "k" * 200
    _assert_no_traceback(live_stack, offset)


async def _frames_until_closed(ws, timeout: float = 5) -> tuple[list[dict], int | None]:  # type: ignore[no-untyped-def]
    frames = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                frames.append(json.loads(await ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None


def test_frames_on_a_refused_socket_are_ignored(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    other_key = api_key_for("mallory")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
    offset = _log_size(live_stack)
    frames_to_send = [
        json.dumps({"type": "user_message", "content": "let me in"}),
        json.dumps({"type": "interrupt"}),
        "not json",
    ]

    async def refused(**kwargs):  # type: ignore[no-untyped-def]
        async with ws_connect(live_stack, session_id, **kwargs) as ws:
            # Sent at once, while the server still checks the key: they arrive
            # on a socket whose authorisation fails.
            for raw in frames_to_send * 3:
                try:
                    await ws.send(raw)
                except ConnectionClosed:
                    break
            return await _frames_until_closed(ws)

    async def scenario():  # type: ignore[no-untyped-def]
        return {
            "no key": await refused(),
            "wrong key": await refused(key="not-a-real-key"),
            "other owner": await refused(key=other_key),
            "bad after": await refused(key=key, after="abc"),
        }

    results = asyncio.run(scenario())
    expected = {
        "no key": ("not_authenticated", 4401),
        "wrong key": ("not_authenticated", 4401),
        "other owner": ("not_found", 4404),
        "bad after": ("invalid_input", 4400),
    }
    for name, (code, close_code) in expected.items():
        frames, closed = results[name]
        assert closed == close_code, (name, frames, closed)
        # One error for the refusal, none for the frames sent after it.
        assert [f["data"]["code"] for f in frames] == [code], (name, frames)
    with api(live_stack, key) as client:
        assert get_messages(client, session_id) == []
        assert get_events(client, session_id) == []
    _assert_no_traceback(live_stack, offset)


@pytest.mark.parametrize(
    "path",
    [
        "/ws/foo/",
        "/ws/sessions/not-a-uuid/",
        "/ws/sessions/{upper}/",
        "/ws/sessions/{id}/extra/",
        "/ws/sessions/{id}",
        "/",
    ],
)
def test_an_unknown_websocket_path_is_closed_with_4404(live_stack, path):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
    url = live_stack.ws + path.format(upper=session_id.upper(), id=session_id)
    offset = _log_size(live_stack)

    async def scenario():  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Bearer {key}"}
        async with websockets.connect(url, additional_headers=headers, open_timeout=10) as ws:
            # If the server was quicker, its frames are still buffered for recv().
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps({"type": "user_message", "content": "hello?"}))
            return await _frames_until_closed(ws)

    frames, closed = asyncio.run(scenario())
    assert closed == 4404, (frames, closed)
    assert len(frames) == 1 and frames[0]["type"] == "error", frames
    assert frames[0]["data"]["code"] == "not_found"
    assert set(frames[0]) == {"seq", "type", "session", "ts", "data"}
    with api(live_stack, key) as client:
        assert get_messages(client, session_id) == []
    _assert_no_traceback(live_stack, offset)


# REST through daphne ----------------------------------------------------------------------


def _assert_error_shape(response: httpx.Response, status: int, code: str) -> dict:  # type: ignore[type-arg]
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == code, error
    return dict(error)


def test_hostile_bodies_through_daphne(live_stack):
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("alice")
    offset = _log_size(live_stack)
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        url = f"/api/v1/sessions/{session_id}/messages/"
        deep = b"[" * 100_000 + b"]" * 100_000
        json_type = {"Content-Type": "application/json"}
        _assert_error_shape(client.post(url, content=deep, headers=json_type), 400, "invalid_input")
        _assert_error_shape(
            client.post("/api/v1/sessions/", content=deep, headers=json_type), 400, "invalid_input"
        )
        _assert_error_shape(
            client.post(url, json={"content": "x" * 3_000_000}), 413, "payload_too_large"
        )
        _assert_error_shape(
            client.post(url, content=b'{"content": "\\ud800"}', headers=json_type),
            400,
            "invalid_input",
        )
        metadata = b'{"agent": "echo", "metadata": {"n": 1e400}}'
        _assert_error_shape(
            client.post("/api/v1/sessions/", content=metadata, headers=json_type),
            400,
            "invalid_input",
        )
        # A well-formed multipart body reaches the application: 415 in the error shape.
        _assert_error_shape(
            client.post(url, data={"content": "hi"}, files={"f": ("a.txt", b"x")}),
            415,
            "unsupported_media_type",
        )
        # Twisted (under daphne) answers these itself, before the application
        # sees a request, with an empty 400: a multipart body it cannot parse and
        # more than 500 headers. Not a 500, and the server keeps serving.
        bad_multipart = client.post(
            url, content=b"garbage", headers={"Content-Type": "multipart/form-data"}
        )
        assert bad_multipart.status_code == 400
        many_headers = {f"X-Header-{i}": "v" for i in range(2000)}
        assert (
            client.get(f"/api/v1/sessions/{session_id}/", headers=many_headers).status_code == 400
        )
        assert get_messages(client, session_id) == []
        assert get_events(client, session_id) == []
        assert client.get("/api/v1/sessions/").json()[0]["metadata"] == {}
        assert len(client.get("/api/v1/sessions/").json()) == 1
    _assert_no_traceback(live_stack, offset)

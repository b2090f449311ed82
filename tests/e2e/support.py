"""Helpers shared by the end-to-end tests: REST and websocket clients against a live stack.

Tests stay synchronous (the ORM and pytest-django's flush are sync) and run
their websocket scenarios with `asyncio.run`.
"""

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import websockets

from record.models import ModelEndpoint
from tests.stack import Stack

Frame = dict[str, Any]
FRAME_KEYS = {"seq", "type", "session", "ts", "data"}


def api(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.http, headers={"Authorization": f"Bearer {key}"}, timeout=15)


def async_api(stack: Stack, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack.http, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def create_session(client: httpx.Client, agent: str) -> str:
    response = client.post("/api/v1/sessions/", json={"agent": agent})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def post_message(client: httpx.Client, session_id: str, content: str) -> dict[str, Any]:
    response = client.post(f"/api/v1/sessions/{session_id}/messages/", json={"content": content})
    assert response.status_code == 202, response.text
    return dict(response.json())


def get_events(client: httpx.Client, session_id: str, after: int = 0) -> list[Frame]:
    events: list[Frame] = []
    while True:
        response = client.get(
            f"/api/v1/sessions/{session_id}/events/", params={"after": after, "limit": 1000}
        )
        assert response.status_code == 200, response.text
        page = response.json()
        events += page
        if "next" not in response.links:  # a page may end early by size
            return events
        after = page[-1]["seq"]


def get_messages(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/sessions/{session_id}/messages/", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return list(response.json())


def get_session(client: httpx.Client, session_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/sessions/{session_id}/")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_events(
    client: httpx.Client,
    session_id: str,
    done: Callable[[list[Frame]], bool],
    timeout: float,
    describe: Callable[[], str] = lambda: "",
) -> list[Frame]:
    """Poll the persisted events until `done(events)` holds."""
    deadline = time.monotonic() + timeout
    events: list[Frame] = []
    while time.monotonic() < deadline:
        events = get_events(client, session_id)
        if done(events):
            return events
        time.sleep(0.1)
    types = [(e["seq"], e["type"]) for e in events]
    raise AssertionError(f"timed out after {timeout} s; events so far: {types}\n{describe()}")


def turns_finished(count: int) -> Callable[[list[Frame]], bool]:
    return lambda events: sum(e["type"] == "turn.finished" for e in events) >= count


def set_model_options(name: str, **options: Any) -> None:
    """Slow a model endpoint down (`latency_s`, `chunk_delay_s`); workers read it per call."""
    endpoint = ModelEndpoint.objects.get(name=name)
    endpoint.options = {**(endpoint.options or {}), **options}
    endpoint.save(update_fields=["options"])


def comparable(frame: Frame) -> tuple[Any, ...]:
    """What a streamed frame and its persisted row must agree on."""
    return (
        frame["seq"],
        frame["type"],
        frame["session"],
        datetime.fromisoformat(frame["ts"]),
        frame["data"],
    )


def persisted(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f["seq"] is not None]


def ws_url(
    stack: Stack, session_id: str, after: int | str | None = None, token: str | None = None
) -> str:
    params = []
    if after is not None:
        params.append(f"after={after}")
    if token is not None:
        params.append(f"token={token}")
    query = ("?" + "&".join(params)) if params else ""
    return f"{stack.ws}/ws/sessions/{session_id}/{query}"


def ws_connect(
    stack: Stack,
    session_id: str,
    key: str | None = None,
    *,
    after: int | str | None = None,
    token: str | None = None,
    origin: str | None = None,
    **kwargs: Any,
) -> websockets.connect:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return websockets.connect(
        ws_url(stack, session_id, after, token),
        additional_headers=headers,
        origin=origin,  # type: ignore[arg-type]
        open_timeout=10,
        **kwargs,
    )


async def recv_frame(ws: Any, timeout: float = 15) -> Frame:
    raw = await asyncio.wait_for(ws.recv(), timeout)
    frame = json.loads(raw)
    assert isinstance(frame, dict) and set(frame) == FRAME_KEYS, f"malformed frame: {raw!r}"
    return frame


async def collect_until(
    ws: Any,
    done: Callable[[Frame, list[Frame]], bool],
    timeout: float = 30,
    describe: Callable[[], str] = lambda: "",
) -> list[Frame]:
    """Receive frames until `done(last_frame, frames)` holds; `describe()` adds context on timeout."""
    frames: list[Frame] = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                frames.append(await recv_frame(ws, timeout))
                if done(frames[-1], frames):
                    return frames
    except TimeoutError:
        summary = [(f["seq"], f["type"]) for f in frames]
        raise AssertionError(
            f"no end after {timeout} s; frames so far: {summary}\n{describe()}"
        ) from None


def stack_logs(stack: Stack, *names: str, lines: int = 30) -> Callable[[], str]:
    """For failure messages: the last lines of some of the stack's process logs."""
    names = names or ("worker", "web")
    return lambda: "\n".join(f"--- {n}\n{stack.log_tail(n, lines)}" for n in names)


def until_turns_finished(count: int) -> Callable[[Frame, list[Frame]], bool]:
    return lambda _last, frames: sum(f["type"] == "turn.finished" for f in frames) >= count


async def expect_silence(ws: Any, seconds: float) -> None:
    """Nothing arrives for `seconds` (the socket stays open)."""
    try:
        raw = await asyncio.wait_for(ws.recv(), seconds)
    except TimeoutError:
        return
    raise AssertionError(f"expected no frame, got {raw!r}")


def assert_seq_strictly_increasing(frames: list[Frame]) -> None:
    seqs = [f["seq"] for f in persisted(frames)]
    assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False)), f"seq not increasing: {seqs}"

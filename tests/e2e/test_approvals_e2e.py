"""Approvals on the live stack: a gated call waits, an approver decides over REST, the run goes on;
the approvers' websocket sees it; concurrent approvers get one outcome; restarts lose nothing."""

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
import websockets

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from record.models import Session, ToolCall
from tests.e2e.support import (
    api,
    async_api,
    create_session,
    post_message,
    turns_finished,
    wait_events,
)
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _agent() -> str:
    """A rules agent whose `stamp` tool (a built-in every process has) needs approval."""
    ToolFactory(
        name="stamp",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {}},
    )
    slug = f"approving-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp"],
        rules=[
            {"when": {"last_tool": "stamp", "result": '"status":"rejected"'}, "answer": "Refused: {{ result.error }}"},
            {"when": {"last_tool": "stamp"}, "answer": "Stamped at {{ tools.stamp.now }}"},
            {"when": {"user": "stamp (\\w+)", "last_tool": None},
             "tool_calls": [{"tool": "stamp", "args": {}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def _approver(name: str) -> str:
    raw = api_key_create(username=name, roles=[]).raw
    approver_grant(username=name)
    return raw


def _wait_state(
    client: httpx.Client, session_id: str, state: str, timeout: float, stack: Stack
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(f"/api/v1/sessions/{session_id}/").json()["state"] == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"session never reached {state}:\n{stack.log_tail('worker')}")


async def _approver_frames(
    stack: Stack, key: str, count: int, opened: asyncio.Event
) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    async with websockets.connect(
        f"{stack.ws}/ws/approvals/",
        additional_headers={"Authorization": f"Bearer {key}"},
        open_timeout=10,
    ) as ws:
        opened.set()
        while len(frames) < count:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
    return frames


def test_a_gated_call_waits_then_runs_once_after_a_rest_approval_and_the_approvers_socket_sees_it(
    live_stack: Stack,
):
    slug = _agent()
    customer = api_key_for("carol")
    approver = _approver("alice")

    async def scenario() -> tuple[str, list[dict[str, Any]]]:
        opened = asyncio.Event()
        watcher = asyncio.ensure_future(_approver_frames(live_stack, approver, 2, opened))
        await asyncio.wait_for(opened.wait(), 10)
        with api(live_stack, customer) as client:
            session_id = create_session(client, slug)
            post_message(client, session_id, "stamp R1")
            await asyncio.to_thread(
                _wait_state, client, session_id, "awaiting_approval", 20, live_stack
            )
        status = await asyncio.to_thread(
            lambda: ToolCall.objects.values_list("status", flat=True).get(session_id=session_id)
        )
        assert status == "executing"  # not run
        async with async_api(live_stack, approver) as aclient:
            [row] = (await aclient.get("/api/v1/approvals/", params={"status": "pending"})).json()
            assert row["session"] == session_id and row["tool"] == "stamp"
            approved = await aclient.post(
                f"/api/v1/approvals/{row['id']}/approve/", json={"comment": "fine"}
            )
            assert approved.status_code == 200, approved.text
        return session_id, await watcher

    session_id, frames = asyncio.run(scenario())
    assert [f["type"] for f in frames] == ["approval.requested", "approval.resolved"]
    assert frames[1]["data"]["outcome"] == "approved" and frames[1]["data"]["by"] == "alice"
    with api(live_stack, customer) as client:
        events = wait_events(
            client, session_id, turns_finished(1), 20, lambda: live_stack.log_tail("worker")
        )
        # The customer's key is no approver's.
        assert client.get("/api/v1/approvals/").status_code == 403
    types = [e["type"] for e in events]
    assert (
        types.index("approval.requested")
        < types.index("approval.resolved")
        < types.index("turn.finished")
    )
    assert events[-1]["data"]["stop_reason"] == "answer"
    call = ToolCall.objects.get(session_id=session_id)
    assert call.status == "success" and call.attempts == 1


def test_concurrent_approvers_over_http_get_exactly_one_outcome(live_stack: Stack):
    slug = _agent()
    customer = api_key_for("carol")
    keys = [_approver(f"approver{i}") for i in range(4)]
    with api(live_stack, customer) as client:
        session_id = create_session(client, slug)
        post_message(client, session_id, "stamp R2")
        _wait_state(client, session_id, "awaiting_approval", 20, live_stack)
    approval = Approval.objects.get(session_id=session_id)

    async def race() -> list[httpx.Response]:
        clients = [async_api(live_stack, k) for k in keys]
        try:
            return list(
                await asyncio.gather(
                    *(
                        c.post(
                            f"/api/v1/approvals/{approval.pk}/{'approve' if i % 2 else 'reject'}/",
                            json={"comment": f"#{i}"},
                        )
                        for i, c in enumerate(clients)
                    )
                )
            )
        finally:
            for c in clients:
                await c.aclose()

    responses = asyncio.run(race())
    assert sorted(r.status_code for r in responses) == [200, 409, 409, 409], [
        r.text for r in responses
    ]
    with api(live_stack, customer) as client:
        wait_events(
            client, session_id, turns_finished(1), 20, lambda: live_stack.log_tail("worker")
        )
    approval.refresh_from_db()
    call = ToolCall.objects.get(session_id=session_id)
    assert call.status == ("success" if approval.status == "approved" else "rejected")


def test_pending_approvals_survive_a_restart_of_every_process(live_stack: Stack):
    slug = _agent()
    customer = api_key_for("carol")
    approver = _approver("alice")
    session_ids = []
    with api(live_stack, customer) as client:
        for ref in ("A", "B", "C"):
            session_id = create_session(client, slug)
            post_message(client, session_id, f"stamp {ref}")
            session_ids.append(session_id)
        for session_id in session_ids:
            _wait_state(client, session_id, "awaiting_approval", 20, live_stack)

    names = ["web", "worker", "beat"]
    for name in names:
        live_stack.stop(name)
    try:
        assert Approval.objects.filter(session_id__in=session_ids, status="pending").count() == 3
        assert set(Session.objects.filter(pk__in=session_ids).values_list("state", flat=True)) == {
            "awaiting_approval"
        }
    finally:
        for name in names:
            live_stack.restart(name)
        live_stack.wait_ready(60)

    with api(live_stack, approver) as client:
        pending = client.get(
            "/api/v1/approvals/", params={"status": "pending", "limit": 1000}
        ).json()
        ours = [row for row in pending if row["session"] in session_ids]
        assert len(ours) == 3
        for row in ours:
            assert (
                client.post(f"/api/v1/approvals/{row['id']}/approve/", json={}).status_code == 200
            )
    with api(live_stack, customer) as client:
        for session_id in session_ids:
            events = wait_events(
                client, session_id, turns_finished(1), 30, lambda: live_stack.log_tail("worker")
            )
            assert events[-1]["data"]["stop_reason"] == "answer"
    assert (
        list(ToolCall.objects.filter(session_id__in=session_ids).values_list("status", flat=True))
        == ["success"] * 3
    )

"""Approval webhooks on a stack of real processes: every decision is delivered exactly once,
whichever process made it.

A decision over REST and one in the admin's queue (a logged-in staff approver's POST)
are made in the web processes; an expiry by the sweeper (beat -> worker). Each
approval's `approval.requested` frame comes from the worker that ran the step. The
receiver is a real HTTP server on 127.0.0.1 that counts what arrives. Before tasks
were sent by name (runtime/tasks.py), the web processes had no `webhook_send`
registered and the REST and admin decisions were never delivered.
"""

import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model

from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from tests.e2e.support import api, create_session, post_message
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    ToolFactory,
    api_key_for,
    permissions,
)
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "queue-approver-pw-for-tests"
QUEUE = "/admin/approvals/approval/queue/"


class _Receiver(BaseHTTPRequestHandler):
    deliveries: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.deliveries.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def hooked_stack(django_db_setup, django_db_blocker) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    """A stack of its own whose every process has APPROVAL_WEBHOOK_URL set (the shared
    live stack has none), on a queue of its own."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "APPROVAL_WEBHOOK_URL": f"http://127.0.0.1:{server.server_address[1]}/hook",
        "CELERY_QUEUE": f"agentplatform-hooks-{os.getpid()}",
    }
    try:
        with django_db_blocker.unblock(), running_stack(extra_env=env, ready_timeout=120) as stack:
            yield stack
    finally:
        server.shutdown()
        server.server_close()


def _agent() -> str:
    """`stamp` waits for an approver (10 min); `soon` expires after 1 s (then rejected)."""
    for name, timeout in (("stamp", 600), ("soon", 1)):
        ToolFactory(
            name=name,
            handler="builtin.current_time",
            side_effects=True,
            requires_approval=True,
            approval_timeout_s=timeout,
            parameters={"type": "object", "properties": {}},
        )
    slug = f"hooked-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp", "soon"],
        rules=[
            {"when": {"last_tool": "stamp"}, "answer": "done"},
            {"when": {"last_tool": "soon"}, "answer": "done"},
            {"when": {"user": "^stamp", "last_tool": None}, "tool_calls": [{"tool": "stamp", "args": {}}]},
            {"when": {"user": "^soon", "last_tool": None}, "tool_calls": [{"tool": "soon", "args": {}}]},
            {"answer": "?"},
        ],
    )  # fmt: skip
    return slug


def _pending_approval(client: httpx.Client, slug: str, text: str, stack: Stack) -> Approval:
    session_id = create_session(client, slug)
    post_message(client, session_id, text)
    deadline = time.monotonic() + 30
    while (approval := Approval.objects.filter(session_id=session_id).first()) is None:
        assert time.monotonic() < deadline, stack.log_tail("worker")
        time.sleep(0.1)
    return approval


def _csrf(page: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found, page[:2000]
    return found.group(1)


def _admin_login(client: httpx.Client, username: str) -> None:
    """Log a browser-like client (cookies, the CSRF token of each form) in to the admin."""
    login = client.get("/admin/login/", params={"next": QUEUE})
    answer = client.post(
        "/admin/login/",
        data={
            "username": username,
            "password": PASSWORD,
            "next": QUEUE,
            "csrfmiddlewaretoken": _csrf(login.text),
        },
    )
    assert answer.status_code == 302 and answer.headers["location"] == QUEUE, answer.text[:2000]


def _deliveries_of(ids: set[str]) -> list[tuple[str, str]]:
    with _Receiver.lock:
        return [
            (d["type"], d["data"]["id"]) for d in _Receiver.deliveries if d["data"]["id"] in ids
        ]


def test_every_decision_is_delivered_once_from_rest_the_admin_queue_and_expiry(
    hooked_stack: Stack,
):
    slug = _agent()
    customer = api_key_for("carol")
    rest_approver = api_key_create(username="alice", roles=[]).raw
    approver_grant(username="alice")
    queue_approver = get_user_model().objects.create_user("bob", password=PASSWORD, is_staff=True)
    queue_approver.user_permissions.add(*permissions("approvals.decide_approval"))
    approver_grant(username="bob")

    with api(hooked_stack, customer) as client:
        by_rest = _pending_approval(client, slug, "stamp over REST", hooked_stack)
        by_queue = _pending_approval(client, slug, "stamp in the queue", hooked_stack)
        by_expiry = _pending_approval(client, slug, "soon expires", hooked_stack)

    # 1. REST, in a web process.
    with api(hooked_stack, rest_approver) as client:
        decided = client.post(f"/api/v1/approvals/{by_rest.pk}/approve/", json={"comment": "ok"})
        assert decided.status_code == 200, decided.text
    # 2. The admin's queue, in a web process: a staff approver's form POST.
    with httpx.Client(base_url=hooked_stack.http, timeout=15) as browser:
        _admin_login(browser, "bob")
        page = browser.get(QUEUE)
        assert page.status_code == 200 and str(by_queue.pk) in page.text
        posted = browser.post(
            QUEUE,
            data={
                "id": str(by_queue.pk),
                "action": "reject",
                "comment": "not this one",
                "csrfmiddlewaretoken": _csrf(page.text),
            },
        )
        assert posted.status_code == 302, posted.text[:2000]
    # 3. The deadline, by the sweeper (beat schedules it, a worker runs it).
    deadline = time.monotonic() + 30
    while Approval.objects.get(pk=by_expiry.pk).status == "pending":
        assert time.monotonic() < deadline, hooked_stack.log_tail("beat")
        time.sleep(0.2)

    outcomes = {
        str(a.pk): (a.status, a.decided_by_name)
        for a in Approval.objects.filter(pk__in=[by_rest.pk, by_queue.pk, by_expiry.pk])
    }
    assert outcomes == {
        str(by_rest.pk): ("approved", "alice"),
        str(by_queue.pk): ("rejected", "bob"),
        str(by_expiry.pk): ("expired", "system"),
    }
    ids = set(outcomes)
    expected = Counter(
        {(kind, i): 1 for kind in ("approval.requested", "approval.resolved") for i in ids}
    )
    deadline = time.monotonic() + 30
    while Counter(_deliveries_of(ids)) != expected:
        assert time.monotonic() < deadline, (
            Counter(_deliveries_of(ids)),
            hooked_stack.log_tail("web"),
            hooked_stack.log_tail("worker"),
        )
        time.sleep(0.2)
    time.sleep(2)  # and nothing more: no delivery twice
    assert Counter(_deliveries_of(ids)) == expected
    with _Receiver.lock:
        resolved = {
            d["data"]["id"]: (d["data"]["outcome"], d["data"]["by"])
            for d in _Receiver.deliveries
            if d["type"] == "approval.resolved" and d["data"]["id"] in ids
        }
    assert resolved == {
        str(by_rest.pk): ("approved", "alice"),
        str(by_queue.pk): ("rejected", "bob"),
        str(by_expiry.pk): ("expired", "system"),
    }

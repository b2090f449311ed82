"""Schedules and run webhooks on a stack of real processes (web, worker, beat).

A schedule whose due time passes while the worker and beat are down fires once when they
come back, even with a second beat looking at it too (the key per schedule and due time is
in the database). A run webhook reaches a real receiver on 127.0.0.1, signed; a worker
killed while its delivery hangs in the receiver leaves a claim that runs out, and another
worker sends the same turn again with the same Idempotency-Key: the receiver, which keys
what it processes by that header as the docs tell it to, processes the turn once.
"""

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from agentplatform_client import Client
from django.utils import timezone

from accounts.services import api_key_create
from configuration.services import config_apply
from hooks.models import Schedule, ScheduleFire, WebhookDelivery
from record.models import Session
from runtime.webhooks import signature_valid
from tests.factories import AgentFactory, ModelEndpointFactory
from tests.stack import Stack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECRET = "e2e-run-webhook-secret"


@dataclass
class Arrival:
    body: bytes
    key: str
    signature: str


@dataclass
class Receiver:
    url: str = ""
    arrivals: list[Arrival] = field(default_factory=list)
    # What the app did once per Idempotency-Key (a redelivery of a key is answered, not redone).
    processed: dict[str, dict[str, Any]] = field(default_factory=dict)
    hang: threading.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


RECEIVER = Receiver()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        key = self.headers.get("Idempotency-Key", "")
        with RECEIVER.lock:
            RECEIVER.arrivals.append(Arrival(body, key, self.headers.get("X-Run-Signature", "")))
            hang, RECEIVER.hang = RECEIVER.hang, None
        if hang is not None:
            hang.wait(60)  # the sender is killed meanwhile: this request never completes
            return
        if not signature_valid(SECRET, body, self.headers.get("X-Run-Signature", "")):
            self.send_response(401)
            self.end_headers()
            return
        with RECEIVER.lock:
            RECEIVER.processed.setdefault(key, json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def hooks_stack(django_db_setup, django_db_blocker) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    RECEIVER.url = f"http://127.0.0.1:{server.server_address[1]}/runs"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        "RUN_WEBHOOK_SECRET": SECRET,
        # A killed sender's claim runs out after 2 x 2 + 5 s.
        "RUN_WEBHOOK_TIMEOUT_S": "2",
        "RUN_WEBHOOK_SWEEP_S": "0.5",
        "SCHEDULES_TICK_S": "0.5",
        "CELERY_QUEUE": f"agentplatform-schedhooks-{os.getpid()}",
    }
    try:
        with django_db_blocker.unblock(), running_stack(extra_env=env, ready_timeout=120) as stack:
            yield stack
    finally:
        server.shutdown()
        server.server_close()


def _wait(what: str, check: Any, stack: Stack, timeout: float = 60, *logs: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}\n" + "\n".join(
            stack.log_tail(name) for name in logs or ("worker", "beat")
        )
        time.sleep(0.2)
    return found


FLOW = {
    "slug": "nightly-e2e",
    "name": "Nightly",
    "role": "ops",
    "input": {"type": "object", "properties": {"days": {"type": "integer"}}},
    "start": "look",
    "result": "now",
    "nodes": {
        "look": {"kind": "tool", "tool": "clock", "args": {}, "output": "now", "next": "end"}
    },
}


def _config(schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {
        "roles": [{"name": "ops"}],
        "models": [{"name": "rules", "api": "rules"}],
        "tools": [
            {
                "name": "clock",
                "description": "The current date and time in UTC. Use when the user asks what "
                "time or day it is; do not use it for other time zones.",
                "result_description": "The time as {now: ISO 8601 timestamp}.",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
                "roles": ["ops"],
            }
        ],
        "workflows": [FLOW],
    }
    if schedule is not None:
        document["schedules"] = [schedule]
    return document


def test_a_due_time_passed_while_everything_was_down_fires_once_after_restart(
    hooks_stack: Stack,
):
    api_key_create(username="ops-e2e", roles=["ops"])
    name = f"every-minute-{uuid.uuid4().hex[:6]}"
    # Everything that fires schedules is down before the schedule exists.
    hooks_stack.stop("worker")
    hooks_stack.stop("beat")
    config_apply(
        document=_config(
            {
                "name": name,
                "cron": "* * * * *",
                "timezone": "Europe/Berlin",
                "workflow": "nightly-e2e",
                "input": {"days": 1},
                "owner": "ops-e2e",
                "overlap": "skip",
            }
        )
    )
    schedule = Schedule.objects.get(name=name)
    assert schedule.next_due_at is not None and schedule.next_due_at > timezone.now()
    # The due time passed while no process could fire it: the cron's previous minute, set
    # back by hand (waiting for the next minute to pass cost the test 30 s on average, and
    # up to 60 s).
    due = schedule.next_due_at - timedelta(minutes=1)
    assert due < timezone.now()
    Schedule.objects.filter(pk=schedule.pk).update(next_due_at=due)
    assert not Session.objects.filter(metadata__schedule=name).exists()

    argv, extra = hooks_stack.commands["beat"]
    hooks_stack.restart("worker")
    hooks_stack.restart("beat")
    # A second beat (a mistaken deployment) ticks the same schedules: still once.
    at = argv.index("--schedule") + 1
    second = [*argv[:at], argv[at] + "-second", *argv[at + 1 :]]
    hooks_stack.start("beat-2", second, extra)
    try:
        hooks_stack.wait_worker_ready("worker")
        run = _wait(
            "the missed due time never fired",
            lambda: Session.objects.filter(
                metadata__schedule=name, metadata__due=due.isoformat()
            ).first(),
            hooks_stack,
        )
        _wait(
            "the scheduled run never ended",
            lambda: Session.objects.get(pk=run.pk).state in ("idle", "finished"),
            hooks_stack,
        )
        # Several ticks of both beats later, that due time has still fired once.
        time.sleep(3)
    finally:
        Schedule.objects.filter(name=name).update(enabled=False)
        hooks_stack.stop("beat-2")
    assert (
        Session.objects.filter(metadata__schedule=name, metadata__due=due.isoformat()).count() == 1
    )
    [fire] = ScheduleFire.objects.filter(schedule__name=name, due=due)
    assert (fire.status, fire.session_id) == ("started", run.pk)
    assert Schedule.objects.get(name=name).next_due_at > due


def test_a_workflow_run_started_by_the_client_with_a_webhook_posts_its_result_signed(
    hooks_stack: Stack,
):
    config_apply(document=_config())
    key = api_key_create(username="ops-client", roles=["ops"]).raw
    with Client(hooks_stack.http, api_key=key) as client:
        run = client.start_workflow("nightly-e2e", {"days": 2}, webhook=RECEIVER.url)
        ended = client.wait_for_run(run, timeout=60)
    assert ended.error is None
    idempotency_key = f"{run.id}:1"
    body = _wait(
        "the run's webhook never arrived",
        lambda: RECEIVER.processed.get(idempotency_key),
        hooks_stack,
    )
    assert body["session"] == str(run.id) and body["turn"] == 1 and body["outcome"] == "ok"
    assert body["result"] == ended.result and set(body["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cost",
    }
    [arrival] = [a for a in RECEIVER.arrivals if a.key == idempotency_key]
    assert signature_valid(SECRET, arrival.body, arrival.signature)
    assert not signature_valid("not-the-secret", arrival.body, arrival.signature)


def test_a_webhook_is_processed_once_after_its_worker_is_killed_mid_delivery(
    hooks_stack: Stack,
):
    agent = AgentFactory(model=ModelEndpointFactory(name="rules", api="rules", options={}))
    key = api_key_create(username="hooked", roles=[]).raw
    RECEIVER.hang = threading.Event()
    hang = RECEIVER.hang
    with httpx.Client(base_url=hooks_stack.http, timeout=15) as http:
        http.headers["Authorization"] = f"Bearer {key}"
        created = http.post(
            "/api/v1/sessions/", json={"agent": agent.slug, "webhook": {"url": RECEIVER.url}}
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        posted = http.post(f"/api/v1/sessions/{session_id}/messages/", json={"content": "hello"})
        assert posted.status_code == 202, posted.text
    idempotency_key = f"{session_id}:1"
    # The worker's POST is in the receiver, unanswered: kill the worker there.
    _wait(
        "the delivery never reached the receiver",
        lambda: any(a.key == idempotency_key for a in RECEIVER.arrivals),
        hooks_stack,
    )
    hooks_stack.stop("worker", signal.SIGKILL)
    hang.set()
    row = WebhookDelivery.objects.get(session_id=session_id, turn=1)
    assert (row.status, row.attempts) == ("pending", 1) and row.claimed_until is not None

    hooks_stack.restart("worker")
    hooks_stack.wait_worker_ready("worker")
    _wait(
        "the delivery was never sent again",
        lambda: WebhookDelivery.objects.get(pk=row.pk).status == "sent",
        hooks_stack,
        timeout=90,
    )
    time.sleep(2)  # a few sweeps later: nothing more arrives
    arrivals = [a for a in RECEIVER.arrivals if a.key == idempotency_key]
    assert len(arrivals) == 2 and arrivals[0].body == arrivals[1].body
    assert idempotency_key in RECEIVER.processed
    assert RECEIVER.processed[idempotency_key]["answer"] == "Echo: hello"
    sent = WebhookDelivery.objects.get(pk=row.pk)
    assert (sent.attempts, sent.last_error) == (2, "")
    assert sent.sent_at is not None

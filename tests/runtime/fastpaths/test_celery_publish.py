"""runtime.fastpaths.celery_publish: the message it puts on the queue is the one Celery's
`send_task` puts there (a worker cannot tell them apart); off, `task_send` uses send_task."""

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings

from runtime import tasks
from runtime.fastpaths import celery_publish

# What differs between two messages of the same task: their ids, and the delivery tag.
PER_MESSAGE = {"id", "root_id", "correlation_id", "delivery_tag"}


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"test-publish-{uuid.uuid4().hex}"
    yield name
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*client.keys(f"{name}*") or [name])
    client.close()


def _taken(queue: str, priority: int) -> dict[str, Any]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        raw = client.rpop(f"{queue}\x06\x16{priority}" if priority else queue)
    finally:
        client.close()
    assert raw is not None, "no message on the queue's list for that priority"
    message: dict[str, Any] = json.loads(raw)
    return message


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its per-message ids blanked (the same task, sent twice)."""
    return {
        **message,
        "headers": {k: ("-" if k in PER_MESSAGE else v) for k, v in message["headers"].items()},
        "properties": {
            k: ("-" if k in PER_MESSAGE else v) for k, v in message["properties"].items()
        },
    }


@pytest.mark.parametrize("priority", [0, 5, 9])
def test_the_message_is_the_one_send_task_writes(queue: str, priority: int) -> None:
    args = ("3f1c2a5e-0000-4000-8000-000000000001",)
    headers = {"traceparent": "00-abc-def-01"}
    current_app.send_task(
        "sessions.tasks.run_session", args=args, priority=priority, headers=headers, queue=queue
    )
    celerys = _taken(queue, priority)
    celery_publish.publish(
        current_app,
        "sessions.tasks.run_session",
        args,
        priority=priority,
        headers=headers,
        queue=queue,
    )
    ours = _taken(queue, priority)
    assert _comparable(ours) == _comparable(celerys)
    assert (
        ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]
    )
    assert ours["headers"]["id"] != celerys["headers"]["id"]


def test_task_send_takes_the_fast_path_when_it_covers_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(celery_publish, "publish", lambda *a, **kw: sent.append(a))
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: pytest.fail("send_task used"))
    tasks.task_send("sessions.tasks.run_session", ("s-1",), priority=5)
    assert [a[1:] for a in sent] == [("sessions.tasks.run_session", ("s-1",))]


def test_off_or_with_a_countdown_task_send_uses_send_task(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    used: list[str] = []
    monkeypatch.setattr(celery_publish, "publish", lambda *a, **kw: used.append("fast"))
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: used.append("celery"))
    tasks.task_send("sessions.tasks.run_session", ("s-1",), countdown=3)
    settings.FAST_PATHS = False
    tasks.task_send("sessions.tasks.run_session", ("s-1",))
    assert used == ["celery", "celery"]


def test_a_broken_connection_is_replaced_and_the_message_still_sent(queue: str) -> None:
    """Redis restarted under the kept connection: one new connection, the message goes out."""
    celery_publish.publish(current_app, "sessions.tasks.run_session", ("s-1",), queue=queue)
    _taken(queue, 0)
    broken = celery_publish._kept.channel

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise redis.exceptions.ConnectionError("Connection closed by server.")

    broken.basic_publish = refused
    celery_publish.publish(current_app, "sessions.tasks.run_session", ("s-2",), queue=queue)

    assert json.loads(base64.b64decode(_taken(queue, 0)["body"]))[0] == ["s-2"]
    assert celery_publish._kept.channel is not broken

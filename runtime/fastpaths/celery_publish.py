"""A task message published on a kept kombu channel, without Celery's `send_task`.

Every posted message enqueues its session's run. Celery's `send_task` spends
most of its CPU around the publish rather than in it: routing the task name,
acquiring a producer from the pool, re-binding (deep-copying) the queue to
"maybe declare" it again on every message, the publish signals, the retry
policy's closures. Here the process keeps one broker connection and its channel
(publishes take turns under a lock: the web's come from one sender thread,
record/dispatch.py, and a lock is cheaper than a connection per thread) and writes the message Celery would write (protocol 2: the same
headers, properties and body) with the channel's `basic_publish`, which puts it
on the queue's list for its priority exactly as Celery's publish does. The
queue needs no declaring: the anonymous exchange routes by the queue's name,
and the workers declared it when they started.

It relies on Celery's message format (`AMQP.as_task_v2`) and kombu's virtual
channel (`prepare_message`, `basic_publish`, `connection_errors`); the versions
it was written for are in runtime/fastpaths/__init__.py. Off, or for a message
it does not cover (a countdown, a broker other than Redis, task routes), the
caller uses `send_task`.
"""

import contextlib
import json
import os
import socket
import threading
import uuid
from typing import Any

from runtime import fastpaths

# Celery's embed of a plain task: no callbacks, no chain, no chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class _Kept:
    """The process's one broker connection and channel for publishing (under `lock`: a
    kombu channel is not thread-safe, and a publish holds it ~0.1 ms)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connection: Any = None
        self.channel: Any = None


_kept = _Kept()


def _after_fork() -> None:
    # A forked child must not write to its parent's socket, nor wait on a lock a parent's
    # thread held at the fork.
    global _kept
    _kept = _Kept()


os.register_at_fork(after_in_child=_after_fork)
# The origin header Celery writes (`anon_nodename()`): "gen<pid>@<host>", by process.
_origin: tuple[int, str] | None = None


def _origin_header() -> str:
    global _origin
    pid = os.getpid()
    if _origin is None or _origin[0] != pid:
        _origin = (pid, f"gen{pid}@{socket.gethostname()}")
    return _origin[1]


def covers(app: Any) -> bool:
    """Whether this message can go this way: the fast path is on, the broker is Redis with
    no task routes, and no task is running in this thread (Celery would name it the
    message's parent)."""
    if not fastpaths.enabled("celery_publish") or app.current_worker_task is not None:
        return False
    known = _covered.get(id(app))
    if known is None or known[0] is not app:
        known = _covered[id(app)] = (app, _conf_fits(app))
    return known[1]


# The configuration's answer per app (the conf's lookups cost more than the check).
_covered: dict[int, tuple[Any, bool]] = {}


def _conf_fits(app: Any) -> bool:
    conf = app.conf
    url = str(conf.broker_url or "")
    options = conf.broker_transport_options or {}
    return (
        url.startswith(("redis://", "rediss://", "unix://"))
        and not conf.task_routes
        and not options.get("global_keyprefix")
        and conf.task_serializer == "json"
        and not conf.task_compression
    )


def message(
    name: str,
    args: tuple[Any, ...],
    *,
    priority: int | None,
    headers: dict[str, str] | None,
    reply_to: str,
) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """The body, headers and properties `send_task(name, args, priority=, headers=)` publishes."""
    task_id = str(uuid.uuid4())
    task_headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": "{}",
        "origin": _origin_header(),
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if headers:
        task_headers.update(headers)
    properties: dict[str, Any] = {
        "correlation_id": task_id,
        "reply_to": reply_to,
        "delivery_mode": 2,
    }
    if priority is not None:
        properties["priority"] = priority
    body = json.dumps([list(args), {}, _EMBED]).encode()
    return body, task_headers, properties


def _channel(kept: _Kept, app: Any) -> Any:
    if kept.channel is None:
        kept.connection = app.connection_for_write()
        kept.channel = kept.connection.default_channel
    return kept.channel


def _reset(kept: _Kept) -> None:
    connection, kept.connection, kept.channel = kept.connection, None, None
    if connection is not None:
        with contextlib.suppress(Exception):  # the connection is gone already
            connection.release()


def publish(
    app: Any,
    name: str,
    args: tuple[Any, ...],
    *,
    priority: int | None = None,
    headers: dict[str, str] | None = None,
    queue: str | None = None,
) -> None:
    """Publish task `name` on `queue` (the app's default queue); broker errors propagate.

    1. Build the message as Celery's protocol 2 does.
    2. Put it on the queue with the process's kept channel, one thread at a time.
    3. On a connection error, open a new connection and try once more (Celery's
       publish retries too); a second error propagates.
    """
    queue = queue or app.conf.task_default_queue
    body, task_headers, properties = message(
        name, args, priority=priority, headers=headers, reply_to=app.thread_oid
    )
    kept = _kept
    with kept.lock:
        for attempt in (1, 2):
            channel = _channel(kept, app)
            errors = (*kept.connection.connection_errors, *kept.connection.channel_errors)
            try:
                prepared = channel.prepare_message(
                    body,
                    properties.get("priority"),
                    "application/json",
                    "utf-8",
                    task_headers,
                    dict(properties),
                )
                channel.basic_publish(prepared, exchange="", routing_key=queue)
                return
            except errors:
                _reset(kept)
                if attempt == 2:
                    raise


def send(
    app: Any,
    name: str,
    args: tuple[Any, ...],
    *,
    priority: int | None = None,
    headers: dict[str, str] | None = None,
) -> bool:
    """Publish through the fast path if it covers this app; False: use `send_task`."""
    if not covers(app):
        return False
    publish(app, name, args, priority=priority, headers=headers)
    return True

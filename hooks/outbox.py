"""Run webhooks in the record: naming one (checked against the egress policy) and the
outbox row the turn's final commit writes (engine/store/commit.py holds the one hook).

On the record's floor: the store may import it, and it imports nothing above the record.
"""

import functools
import json
import logging
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from django.db import transaction

from record.errors import InvalidInput
from record.models import Message
from runtime import egress
from runtime.tasks import task_send

from .models import DeliveryStatus, RunWebhook, WebhookDelivery

logger = logging.getLogger(__name__)

URL_MAX_CHARS = 500


def webhook_url_check(value: Any, *, field: str) -> str:
    """The URL of a `webhook: {url}` object, or InvalidInput (400) naming `field`: not an
    http(s) URL, or one whose host the egress policy refuses (loopback, private, metadata...
    unless EGRESS_ALLOW lists it) or that does not resolve. The policy is checked again on
    every delivery, at the address it connects to: a name that resolves elsewhere later, or
    a redirect inward (never followed), still reaches nothing it refuses."""
    if not isinstance(value, dict) or set(value) != {"url"} or not isinstance(value["url"], str):
        raise InvalidInput(
            f"{field}: expected an object with one key, url", details={"field": field}
        )
    url = value["url"].strip()
    where = f"{field}.url"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > URL_MAX_CHARS:
        raise InvalidInput(
            f"{where}: expected an http or https URL of at most {URL_MAX_CHARS} characters",
            details={"field": where},
        )
    if parts.username or parts.password:
        raise InvalidInput(
            f"{where}: credentials in the URL are not accepted", details={"field": where}
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        egress.addresses(parts.hostname, port)
    except egress.EgressRefused as exc:
        raise InvalidInput(
            f"{where}: {exc}", details={"field": where}, code="egress_refused"
        ) from None
    except (OSError, ValueError, UnicodeError):
        raise InvalidInput(
            f"{where}: host {parts.hostname} does not resolve", details={"field": where}
        ) from None
    return url


def webhook_target_add(*, session_id: UUID | str, url: str, message: Message | None = None) -> None:
    """Call `url` when a turn of the session ends (every turn, or only `message`'s)."""
    RunWebhook.objects.create(session_id=session_id, url=url, message=message)


# The turn's final commit inserts the delivery when the session has a webhook for every
# turn or for the message of this turn (that one first: a message's webhook wins). The
# step's guard (the UPDATE matched) holds for it as for every write of the batch; a turn
# delivered already (a commit retried) inserts nothing.
_OUTBOX_SQL = (
    f'INSERT INTO "{WebhookDelivery._meta.db_table}" '
    "(session_id, turn, url, finished, status, attempts, next_attempt_at, last_error, created_at) "
    "SELECT w.session_id, %s::integer, w.url, %s::jsonb, %s::text, 0, now(), '', now() "
    f'FROM "{RunWebhook._meta.db_table}" w '
    f'LEFT JOIN "{Message._meta.db_table}" m ON m.id = w.message_id '
    "WHERE w.session_id = %s::uuid AND (w.message_id IS NULL OR m.turn = %s::integer) AND {guard} "
    "ORDER BY w.message_id IS NULL, w.id DESC LIMIT 1 "
    "ON CONFLICT (session_id, turn) DO NOTHING RETURNING id"
)


def outbox_statement(
    session_id: UUID | str, turn: int, finished: dict[str, Any], guard: str
) -> tuple[str, list[Any]]:
    """The statement that writes a turn's delivery, for the turn's final commit."""
    return (
        _OUTBOX_SQL.replace("{guard}", guard),
        [
            turn,
            json.dumps(finished, default=str),
            DeliveryStatus.PENDING.value,
            str(session_id),
            turn,
        ],
    )


def outbox_wake(delivered: list[tuple[Any, ...]] | None) -> None:
    """After the commit, a task for each delivery the turn's end wrote (the sweep sends any
    whose message is lost)."""
    for (delivery_id,) in delivered or ():
        transaction.on_commit(functools.partial(_send, int(delivery_id)))


def _send(delivery_id: int) -> None:
    try:
        task_send("hooks.tasks.webhook_deliver", (delivery_id,))
    except Exception:  # noqa: BLE001 - a broker hiccup delays the delivery, the sweep sends it
        logger.warning("run webhook %s: not enqueued, the sweep will send it", delivery_id)

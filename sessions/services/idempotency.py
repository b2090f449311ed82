"""Requests that may be retried (DESIGN.md): what the first request with an owner's
`Idempotency-Key` did, so that a retry with the same key and body gets the same outcome
instead of running again, and the same key with another body is refused.

One record per owner and key (`RequestKey`), written in the same transaction as what the
request did, under a lock on the key: of two racing requests with one key, the second
waits for the first's commit and then finds its record. A REST request keeps its
response; an OpenAI-compatible one points at the turn it posted (the edge re-attaches a
retry to it). Records live IDEMPOTENCY_KEY_TTL_S, then `request_keys_prune` deletes them.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from record.errors import Conflict, InvalidInput
from record.models import RequestKey

# The header's name, as Stripe, OpenAI and the IETF draft spell it.
HEADER = "Idempotency-Key"
# As long as the body's idempotency_key may be (it is stored on the message too).
KEY_MAX_CHARS = 200
# Keys the edge derives for a client library's own retries (not the client's) start so, and
# serve at most this long: such a retry comes within its attempts' timeouts, not a day later.
DERIVED_PREFIX = "retry:"
DERIVED_TTL_S = 3600.0


@dataclass(frozen=True)
class KeyedRequest:
    """A request's key (the client's, or one the edge derived) and its body's fingerprint."""

    key: str
    fingerprint: str
    # A key the edge derived for a client library's own retries: a record older than this
    # is another request's, not this one's first attempt. None: the client's key (TTL).
    window_s: float | None = None
    # The first attempt of a derived key: nothing to look for, the record is (re)written.
    first: bool = False


def request_fingerprint(*parts: Any) -> str:
    """SHA-256 of what a request asks (method, path, body...), its keys sorted: the same
    JSON written in another order is the same request."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request_key_parse(raw: str | None, body_key: str | None = None) -> str | None:
    """The request's key: the header, or the body's `idempotency_key` (the same thing);
    both, when they differ, is a 400, as is a key that is not 1-200 printable ASCII."""
    header = (raw or "").strip() or None
    if header is not None and body_key and header != body_key:
        raise InvalidInput(
            f"the {HEADER} header and the body's idempotency_key differ: send one key",
            details={"field": "idempotency_key"},
            code="invalid_idempotency_key",
        )
    key = header or body_key or None
    if key is not None and (len(key) > KEY_MAX_CHARS or not all(" " < ch <= "~" for ch in key)):
        raise InvalidInput(
            f"{HEADER} must be 1 to {KEY_MAX_CHARS} printable ASCII characters, no spaces",
            details={"field": HEADER},
            code="invalid_idempotency_key",
        )
    return key


def request_key_find(*, owner_id: int, keyed: KeyedRequest) -> RequestKey | None:
    """Inside the caller's transaction: lock the key (until commit), then the live record of
    its first request, or None. The same key with another fingerprint is a 409
    `idempotency_key_reused`. A record found counts one more attempt."""
    if not connection.in_atomic_block:
        raise RuntimeError("request_key_find runs inside the transaction that uses its record")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", [f"request-key:{owner_id}:{keyed.key}"]
        )
    if keyed.first:
        return None
    record = RequestKey.objects.filter(owner_id=owner_id, key=keyed.key).first()
    if record is None:
        return None
    ttl = (
        settings.IDEMPOTENCY_KEY_TTL_S
        if keyed.window_s is None
        else min(keyed.window_s, DERIVED_TTL_S)
    )
    if record.created_at < timezone.now() - timedelta(seconds=ttl):
        return None  # expired: the key is free again (the record is overwritten)
    if record.fingerprint != keyed.fingerprint:
        raise Conflict(
            f"the {HEADER} '{keyed.key}' was already used with another request",
            details={"idempotency_key": keyed.key},
            code="idempotency_key_reused",
        )
    RequestKey.objects.filter(pk=record.pk).update(attempts=F("attempts") + 1)
    record.attempts += 1
    return record


def request_key_save(*, owner_id: int, keyed: KeyedRequest, **fields: Any) -> RequestKey:
    """Write the key's record for what its request just did (in the same transaction)."""
    record, _ = RequestKey.objects.update_or_create(
        owner_id=owner_id,
        key=keyed.key,
        defaults={
            "fingerprint": keyed.fingerprint,
            "created_at": timezone.now(),
            "attempts": 1,
            "session_id": None,
            "after_seq": 0,
            "input_tokens": 0,
            "output_tokens": 0,
            "status": None,
            "body": None,
            **fields,
        },
    )
    return record


@dataclass(frozen=True)
class KeyedResponse:
    status: int
    body: Any
    replayed: bool


def request_keyed_respond(
    *, owner_id: int, keyed: KeyedRequest | None, run: Callable[[], tuple[int, Any]]
) -> KeyedResponse:
    """`run()` (what the REST request does, returning its status and body) once per key:
    a retry gets the first response's body, without running again. A request refused
    (an exception) keeps nothing: its retry is judged afresh."""
    if keyed is None:
        status, body = run()
        return KeyedResponse(status, body, replayed=False)
    with transaction.atomic():
        record = request_key_find(owner_id=owner_id, keyed=keyed)
        if record is not None and record.status is not None:
            return KeyedResponse(record.status, record.body, replayed=True)
        status, body = run()
        request_key_save(owner_id=owner_id, keyed=keyed, status=status, body=body)
    return KeyedResponse(status, body, replayed=False)


def request_keys_prune(*, older_than_s: float | None = None, batch: int = 5000) -> int:
    """Delete the records older than IDEMPOTENCY_KEY_TTL_S (a derived key's, DERIVED_TTL_S),
    in batches."""
    ttl = settings.IDEMPOTENCY_KEY_TTL_S if older_than_s is None else older_than_s
    now = timezone.now()
    cutoff = now - timedelta(seconds=ttl)
    derived_cutoff = now - timedelta(seconds=min(ttl, DERIVED_TTL_S))
    stale = Q(created_at__lt=cutoff) | Q(
        key__startswith=DERIVED_PREFIX, created_at__lt=derived_cutoff
    )
    total = 0
    while True:
        ids = list(RequestKey.objects.filter(stale).values_list("pk", flat=True)[:batch])
        if not ids:
            return total
        deleted, _ = RequestKey.objects.filter(pk__in=ids).delete()
        total += deleted

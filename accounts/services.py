import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.models import AuditAction
from audit.services import SYSTEM, audit_record
from runtime.fastpaths.prepared import PreparedQuery

from . import limits
from .models import PREFIX_CHARS, ApiKey, Role, generate_api_key, hash_api_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    raw: str


def _key_audited(key: ApiKey) -> dict[str, object]:
    # What the trail keeps of a key: never its hash.
    return {
        "name": key.name,
        "prefix": key.prefix,
        "roles": list(key.roles),
        "max_value": key.max_value,
        "is_active": key.is_active,
    }


def api_key_create(
    *,
    username: str,
    roles: list[str],
    name: str = "",
    max_value: float | None = None,
    actor: str = SYSTEM,
) -> IssuedKey:
    """Create (or reuse) the user and issue a new key; the raw key is returned once.
    `max_value` grants the key session values above its agents' own (None: no grant).
    The audit trail has the key (not its hash), created by `actor`, in the same transaction."""
    if max_value is not None and not (math.isfinite(max_value) and max_value >= 0):
        raise ValueError(f"max_value must be a finite number of at least 0; got {max_value}")
    with transaction.atomic():
        user, user_created = get_user_model().objects.get_or_create(username=username)
        new_roles = [
            role.strip()
            for role in roles
            if role.strip() and Role.objects.get_or_create(name=role.strip())[1]
        ]
        raw = generate_api_key()
        key = ApiKey.objects.create(
            owner=user,
            name=name,
            prefix=raw[:PREFIX_CHARS],
            key_hash=hash_api_key(raw),
            # Keep the caller's order (deduplicated): the first role is a new session's default.
            roles=list(dict.fromkeys(r.strip() for r in roles if r.strip())),
            max_value=max_value,
        )
        audit_record(
            action=AuditAction.API_KEY_CREATE,
            actor=actor,
            object_type=ApiKey._meta.label_lower,
            object_id=key.pk,
            object_repr=str(key),
            owner_id=user.pk,
            after=_key_audited(key),
            data={"user_created": user_created, "roles_created": new_roles},
        )
    return IssuedKey(api_key=key, raw=raw)


# Every API request runs it: compiled once (runtime/fastpaths/prepared.py), ~0.1 ms instead of ~0.8.
_active_key_by_hash: PreparedQuery[ApiKey] = PreparedQuery(
    lambda key_hash: ApiKey.objects.select_related("owner").filter(
        key_hash=key_hash, is_active=True, owner__is_active=True
    ),
    example=["0" * 64],
)


def api_key_lookup(*, raw: str) -> ApiKey | None:
    if not raw:
        return None
    # key_hash is unique: no ORDER BY needed to pick "the first".
    return _active_key_by_hash.first(hash_api_key(raw))


def unknown_roles(roles: list[str]) -> list[str]:
    known = set(Role.objects.values_list("name", flat=True))
    return [r for r in roles if r not in known]


@dataclass(frozen=True)
class Authentication:
    """The key a caller presented, or why not: `retry_after_s` set means slowed down (429)."""

    api_key: ApiKey | None
    retry_after_s: int | None = None
    # What was slowed down: "address" or "key" (its prefix); see accounts/limits.py.
    slowed: str = ""

    @property
    def slow_down_message(self) -> str:
        where = "with this key" if self.slowed == "key" else "from your address"
        return f"too many failed authentication attempts {where}"


def api_key_authenticate(*, raw: str, address: str) -> Authentication:
    """Check a presented key for a caller at `address` (REST and websocket alike).

    1. A key prefix, or an address, that failed too often is told to wait before
       the key is even looked up, so guessing gets no faster with more attempts.
    2. Only a key that was presented and is wrong counts, against its prefix and
       its address. The address limit is the higher one, so another client's valid
       key from the same address keeps working while one client there fails.
    """
    prefix = raw[:PREFIX_CHARS]
    if raw:
        slow = limits.auth_retry_after(address=address, prefix=prefix)
        if slow is not None:
            return Authentication(api_key=None, retry_after_s=slow.retry_after_s, slowed=slow.scope)
    key = api_key_lookup(raw=raw)
    if key is None:
        if raw:
            limits.auth_failure_record(address=address, prefix=prefix)
        return Authentication(api_key=None)
    api_key_touch(api_key=key)
    return Authentication(api_key=key)


# last_used_at: written at most once a minute per key, on a thread of its own, so
# no request waits for the UPDATE. A process-local note skips even the Redis
# round trip for a key this process touched lately.
_touch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-key-touch")
_touched_at: dict[int, float] = {}


def api_key_touch(*, api_key: ApiKey) -> None:
    now = time.monotonic()
    if now - _touched_at.get(api_key.pk, -math.inf) < limits.LAST_USED_INTERVAL_S:
        return
    _touched_at[api_key.pk] = now
    if limits.last_used_claim(key_id=api_key.pk):
        _touch_pool.submit(_last_used_write_in_background, api_key.pk)


def _last_used_write_in_background(key_id: int) -> None:
    close_old_connections()
    try:
        api_key_last_used_write(key_id=key_id)
    except Exception:  # noqa: BLE001 - a missed stamp is harmless; the next minute writes it
        logger.warning("could not write last_used_at of key %s", key_id, exc_info=True)
    finally:
        connection.close()  # back to the pool; this thread may idle for long


def api_key_last_used_write(*, key_id: int, now: datetime | None = None) -> int:
    """Stamp the key used; the WHERE keeps it to one write a minute even if Redis forgot."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=limits.LAST_USED_INTERVAL_S)
    return (
        ApiKey.objects.filter(pk=key_id)
        .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=cutoff))
        .update(last_used_at=now)
    )


# Revocation -------------------------------------------------------------------------


def key_group_name(key_id: int) -> str:
    """The channel group every open websocket of this key joins."""
    return f"apikey.{key_id}"


def api_key_revoke(*, api_key: ApiKey, actor: str) -> bool:
    """Deactivate a key and close its open websockets; True if it was active until now.

    Revoking an inactive key again is allowed and closes any socket still open
    (one left from a change made behind the platform's back, for instance). A revocation
    that deactivated the key is in the audit trail, by `actor`, in its transaction.
    """
    # Marked before the commit: a socket that sees the mark re-reads the key from
    # the database, so a frame arriving after the commit, even before the close
    # reaches its socket, is refused. A failed commit leaves only a harmless mark.
    limits.revocation_mark(key_id=api_key.pk)
    with transaction.atomic():
        changed = ApiKey.objects.filter(pk=api_key.pk, is_active=True).update(is_active=False)
        if changed:
            audit_record(
                action=AuditAction.API_KEY_REVOKE,
                actor=actor,
                object_type=ApiKey._meta.label_lower,
                object_id=api_key.pk,
                object_repr=str(api_key),
                owner_id=api_key.owner_id,
                before={"is_active": True},
                after={"is_active": False},
            )
        transaction.on_commit(partial(_close_key_sockets, api_key.pk))
    api_key.is_active = False
    logger.info(
        "api key %s revoked by %s%s", api_key.prefix, actor, "" if changed else " (was inactive)"
    )
    return bool(changed)


def api_keys_revoke_for_user(*, username: str, actor: str) -> list[tuple[ApiKey, bool]]:
    """Revoke every key of a user: each key, and whether it was active until now."""
    keys = ApiKey.objects.filter(owner__username=username).order_by("pk")
    return [(key, api_key_revoke(api_key=key, actor=actor)) for key in keys]


def _close_key_sockets(key_id: int) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(key_group_name(key_id), {"type": "apikey.revoked"})
    except Exception:  # noqa: BLE001 - the sockets still refuse every frame (the mark, the recheck)
        logger.warning("could not close the websockets of key %s", key_id, exc_info=True)


def approver_grant(*, username: str, groups: list[str] | None = None, actor: str = SYSTEM) -> None:
    """Make a user an approver (created if missing); `groups` adds to the ones already held.
    A grant that changed something is in the audit trail, by `actor`."""
    from .models import Approver

    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        wanted = [g.strip() for g in (groups or ["approvers"]) if g.strip()]
        approver, created = Approver.objects.get_or_create(user=user, defaults={"groups": wanted})
        before = None if created else {"groups": approver.groups, "is_active": approver.is_active}
        if not created:
            approver.groups = list(dict.fromkeys([*approver.groups, *wanted]))
            approver.is_active = True
            approver.save(update_fields=["groups", "is_active"])
        after = {"groups": approver.groups, "is_active": approver.is_active}
        if before != after:
            audit_record(
                action=AuditAction.APPROVER_GRANT,
                actor=actor,
                object_type=Approver._meta.label_lower,
                object_id=approver.pk,
                object_repr=str(approver),
                owner_id=user.pk,  # the rights are this user's: they see the entry
                before=before,
                after=after,
            )

"""Writing the audit trail: one row and one log line per action.

Called by the services that carry out the action (and by the admin's save and delete of
the platform's configuration), inside the action's own transaction: the entry commits with
the action or not at all. The log line is written after the commit, as one structured line
naming the action, the actor and the object, and only the names of the changed fields:
never their values, a comment's text or anything a user said.
"""

import getpass
import hashlib
import json
import logging
import os
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import DecimalField, Model

from .diff import changes
from .models import AuditAction, AuditEntry

logger = logging.getLogger("audit")

SYSTEM = "system"
# An actor string names its user after one of these (admin:alice, api:alice).
USER_PREFIXES = ("admin:", "api:")
# Fields a snapshot of a row leaves out: bookkeeping, not configuration (an API key's hash
# is neither, and has no place in a trail many people read).
# A memory item's vector is derived from its text: not kept either.
SKIPPED_FIELDS = frozenset({"created_at", "updated_at", "last_used_at", "key_hash", "embedding"})
# What an entry says instead of a value it does not keep (what a person said, a secret).
WITHHELD = "(withheld)"


def command_actor(*, given: str = "", prefix: str = "cli") -> str:
    """Who ran a management command: `given` (its --actor option) as it is, else
    `<prefix>:<the OS user>` (sudo keeps the person behind it)."""
    if given.strip():
        return given.strip()[:150]
    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{prefix}:{user}"


def jsonable(value: Any) -> Any:
    """Decimals, dates, UUIDs and the like as JSON (the encoder Django's serializers use)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _user_named(actor: str) -> int | None:
    for prefix in USER_PREFIXES:
        if actor.startswith(prefix):
            name = actor[len(prefix) :]
            found = (
                get_user_model().objects.filter(username=name).values_list("pk", flat=True).first()
            )
            return int(found) if found is not None else None
    return None


def audit_record(
    *,
    action: AuditAction | str,
    actor: str,
    object_type: str,
    object_id: Any,
    object_repr: str = "",
    user_id: int | None = None,
    owner_id: int | None = None,
    key_prefix: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEntry:
    """One entry, in the caller's transaction; its log line once that commits.

    `object_type` is the model's label (`tools.tool`); `user_id` defaults to the user an
    `admin:<name>` or `api:<name>` actor names.
    """
    actor = (actor or SYSTEM)[:150]
    entry = AuditEntry.objects.create(
        action=str(action),
        actor=actor,
        user_id=user_id if user_id is not None else _user_named(actor),
        key_prefix=key_prefix[:12],
        object_type=object_type[:60],
        object_id=str(object_id)[:64],
        object_repr=object_repr[:200],
        owner_id=owner_id,
        before=jsonable(before) if before is not None else None,
        after=jsonable(after) if after is not None else None,
        reason=reason,
        data=jsonable(data or {}),
    )
    fields = sorted(set(before or {}) | set(after or {}))
    transaction.on_commit(lambda: _log(entry, fields))
    return entry


def _log(entry: AuditEntry, fields: list[str]) -> None:
    logger.info(
        "audit: action=%s actor=%s object=%s:%s entry=%s fields=%s reason_chars=%d",
        entry.action,
        entry.actor,
        entry.object_type,
        entry.object_id,
        entry.pk,
        ",".join(fields) or "-",
        len(entry.reason),
    )


def _plain(value: Any) -> Any:
    # 0, Decimal("0") and Decimal("0.000000") are one price: compared as the same text.
    return f"{value.normalize():f}" if isinstance(value, Decimal) else value


def _fingerprint(value: Any) -> str | None:
    # Compared between before and after, then replaced by WITHHELD: never stored.
    if value is None:
        return None
    return hashlib.sha256(json.dumps(value, cls=DjangoJSONEncoder).encode()).hexdigest()


def row_snapshot(obj: Model, withheld: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The row's configuration as JSON: each concrete field (a foreign key by its id), each
    value as the field reads it back from the database; a `withheld` field's as a
    fingerprint, to tell a change (admin_change_record keeps neither)."""
    values = {
        field.attname: _plain(
            field.to_python(getattr(obj, field.attname))
            if isinstance(field, DecimalField)
            else getattr(obj, field.attname)
        )
        for field in obj._meta.concrete_fields
        if field.name not in SKIPPED_FIELDS
    }
    for name in withheld & set(values):
        values[name] = _fingerprint(values[name])
    return dict(jsonable(values))


def stored_snapshot(
    model: type[Model], pk: Any, withheld: frozenset[str] = frozenset()
) -> dict[str, Any] | None:
    """The row as the database holds it now (before an edit is saved), or None."""
    row = model._default_manager.filter(pk=pk).first()
    return row_snapshot(row, withheld) if row is not None else None


def _withhold(values: dict[str, Any] | None, withheld: frozenset[str]) -> dict[str, Any] | None:
    if values is None or not withheld:
        return values
    return {
        path: WITHHELD if path.split(".", 1)[0] in withheld and value is not None else value
        for path, value in values.items()
    }


def admin_change_record(
    *,
    actor: str,
    user_id: int | None,
    obj: Model,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    action: AuditAction,
    owner_id: int | None = None,
    withheld: frozenset[str] = frozenset(),
) -> AuditEntry | None:
    """An admin's add, change or delete of a row (an agent, a tool, a model endpoint, a
    workflow, an API key, a tenant's budget or memory item). A change that changed nothing
    is not recorded. The `withheld` fields' values are compared but not kept: the entry
    says they changed, not what they said. `owner_id`: the tenant whose row it is."""
    old, new = changes(before, after) if action == AuditAction.ADMIN_CHANGE else (before, after)
    if action == AuditAction.ADMIN_CHANGE and not old and not new:
        return None
    return audit_record(
        action=action,
        actor=actor,
        user_id=user_id,
        owner_id=owner_id,
        object_type=obj._meta.label_lower,
        object_id=obj.pk,
        object_repr=str(obj),
        before=_withhold(old, withheld),
        after=_withhold(new, withheld),
    )


def breaker_reset_record(*, actor: str, user_id: int | None, obj: Model, state: str) -> AuditEntry:
    """An operator reset a circuit breaker (a model endpoint's or a tool's)."""
    return audit_record(
        action=AuditAction.BREAKER_RESET,
        actor=actor,
        user_id=user_id,
        object_type=obj._meta.label_lower,
        object_id=obj.pk,
        object_repr=str(obj),
        before={"breaker": state},
        after={"breaker": "closed"},
    )

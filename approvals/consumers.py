"""Websocket edge for approvers: `/ws/approvals/` streams requested and resolved approvals.

Only keys of approvers connect; each socket first gets the pending approvals of
its groups (as `approval.requested` frames), then every change live. Frames:
`{"type": "approval.requested"|"approval.resolved", "ts": iso8601, "data": {...}}`,
`data` in the REST listing's shape (resolved ones add `outcome`, `by`, `comment`).

Rights are read again before every frame sent, not only at connect: a key, user or
approver deactivated in the database (not just through the platform) receives
nothing more, and the socket is closed with the reason; an approver taken out of
a group no longer sees that group's approvals. Browsers may connect only from
allowed origins (accounts/origins.py, as the sessions' socket), and a key holds
at most APPROVAL_WS_MAX_SOCKETS_PER_KEY of these sockets at once.

The admin's queue page opens the same socket without a key: the signed-in admin user
(their Django session, over the page's own origin) stands in for it, if they may see the
queue (a superuser: every group; an approver on staff: their groups), with the same
per-frame checks (the session still signed in, the user active, on staff and an approver)
and as many sockets per user as a key may hold.
"""

import json
import logging
import uuid
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from accounts import limits
from accounts.origins import websocket_origin_allowed
from accounts.selectors import (
    api_key_approver_groups,
    api_key_is_active,
    approver_groups,
    queue_viewer_groups,
)
from accounts.services import api_key_authenticate, key_group_name

from .notify import APPROVERS_GROUP, make_frame
from .selectors import approvals_list
from .states import ApprovalStatus

logger = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_RATE_LIMITED = 4429
SUBPROTOCOL = "agentplatform.v1"
KEY_SUBPROTOCOL_PREFIX = "bearer."


def _token(scope: dict[str, Any]) -> tuple[str, str | None]:
    """(the key the client presented, the subprotocol to answer)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    token = (query.get("token") or [""])[0]
    offered = [str(p) for p in scope.get("subprotocols") or []]
    for p in offered:
        if p.startswith(KEY_SUBPROTOCOL_PREFIX):
            token = p[len(KEY_SUBPROTOCOL_PREFIX) :]
    for name, value in scope.get("headers", []):
        if name == b"authorization" and value.startswith(b"Bearer "):
            token = value[len(b"Bearer ") :].decode("latin-1").strip()
    return token, SUBPROTOCOL if SUBPROTOCOL in offered else None


def _pending_frames(groups: list[str] | None) -> list[dict[str, Any]]:
    rows = approvals_list(status=ApprovalStatus.PENDING.value, groups=groups)[:500]
    return [dict(make_frame("approval.requested", a)) for a in rows]


def _session_store() -> Any:
    return import_module(settings.SESSION_ENGINE).SessionStore()


def _user_groups_now(user_id: int, session_key: str | None) -> tuple[list[str] | None, str | None]:
    """(the groups a signed-in admin sees now, None: all) and why they see none, if so."""
    if not session_key or not _session_store().exists(session_key):
        return [], "signed_out"
    allowed, groups = queue_viewer_groups(user_id=user_id)
    if not allowed:
        return [], "approver_revoked"
    return groups, None


class ApprovalsConsumer(AsyncWebsocketConsumer):
    key_id: int | None = None
    key_group: str | None = None
    slot_id: str | None = None
    # A signed-in admin's socket (the queue page): its user, and the pool its slot is in.
    user_id: int | None = None
    pool: str = limits.APPROVAL_SOCKETS
    joined: bool = False
    _closing: bool = False

    async def connect(self) -> None:
        """1. Refuse the handshake from a foreign browser origin (HTTP 403, before accept).
        2. Authenticate the key, 3. require approver rights, 4. take one of the key's
        approvals-socket slots, 5. join the groups, 6. send the pending approvals."""
        if not websocket_origin_allowed(self.scope):
            logger.info("approvals websocket refused: origin not allowed")
            await self.close()
            return
        token, subprotocol = _token(self.scope)
        await self.accept(subprotocol=subprotocol)
        user = self.scope.get("user")
        if not token and user is not None and user.is_authenticated:
            await self._connect_signed_in(user)
            return
        client = self.scope.get("client") or (None, None)
        address = limits.client_address(peer=client[0], forwarded_for=None)
        authn = await database_sync_to_async(api_key_authenticate)(raw=token, address=address)
        if authn.retry_after_s is not None:
            await self._fail(
                "rate_limited", "too many failed authentication attempts", CLOSE_RATE_LIMITED
            )
            return
        if authn.api_key is None:
            await self._fail("not_authenticated", "a valid API key is required", CLOSE_UNAUTHORIZED)
            return
        key = authn.api_key
        groups = await database_sync_to_async(approver_groups)(user_id=key.owner_id)
        if groups is None:
            await self._fail(
                "permission_denied",
                "this API key belongs to a user who is not an approver",
                CLOSE_FORBIDDEN,
            )
            return
        slot_id = await self._slot(key.pk, limits.APPROVAL_SOCKETS, "this API key")
        if slot_id is None:
            return
        self.key_id, self.slot_id = key.pk, slot_id
        self.key_group = key_group_name(key.pk)
        await self.channel_layer.group_add(self.key_group, self.channel_name)
        await self.channel_layer.group_add(APPROVERS_GROUP, self.channel_name)
        self.joined = True
        for frame in await database_sync_to_async(_pending_frames)(groups):
            await self.send(text_data=json.dumps(frame))

    async def _slot(self, holder_id: int, pool: str, holder: str) -> str | None:
        """A socket slot of `pool` for the key or user; None (refused, closed) past its limit."""
        slot_id = uuid.uuid4().hex
        if await limits.socket_slots.acquire(key_id=holder_id, socket_id=slot_id, pool=pool):
            return slot_id
        limit = limits.socket_limit(pool)
        await self._fail(
            "too_many_sockets",
            f"{holder} already has {limit} approvals websockets open",
            CLOSE_RATE_LIMITED,
            {"limit": limit},
        )
        return None

    async def _connect_signed_in(self, user: Any) -> None:
        """The admin's queue page: the signed-in user, if they may see the queue."""
        allowed, groups = await database_sync_to_async(queue_viewer_groups)(user_id=user.pk)
        if not allowed:
            await self._fail(
                "permission_denied",
                "this user may not see the approvals queue (staff approvers and superusers)",
                CLOSE_FORBIDDEN,
            )
            return
        pool = limits.ADMIN_APPROVAL_SOCKETS
        slot_id = await self._slot(user.pk, pool, "this user")
        if slot_id is None:
            return
        self.user_id, self.slot_id, self.pool = user.pk, slot_id, pool
        await self.channel_layer.group_add(APPROVERS_GROUP, self.channel_name)
        self.joined = True
        for frame in await database_sync_to_async(_pending_frames)(groups):
            await self.send(text_data=json.dumps(frame))

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(APPROVERS_GROUP, self.channel_name)
        if self.key_group is not None:
            await self.channel_layer.group_discard(self.key_group, self.channel_name)
        holder = self.key_id if self.key_id is not None else self.user_id
        if holder is not None and self.slot_id is not None:
            await limits.socket_slots.release(key_id=holder, socket_id=self.slot_id, pool=self.pool)
            self.slot_id = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Approvers decide over REST (or the admin); this socket only listens."""

    async def approval_frame(self, message: dict[str, Any]) -> None:
        """Send a frame only to a receiver who, as the database says now, may see it."""
        if self._closing:
            return
        if self.user_id is not None:
            await self._frame_for_user(message["frame"])
            return
        if self.key_id is None:
            return
        groups, lost = await database_sync_to_async(self._current_groups)(self.key_id)
        if lost == "key_revoked":
            await self._close_for(
                "key_revoked", "this API key is no longer active", CLOSE_UNAUTHORIZED
            )
            return
        if lost == "approver_revoked":
            await self._close_for(
                "approver_revoked", "this API key's user is no longer an approver", CLOSE_FORBIDDEN
            )
            return
        frame = message["frame"]
        if frame["data"].get("group") in groups:
            await self.send(text_data=json.dumps(frame))

    async def _frame_for_user(self, frame: dict[str, Any]) -> None:
        """A signed-in admin's frame: still signed in, still allowed, and their group's."""
        if self.user_id is None:
            return
        session_key = getattr(self.scope.get("session"), "session_key", None)
        groups, lost = await database_sync_to_async(_user_groups_now)(self.user_id, session_key)
        if lost == "signed_out":
            await self._close_for("signed_out", "the admin session has ended", CLOSE_UNAUTHORIZED)
            return
        if lost == "approver_revoked":
            await self._close_for(
                "approver_revoked", "this user may no longer see the approvals queue",
                CLOSE_FORBIDDEN,
            )  # fmt: skip
            return
        if groups is None or frame["data"].get("group") in groups:
            await self.send(text_data=json.dumps(frame))

    @staticmethod
    def _current_groups(key_id: int) -> tuple[list[str], str | None]:
        """(the receiver's approver groups now, None) or ([], why they have none): one query
        while all is well, a second only to tell a dead key from lost approver rights."""
        groups = api_key_approver_groups(key_id=key_id)
        if groups is not None:
            return groups, None
        return [], "key_revoked" if not api_key_is_active(key_id=key_id) else "approver_revoked"

    async def apikey_revoked(self, message: dict[str, Any]) -> None:
        """The key was revoked (accounts.services.api_key_revoke): close at once."""
        await self._close_for("key_revoked", "this API key has been revoked", CLOSE_UNAUTHORIZED)

    async def _close_for(self, code: str, message: str, close_code: int) -> None:
        if self._closing:
            return
        self._closing = True
        await self._fail(code, message, close_code)

    async def _fail(
        self, code: str, message: str, close_code: int, details: dict[str, Any] | None = None
    ) -> None:
        error = {"code": code, "message": message, "details": details or {}}
        await self.send(text_data=json.dumps({"type": "error", "data": error}))
        await self.close(code=close_code)

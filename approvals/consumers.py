"""Websocket edge for approvers: `/ws/approvals/` streams requested and resolved approvals.

Only keys of approvers connect; each socket first gets the pending approvals of
its groups (as `approval.requested` frames), then every change live. Frames:
`{"type": "approval.requested"|"approval.resolved", "ts": iso8601, "data": {...}}`,
`data` in the REST listing's shape (resolved ones add `outcome`, `by`, `comment`).
"""

import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from accounts import limits
from accounts.selectors import approver_groups
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


def _pending_frames(groups: list[str]) -> list[dict[str, Any]]:
    rows = approvals_list(status=ApprovalStatus.PENDING.value, groups=groups)[:500]
    return [dict(make_frame("approval.requested", a)) for a in rows]


class ApprovalsConsumer(AsyncWebsocketConsumer):
    groups_allowed: list[str]
    key_group: str | None = None
    joined: bool = False

    async def connect(self) -> None:
        token, subprotocol = _token(self.scope)
        await self.accept(subprotocol=subprotocol)
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
        groups = await database_sync_to_async(approver_groups)(user_id=authn.api_key.owner_id)
        if groups is None:
            await self._fail(
                "permission_denied",
                "this API key belongs to a user who is not an approver",
                CLOSE_FORBIDDEN,
            )
            return
        self.groups_allowed = groups
        self.key_group = key_group_name(authn.api_key.pk)
        await self.channel_layer.group_add(self.key_group, self.channel_name)
        await self.channel_layer.group_add(APPROVERS_GROUP, self.channel_name)
        self.joined = True
        for frame in await database_sync_to_async(_pending_frames)(groups):
            await self.send(text_data=json.dumps(frame))

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(APPROVERS_GROUP, self.channel_name)
        if self.key_group is not None:
            await self.channel_layer.group_discard(self.key_group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Approvers decide over REST; this socket only listens."""

    async def approval_frame(self, message: dict[str, Any]) -> None:
        frame = message["frame"]
        if frame["data"].get("group") in self.groups_allowed:
            await self.send(text_data=json.dumps(frame))

    async def apikey_revoked(self, message: dict[str, Any]) -> None:
        await self.close(code=CLOSE_UNAUTHORIZED)

    async def _fail(self, code: str, message: str, close_code: int) -> None:
        await self.send(
            text_data=json.dumps({"type": "error", "data": {"code": code, "message": message}})
        )
        await self.close(code=close_code)

"""An operator's terminal view: run one turn through the real worker and print its events."""

import asyncio
import json
import sys
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions import selectors, services
from sessions.errors import DomainError
from sessions.events import EventType
from sessions.publisher import group_name
from tools.models import Tool


class Command(BaseCommand):
    help = (
        'Run a turn through the real worker and print the streamed events: chat --agent SLUG "text"'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("text")
        parser.add_argument("--agent", required=True)
        parser.add_argument("--session", help="Continue this session instead of opening a new one.")
        parser.add_argument(
            "--user", default="cli", help="Owner of a new session (created if missing)."
        )
        parser.add_argument(
            "--role",
            default="",
            help="Role of a new session (default: the agent's tools' first role).",
        )
        parser.add_argument("--timeout", type=float, default=120.0)
        parser.add_argument("--json", action="store_true", help="Print raw frames as JSON lines.")

    def handle(self, *args: object, **options: Any) -> None:
        try:
            session = self._session(options)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(
            f"session {session.pk} (agent {session.agent.slug}, role '{session.role}')"
        )
        try:
            ok = asyncio.run(self._run(session, options))
        except DomainError as exc:
            raise CommandError(exc.message) from None
        if not ok:
            raise CommandError(
                f"no turn.finished within {options['timeout']} s (is a worker running?)"
            )

    def _session(self, options: dict[str, Any]):  # type: ignore[no-untyped-def]
        if options.get("session"):
            return services.session_get(session_id=options["session"])
        owner, _ = get_user_model().objects.get_or_create(username=options["user"])
        role = options["role"]
        if not role:
            from sessions.models import Agent

            agent = Agent.objects.filter(slug=options["agent"]).first()
            names = list(agent.tools) if agent else []
            roles = [r for t in Tool.objects.filter(name__in=names) for r in t.roles]
            role = roles[0] if roles else ""
        return services.session_create(
            owner=owner,
            agent_slug=options["agent"],
            key_roles=[role] if role else [],
            role=role or None,
        )

    async def _run(self, session: Any, options: dict[str, Any]) -> bool:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group_name(session.pk), channel)
        last_seq = session.event_seq
        posted = await database_sync_to_async(services.message_post)(
            session=session, content=options["text"]
        )
        turn: int | None = posted.message.turn or None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options["timeout"]
        try:
            while loop.time() < deadline:
                try:
                    message = await asyncio.wait_for(layer.receive(channel), timeout=1.0)
                    frames = [message["frame"]]
                except TimeoutError:
                    frames = []
                # Anything the channel missed is in the database, in order.
                if not frames or (frames[0]["seq"] is not None and frames[0]["seq"] > last_seq + 1):
                    rows = await database_sync_to_async(selectors.events_after)(
                        session_id=session.pk, after=last_seq
                    )
                    frames = [{"seq": e.seq, "type": e.type, "data": e.data} for e in rows] + [
                        f for f in frames if f["seq"] is None
                    ]
                for frame in frames:
                    seq = frame["seq"]
                    if seq is not None:
                        if seq <= last_seq:
                            continue
                        last_seq = seq
                    self._print(frame, options["json"])
                    data = frame.get("data") or {}
                    if (
                        frame["type"] == EventType.MESSAGE_COMPLETED
                        and data.get("role") == "user"
                        and data.get("content") == options["text"]
                        and turn is None
                    ):
                        turn = data.get("turn")
                    if frame["type"] == EventType.TURN_FINISHED and (
                        turn is None or data.get("turn") == turn
                    ):
                        return True
            return False
        finally:
            await layer.group_discard(group_name(session.pk), channel)

    def _print(self, frame: dict[str, Any], raw: bool) -> None:
        if raw:
            self.stdout.write(json.dumps(frame, ensure_ascii=False))
            return
        data = frame.get("data") or {}
        kind = frame["type"]
        if kind == EventType.MESSAGE_DELTA:
            sys.stdout.write(data.get("text", ""))
            sys.stdout.flush()
            return
        label = f"[{frame['seq']}] {kind}" if frame["seq"] is not None else f"[-] {kind}"
        if kind == EventType.STATE_CHANGED:
            detail = f"{data.get('from')} -> {data.get('to')} ({data.get('trigger')})"
        elif kind == EventType.MESSAGE_COMPLETED:
            detail = f"{data.get('role')}: {str(data.get('content', ''))[:200]}"
            if data.get("tool_calls"):
                detail += " " + ", ".join(
                    f"{c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)[:80]})"
                    for c in data["tool_calls"]
                )
        elif kind in (EventType.TOOL_STARTED, EventType.TOOL_FINISHED):
            detail = (
                f"{data.get('tool')} {data.get('status', '')} {data.get('elapsed_ms', '')}".strip()
            )
        else:
            detail = json.dumps(data, ensure_ascii=False)[:200]
        self.stdout.write(
            f"\n{label}: {detail}"
            if kind != EventType.MESSAGE_COMPLETED or data.get("role") != "assistant"
            else f"\n{label}: {detail}"
        )

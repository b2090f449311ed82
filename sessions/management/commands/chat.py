"""An operator's terminal view: run one turn through the real worker and print its events."""

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.text import Truncator

from record.errors import DomainError
from record.events import EventType
from record.models import Agent, Session
from record.publisher import frames_of, group_name
from sessions import selectors, services
from tools.models import Tool

DEFAULT_USER = "cli"
ARGS_CHARS = 80
TEXT_CHARS = 200


def _cut(value: Any, length: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return Truncator(" ".join(text.split())).chars(length)


def _ms(value: Any) -> str:
    return f"{value} ms" if isinstance(value, int | float) else ""


class Command(BaseCommand):
    help = (
        'Run a turn through the real worker and print the streamed events: chat --agent SLUG "text" '
        'opens a session, chat --session ID "text" continues one.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("text")
        parser.add_argument("--agent", help="Agent of a new session (not needed with --session).")
        parser.add_argument("--session", help="Continue this session instead of opening a new one.")
        parser.add_argument(
            "--user",
            default=None,
            help=f"Owner of a new session (default: {DEFAULT_USER!r}, created if missing). "
            "A key only sees its owner's sessions: use the key's user (e.g. demo) to open "
            "the session in the playground or over REST afterwards.",
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
            f"session {session.pk} (agent {session.agent.slug}, owner {session.owner.get_username()}, "
            f"role '{session.role}')"
        )
        self._streaming = self._streamed = False
        try:
            ok = asyncio.run(self._run(session, options))
        except DomainError as exc:
            raise CommandError(exc.message) from None
        finally:
            self._end_stream()
        if not ok:
            raise CommandError(
                f"no turn.finished within {options['timeout']} s (is a worker running?)"
            )

    def _session(self, options: dict[str, Any]) -> Session:
        if options.get("session"):
            session = services.session_get(session_id=options["session"])
            if options.get("agent") and options["agent"] != session.agent.slug:
                raise CommandError(
                    f"session {session.pk} runs agent '{session.agent.slug}', not '{options['agent']}'"
                )
            owner = session.owner.get_username()
            if options.get("user") and options["user"] != owner:
                raise CommandError(
                    f"session {session.pk} belongs to '{owner}', not '{options['user']}'"
                )
            return session
        if not options.get("agent"):
            raise CommandError(
                "name an agent to open a session (--agent SLUG) or continue one (--session ID)"
            )
        owner, _ = get_user_model().objects.get_or_create(username=options["user"] or DEFAULT_USER)
        role = options["role"]
        if not role:
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

    async def _run(self, session: Session, options: dict[str, Any]) -> bool:
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
                    frames = frames_of(message)
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

    def _end_stream(self) -> None:
        if self._streaming:
            self.stdout.write("")
            self._streaming = False

    def _print(self, frame: dict[str, Any], raw: bool) -> None:
        if raw:
            self.stdout.write(json.dumps(frame, ensure_ascii=False))
            return
        data = frame.get("data") or {}
        kind = frame["type"]
        if kind == EventType.MESSAGE_DELTA:
            # Streamed text goes on one line as it arrives; the completed message
            # then does not print it a second time.
            if not self._streaming:
                self.stdout.write("[-] message.delta: ", ending="")
                self._streaming = True
            self.stdout.write(str(data.get("text", "")), ending="")
            self._streamed = True
            self.stdout.flush()
            return
        # Streamed text belongs to the next assistant message, even when a state
        # change is printed between the two.
        streamed = self._streamed
        if kind == EventType.MESSAGE_COMPLETED and data.get("role") == "assistant":
            self._streamed = False
        self._end_stream()
        self.stdout.write(
            f"[{frame['seq'] if frame['seq'] is not None else '-'}] {kind}: {self._detail(kind, data, streamed)}"
        )

    def _detail(self, kind: str, data: dict[str, Any], streamed: bool) -> str:
        if kind == EventType.STATE_CHANGED:
            return f"{data.get('from')} -> {data.get('to')} ({data.get('trigger')})"
        if kind == EventType.MESSAGE_COMPLETED:
            role = data.get("role")
            calls = [
                f"{c.get('name')}({_cut(c.get('arguments'), ARGS_CHARS)})"
                for c in data.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            if role == "assistant" and streamed:
                text = "(streamed above)" if data.get("content") else ""
            elif role == "assistant":
                text = str(data.get("content") or "")
            else:
                text = _cut(data.get("content") or "", TEXT_CHARS)
            return " ".join(part for part in (f"{role}:", text, ", ".join(calls)) if part)
        if kind == EventType.TOOL_STARTED:
            return f"{data.get('tool')}({_cut(data.get('input'), ARGS_CHARS)})"
        if kind == EventType.TOOL_FINISHED:
            elapsed = _ms(data.get("elapsed_ms"))
            detail = f"{data.get('tool')} {data.get('status', '')}" + (
                f" in {elapsed}" if elapsed else ""
            )
            if data.get("error"):
                detail += f": {_cut(data['error'], TEXT_CHARS)}"
            return detail
        if kind == EventType.TURN_FINISHED:
            usage = data.get("usage") or {}
            return (
                f"turn {data.get('turn')} {data.get('stop_reason')}, "
                f"{usage.get('input_tokens', 0)} in + {usage.get('output_tokens', 0)} out tokens, "
                f"cost {usage.get('cost', 0)}"
            )
        if kind == EventType.ERROR:
            return f"{data.get('code')}: {_cut(data.get('message') or '', TEXT_CHARS)}"
        if kind == EventType.PROGRESS:
            if data.get("stage") == "question":  # ask_user: the next line you type answers it
                options = " / ".join(str(o) for o in data.get("options") or [])
                return f"question: {data.get('question')}" + (f" ({options})" if options else "")
            return " ".join(str(v) for v in (data.get("stage"), data.get("tool")) if v)
        return _cut(data, TEXT_CHARS)

"""One request's view of its turn: the session's frames, then the bytes of the answer.

Runs on the web process's event loop and holds no thread and no database
connection while it waits: frames arrive through the channel layer (the group
the websocket consumer listens on), and the database is read only to fill a
gap in `seq` or after WS_RESYNC_S of silence (a notification lost between a
worker's commit and its publish), as the consumer does. The channel is joined
before the turn is posted, so no frame of the turn (text deltas included) is missed.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from sessions import selectors as session_selectors
from sessions.publisher import frame_of, group_name
from sessions.services import session_cancel

from . import selectors
from .services import TurnPosted
from .turns import Outcome, TurnReader
from .wire import DONE, KEEPALIVE, ChatRequest, ChunkWriter, completion, usage_of

logger = logging.getLogger(__name__)

Frame = dict[str, Any]
# A quiet stream gets an SSE comment this often, so proxies keep it open.
KEEPALIVE_S = 15.0
# Cleanups started when a request ends abruptly (a client gone): kept until done.
_cleanups: set["asyncio.Future[Any]"] = set()


def _events_after(session_id: str, after: int) -> list[Frame]:
    return [
        {"seq": e.seq, "type": e.type, "data": e.data}
        for e in session_selectors.events_after(session_id=session_id, after=after)
    ]


def _cancel(session_id: str, owner_id: int, actor: str) -> None:
    session = session_selectors.session_get_for_owner(session_id=session_id, owner_id=owner_id)
    session_cancel(session=session, reason="the OpenAI client disconnected", actor=actor)


async def _join(layer: BaseChannelLayer, group: str) -> str:
    channel: str = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


class TurnFrames:
    """The frames of one session after `last_seq`, in order, from a channel of its group."""

    def __init__(self, layer: BaseChannelLayer, channel: str, session_id: str) -> None:
        self.layer = layer
        self.channel = channel
        self.session_id = session_id
        self.last_seq = 0

    @classmethod
    def join(cls, session_id: UUID | str) -> "TurnFrames":
        """Join the session's group from a request's thread (on the server's loop)."""
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("the OpenAI-compatible endpoint needs a channel layer")
        # One call: a channel exists in the event loop that made it.
        channel = async_to_sync(_join)(layer, group_name(session_id))
        return cls(layer, channel, str(session_id))

    def leave_sync(self) -> None:
        async_to_sync(self.leave)()

    async def leave(self) -> None:
        try:
            await self.layer.group_discard(group_name(self.session_id), self.channel)
        except Exception:  # noqa: BLE001 - the subscription goes with the connection anyway
            logger.debug("group_discard failed for %s", self.session_id, exc_info=True)

    async def catch_up(self) -> list[Frame]:
        rows = await database_sync_to_async(_events_after)(self.session_id, self.last_seq)
        if rows:
            self.last_seq = rows[-1]["seq"]
        return rows

    async def next(self, timeout: float) -> list[Frame] | None:
        """The next frames in order; None when `timeout` passed with nothing new."""
        try:
            message = await asyncio.wait_for(
                self.layer.receive(self.channel), timeout=min(timeout, settings.WS_RESYNC_S)
            )
        except TimeoutError:
            rows = await self.catch_up()
            return rows or None
        frame: Frame = dict(frame_of(message))
        seq = frame["seq"]
        if seq is None:
            return [frame]
        if seq <= self.last_seq:
            return []
        if seq > self.last_seq + 1:
            # Committed before it was published: the database has it and what came before.
            return await self.catch_up()
        self.last_seq = seq
        return [frame]


@dataclass(frozen=True)
class Turn:
    """What the request's answer needs to know about the turn it posted."""

    posted: TurnPosted
    chat: ChatRequest
    owner_id: int
    actor: str
    wait_s: float


async def answer(frames: TurnFrames, turn: Turn) -> AsyncIterator[bytes]:
    """The response body: SSE chunks while the turn runs, or one chat.completion at its end.

    1. Read the turn's frames (persisted ones after the post's `after_seq`) into a
       `TurnReader` until the turn finishes or pauses, or `wait_s` passes.
    2. Streaming: the role chunk, a content chunk per piece of text, the finish
       chunk, the usage chunk if asked for, `[DONE]`. Not streaming: one object.
    3. Usage is what the session's token totals grew by since the post.
    4. A client gone before the end (the server cancels this generator) cancels
       the turn, as pressing stop would; a pause or a timeout leaves it as it is.
    """
    session_id = str(turn.posted.session_id)
    frames.last_seq = turn.posted.after_seq
    reader = TurnReader(session_id=session_id)
    writer = ChunkWriter(
        id_=f"chatcmpl-{session_id.replace('-', '')}-{turn.posted.after_seq}",
        model=turn.chat.model,
        include_usage=turn.chat.include_usage,
    )
    stream = turn.chat.stream
    ended = False
    try:
        if stream:
            yield writer.role()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + turn.wait_s
        pending = await frames.catch_up()
        while reader.outcome is None:
            for frame in pending:
                text = reader.feed(frame)
                if text and stream:
                    yield writer.content(text)
                if reader.outcome is not None:
                    break
            if reader.outcome is not None:
                break
            if reader.paused is not None:
                # A step commits its events together: the pause's details are stored by now.
                for frame in await frames.catch_up():
                    text = reader.feed(frame)
                    if text and stream:
                        yield writer.content(text)
                text = reader.settle()
                if text and stream:
                    yield writer.content(text)
                if reader.outcome is not None:
                    break
            remaining = deadline - loop.time()
            if remaining <= 0:
                reader.timed_out()
                break
            got = await frames.next(timeout=min(remaining, KEEPALIVE_S))
            if got is None and stream:
                yield KEEPALIVE
            pending = got or []
        outcome = reader.outcome
        if outcome is None:  # the loop above ends only once the reader has one
            raise RuntimeError("the turn's frames ended without an outcome")
        usage = await _usage(outcome, turn)
        if stream:
            yield writer.finish(outcome.finish_reason, outcome.extension)
            if turn.chat.include_usage:
                yield writer.usage(usage)
            yield DONE
        else:
            body = completion(
                id_=writer.id_,
                model=turn.chat.model,
                content=outcome.content,
                finish_reason=outcome.finish_reason,
                usage=usage,
                extension=outcome.extension,
                created=writer.created,
            )
            yield json.dumps(body, ensure_ascii=False).encode()
        ended = True
    finally:
        cleanup = asyncio.ensure_future(_end(frames, turn, cancel=not ended and not reader.outcome))
        _cleanups.add(cleanup)
        cleanup.add_done_callback(_cleanups.discard)


async def _usage(outcome: Outcome, turn: Turn) -> Any:
    if outcome.totals is not None:
        totals = outcome.totals
    else:
        totals = await database_sync_to_async(selectors.session_tokens)(
            session_id=turn.posted.session_id
        )
    before = turn.posted.tokens_before
    return usage_of(max(totals[0] - before[0], 0), max(totals[1] - before[1], 0))


async def _end(frames: TurnFrames, turn: Turn, *, cancel: bool) -> None:
    await frames.leave()
    if cancel:
        try:
            await database_sync_to_async(_cancel)(
                str(turn.posted.session_id), turn.owner_id, turn.actor
            )
        except Exception:  # noqa: BLE001 - the turn then ends by itself
            logger.warning("cancelling %s after a disconnect failed", turn.posted.session_id)

"""One request's view of its turn: the session's frames, then the status and bytes of the answer.

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

from record.publisher import frames_of, group_name
from restapi.errors import SHOULD_RETRY
from runtime.deferred_response import DeferredResponse
from sessions import selectors as session_selectors
from sessions.services import session_cancel

from . import selectors
from .services import ChatClaim, TurnPosted
from .turns import ErrorReply, Outcome, TurnReader, failure_reply
from .wire import DONE, KEEPALIVE, ChatRequest, ChunkWriter, Usage, completion, sse, usage_of

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
        frames: list[Frame] = []
        # A group message carries one frame, or a step's frames in order.
        for carried in frames_of(message):
            frame: Frame = dict(carried)
            seq = frame["seq"]
            if seq is None:
                frames.append(frame)
                continue
            if seq <= self.last_seq:
                continue
            if seq > self.last_seq + 1:
                # Committed before it was published: the database has it, what came
                # before and the rest of this message.
                return frames + await self.catch_up()
            self.last_seq = seq
            frames.append(frame)
        return frames


@dataclass(frozen=True)
class Turn:
    """What the request's answer needs to know about the turn it posted."""

    posted: TurnPosted
    chat: ChatRequest
    owner_id: int
    actor: str
    wait_s: float
    # A keyed request's claim on its turn (services.chat_request_claim); None without a key.
    claim: ChatClaim | None = None
    # The agent answering when the turn was posted (the session's, after a handoff);
    # a handoff during the turn changes the `model` the response names.
    model: str = ""


class TurnAnswer:
    """One request's answer to the turn it posted: the `Answer` of its DeferredResponse.

    The status is decided once it is known (runtime/deferred_response.py):

    - Not streaming: wait for the turn's end (or pause, or `wait_s`), then 200 with one
      chat.completion, or the failure's HTTP error (`turns.failure_reply`).
    - Streaming: wait for the first text, the end, or KEEPALIVE_S, whichever comes first;
      a failure by then is an HTTP error too. Otherwise 200, then the role chunk, a
      content chunk per piece of text, and the finish chunk, the usage chunk if asked
      for and `[DONE]`; or, for a failure once the stream has started, one error chunk
      (`data: {"error": {...}}`, what the openai SDK raises `APIError` for) and the end,
      without `[DONE]`.

    Usage is what the session's token totals grew by since the post. A client gone before
    the turn ended (the server cancels the wait) cancels the turn, as pressing stop would;
    a pause or a timeout leaves it as it is. A keyed request's client (one that may retry)
    cancels it only if no retry re-attached within IDEMPOTENCY_RETRY_GRACE_S.
    """

    def __init__(self, frames: TurnFrames, turn: Turn) -> None:
        session_id = str(turn.posted.session_id)
        self.frames = frames
        self.turn = turn
        # A retry re-attached to a turn under way missed its first text: it gets the answer
        # whole, once stored (the reader sends what the deltas did not carry).
        reattached = turn.claim is not None and turn.claim.reattached
        self.reader = TurnReader(
            session_id=session_id, buffer_answer=turn.chat.json_answer or reattached
        )
        self.writer = ChunkWriter(
            id_=f"chatcmpl-{session_id.replace('-', '')}-{turn.posted.after_seq}",
            model=turn.model or turn.chat.model,
            include_usage=turn.chat.include_usage,
        )
        self._pieces: AsyncIterator[str | None] = self._follow()

    async def _follow(self) -> AsyncIterator[str | None]:
        """The turn's text as it comes (None when KEEPALIVE_S passed without any), until
        the reader has the turn's outcome: its end, a pause, or `wait_s` gone."""
        reader, frames = self.reader, self.frames
        frames.last_seq = self.turn.posted.after_seq
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.turn.wait_s
        pending = await frames.catch_up()
        while True:
            for frame in pending:
                text = reader.feed(frame)
                if reader.agent:
                    self.writer.model = reader.agent  # a handoff: the new agent answers
                if text:
                    yield text
                if reader.outcome is not None:
                    return
            if reader.paused is not None:
                # A step commits its events together: the pause's details are stored by now.
                for frame in await frames.catch_up():
                    text = reader.feed(frame)
                    if text:
                        yield text
                text = reader.settle()
                if text:
                    yield text
                if reader.outcome is not None:
                    return
            remaining = deadline - loop.time()
            if remaining <= 0:
                text = reader.timed_out()
                if text:
                    yield text
                return
            got = await frames.next(timeout=min(remaining, KEEPALIVE_S))
            if got is None:
                yield None
            pending = got or []

    async def settle(self, response: DeferredResponse) -> AsyncIterator[bytes]:
        chat = self.turn.chat
        head: list[str] = []
        async for piece in self._pieces:
            if not chat.stream:
                continue  # the whole answer, once the turn has ended
            if piece:
                head.append(piece)
            break  # streaming: the first text, or KEEPALIVE_S of silence, starts the stream
        outcome = self.reader.outcome
        if outcome is not None and outcome.failure is not None:
            failed = await self._failure(outcome)
            response.status_code = failed.status
            response["Content-Type"] = "application/json"
            if failed.retry_after_s is not None:
                response["Retry-After"] = str(failed.retry_after_s)
            if failed.final:
                response[SHOULD_RETRY] = "false"
            return _once(json.dumps(failed.body, ensure_ascii=False).encode())
        response.status_code = 200
        if chat.stream:
            return self._stream(head)
        assert outcome is not None  # the pieces end only once the reader has an outcome
        usage = await self._usage(outcome)
        body = completion(
            id_=self.writer.id_,
            model=self.writer.model,
            content=outcome.content,
            finish_reason=outcome.finish_reason,
            usage=usage,
            extension=outcome.extension,
            created=self.writer.created,
            tool_calls=outcome.tool_calls,
        )
        return _once(json.dumps(body, ensure_ascii=False).encode())

    async def _stream(self, head: list[str]) -> AsyncIterator[bytes]:
        writer = self.writer
        yield writer.role()
        for text in head:
            yield writer.content(text)
        async for piece in self._pieces:
            yield writer.content(piece) if piece else KEEPALIVE
        outcome = self.reader.outcome
        if outcome is None:  # the pieces end only once the reader has an outcome
            raise RuntimeError("the turn's frames ended without an outcome")
        if outcome.failure is not None:
            failed = await self._failure(outcome)
            yield sse(failed.body)
            return
        usage = await self._usage(outcome)
        if outcome.tool_calls:
            yield writer.tool_calls(outcome.tool_calls)
        yield writer.finish(outcome.finish_reason, outcome.extension)
        if self.turn.chat.include_usage:
            yield writer.usage(usage)
        yield DONE

    async def _failure(self, outcome: Outcome) -> ErrorReply:
        assert outcome.failure is not None
        facts = await database_sync_to_async(selectors.turn_failure_facts)(
            session_id=self.turn.posted.session_id, turn=outcome.turn
        )
        return failure_reply(outcome.failure, facts)

    async def _usage(self, outcome: Outcome) -> Usage:
        if outcome.totals is not None:
            totals = outcome.totals
        else:
            totals = await database_sync_to_async(selectors.session_tokens)(
                session_id=self.turn.posted.session_id
            )
        before = self.turn.posted.tokens_before
        return usage_of(max(totals[0] - before[0], 0), max(totals[1] - before[1], 0))

    async def close(self) -> None:
        """Leave the session's group; cancel the turn if the client left before its end.
        Detached: the request's task may itself be cancelled (the client went away)."""
        cleanup = asyncio.ensure_future(
            _end(self.frames, self.turn, cancel=self.reader.outcome is None)
        )
        _cleanups.add(cleanup)
        cleanup.add_done_callback(_cleanups.discard)


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _end(frames: TurnFrames, turn: Turn, *, cancel: bool) -> None:
    await frames.leave()
    claim = turn.claim
    # Run on the request's own thread while it lasts; after the grace the request's context
    # is gone, and thread-sensitive calls would fail: any pool thread then.
    sensitive = True
    if cancel and claim is not None:
        # A client that may retry (it sent a key, or is the openai SDK, which retries a
        # timeout at once): its retry re-attaches to the turn, which must still be there.
        await asyncio.sleep(settings.IDEMPOTENCY_RETRY_GRACE_S)
        sensitive = False
        left = database_sync_to_async(selectors.turn_left_running, thread_sensitive=False)
        cancel = await left(
            record_id=claim.record_id,
            attempt=claim.attempt,
            session_id=turn.posted.session_id,
            after_seq=turn.posted.after_seq,
        )
    if cancel:
        try:
            await database_sync_to_async(_cancel, thread_sensitive=sensitive)(
                str(turn.posted.session_id), turn.owner_id, turn.actor
            )
        except Exception:  # noqa: BLE001 - the turn then ends by itself
            logger.warning("cancelling %s after a disconnect failed", turn.posted.session_id)

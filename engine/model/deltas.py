"""Streaming the model's text to clients in batches, and tool preparation as progress.

One channel message per token would flood Redis and the sockets; text is sent
at most every DELTA_FLUSH_MS. Tool-call JSON never reaches the user: a
`progress` frame says which tool is being prepared instead.
"""

import asyncio
import time
from uuid import UUID

from llm.types import StreamEvent, TextDelta, ToolCallStarted
from record.events import EventType, MessageDelta, Progress
from record.publisher import publish_ephemeral


class DeltaBatcher:
    """Lives on the io loop for the length of one model call."""

    def __init__(self, session_id: UUID | str, turn: int, flush_ms: int) -> None:
        self.session_id = session_id
        self.turn = turn
        self.interval = flush_ms / 1000
        self._pending: list[str] = []
        self._last_flush = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.sent_chars = 0

    def on_event(self, event: StreamEvent) -> None:
        if isinstance(event, TextDelta) and event.text:
            self._pending.append(event.text)
            now = time.monotonic()
            if now - self._last_flush >= self.interval:
                self.flush()
            elif self._timer is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # an instant model, run inline: flushed when it returns
                self._timer = loop.call_later(self.interval - (now - self._last_flush), self.flush)
        elif isinstance(event, ToolCallStarted):
            self.flush()
            preparing: Progress = {"stage": "preparing_tool", "tool": event.name, "turn": self.turn}
            publish_ephemeral(self.session_id, EventType.PROGRESS, preparing)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        self._last_flush = time.monotonic()
        self.sent_chars += len(text)
        delta: MessageDelta = {"text": text, "turn": self.turn}
        publish_ephemeral(self.session_id, EventType.MESSAGE_DELTA, delta)

"""Reading one turn from its session's frames: the text to send, and how the turn ended.

Pure Python: a fold over the frames of `sessions.publisher` (persisted ones in
`seq` order, ephemeral text deltas as they came). The edge feeds it every frame
of the request's turn and writes what it returns; tests feed it lists.
"""

from dataclasses import dataclass, field
from typing import Any

from .wire import Extension, FinishReason

# Stop reasons (sessions.events.StopReason values) that are an answer, and the one a
# model's refusal gives; any other ended the turn early, and the text says why.
ANSWERED = frozenset({"answer", "operator"})
REFUSED = "model_refused"


@dataclass
class Outcome:
    content: str
    finish_reason: FinishReason
    extension: Extension
    # The session's running token totals `turn.finished` reported; None for a pause.
    totals: tuple[int, int] | None = None


@dataclass
class TurnReader:
    session_id: str
    streamed: str = ""  # text sent to the client so far
    answer: str | None = None
    _since_completed: str = ""  # text streamed since the last assistant message completed
    _separate: bool = False  # an earlier assistant message was streamed: a paragraph break first
    _question: dict[str, Any] = field(default_factory=dict)
    _approval: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome | None = None
    # A pause the turn reached whose details (the question, the approval) may come in
    # the frames right after the state change; `settle()` ends it with what is known.
    paused: str | None = None

    def feed(self, frame: dict[str, Any]) -> str:
        """Take one frame; return the text to stream for it (may be "")."""
        kind, data = frame.get("type"), frame.get("data") or {}
        if self.outcome is not None:
            return ""
        if kind == "message.delta":
            if self.answer is not None:
                # A delta of the answer that came in after the stored answer was read.
                return ""
            return self._stream(str(data.get("text") or ""))
        if kind == "message.completed" and data.get("role") == "assistant":
            content = str(data.get("content") or "")
            already, self._since_completed = self._since_completed, ""
            if data.get("tool_calls"):
                # Text before tool calls was said on the way (streamed, set apart from what
                # follows by a blank line); it is not the answer.
                self._separate = self._separate or bool(already)
                return ""
            self.answer = content
            # Text the stream did not carry (a model that does not stream, or a lost
            # tail) is sent from the stored message, when what was sent is its start.
            if content.startswith(already):
                return self._stream(content[len(already) :], counted=False)
            return ""
        if kind == "progress" and data.get("stage") == "question":
            self._question = data
            if self.paused == "paused_for_user":
                return self.settle()
        elif kind == "approval.requested":
            self._approval = data
            if self.paused == "awaiting_approval":
                return self.settle()
        elif kind == "state.changed":
            to = str(data.get("to") or "")
            if to in ("paused_for_user", "awaiting_approval", "waiting_timer"):
                self.paused = to
                if (
                    to == "waiting_timer"
                    or (to == "paused_for_user" and self._question)
                    or (to == "awaiting_approval" and self._approval)
                ):
                    return self.settle()
            else:
                self.paused = None  # the turn went on
        elif kind == "turn.finished":
            return self._finished(data)
        return ""

    def _stream(self, text: str, counted: bool = True) -> str:
        if not text:
            return ""
        if counted:
            self._since_completed += text
        if self._separate:
            text = "\n\n" + text
            self._separate = False
        self.streamed += text
        return text

    def settle(self) -> str:
        """End a pause the turn reached with the details known so far; "" if none."""
        if self.paused is None or self.outcome is not None:
            return ""
        return self._paused(self.paused)

    def _paused(self, state: str) -> str:
        ext: Extension = {"session_id": self.session_id, "status": ""}
        if state == "paused_for_user":
            question = str(self._question.get("question") or "")
            options = [str(o) for o in self._question.get("options") or []]
            ext["status"], ext["question"], ext["options"] = "awaiting_user", question, options
            text = question + (f" (options: {', '.join(options)})" if options else "")
        elif state == "awaiting_approval":
            tool = str(self._approval.get("tool") or "a tool call")
            approval_id = str(self._approval.get("approval_id") or "")
            ext["status"], ext["approval_id"] = "awaiting_approval", approval_id
            text = (
                f"Waiting for approval of {tool} (approval {approval_id}). The turn goes on once "
                "an approver decides; its answer is in the session's messages."
            )
        elif state == "waiting_timer":
            ext["status"] = "waiting_timer"
            text = "The agent is waiting on a timer; the turn goes on when it fires."
        else:
            return ""
        self._separate = bool(self.streamed)
        sent = self._stream(text, counted=False)
        self.outcome = Outcome(content=self.streamed, finish_reason="stop", extension=ext)
        return sent

    def _finished(self, data: dict[str, Any]) -> str:
        stop = str(data.get("stop_reason") or "")
        sent = ""
        if self.answer is None and stop not in ANSWERED:
            self._separate = bool(self.streamed)
            sent = self._stream(f"(The turn ended without an answer: {stop}.)", counted=False)
        usage = data.get("usage") or {}
        finish: FinishReason = "content_filter" if stop == REFUSED else "stop"
        content = self.answer if self.answer is not None else self.streamed
        self.outcome = Outcome(
            content=content,
            finish_reason=finish,
            extension={"session_id": self.session_id, "status": "finished", "stop_reason": stop},
            totals=(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)),
        )
        return sent

    def timed_out(self) -> Outcome:
        self.outcome = Outcome(
            content=self.answer if self.answer is not None else self.streamed,
            finish_reason="length",
            extension={"session_id": self.session_id, "status": "timeout"},
        )
        return self.outcome

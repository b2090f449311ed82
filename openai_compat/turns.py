"""Reading one turn from its session's frames: the text to send, and how the turn ended.

Pure Python: a fold over the frames of `record.publisher` (persisted ones in
`seq` order, ephemeral text deltas as they came). The edge feeds it every frame
of the request's turn and writes what it returns; tests feed it lists. A turn
that ended in a failure (no model could answer, an answer that is not the JSON
asked for, no budget left) is not an answer: `failure_reply` says which HTTP
error it is.
"""

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .wire import ErrorBody, Extension, FinishReason, WireToolCall, error_body, wire_tool_call

# Stop reasons (record.events.StopReason values) that are an answer; any other ended the
# turn early: the text says why, unless it is a failure (FAILED), which is an HTTP error.
ANSWERED = frozenset({"answer", "operator"})
FAILED = frozenset(
    {
        "model_unavailable",
        "model_refused",
        "invalid_output",
        "error",
        "budget_exceeded",
        "insufficient_credits",
    }
)


@dataclass
class Outcome:
    content: str
    finish_reason: FinishReason
    extension: Extension
    # The session's running token totals `turn.finished` reported; None for a pause.
    totals: tuple[int, int] | None = None
    # The stop reason of a turn that failed (one of FAILED), and its number.
    failure: str | None = None
    turn: int | None = None
    # The turn called the client's own tools: the client runs them and sends the results.
    tool_calls: list[WireToolCall] | None = None


@dataclass
class TurnReader:
    session_id: str
    # Send the answer whole once it is stored, not as it streams: an answer in a
    # response_format may be repaired, and a stream cannot take back a wrong first try.
    buffer_answer: bool = False
    streamed: str = ""  # text sent to the client so far
    answer: str | None = None
    _since_completed: str = ""  # text streamed since the last assistant message completed
    _separate: bool = False  # an earlier assistant message was streamed: a paragraph break first
    _question: dict[str, Any] = field(default_factory=dict)
    _approval: dict[str, Any] = field(default_factory=dict)
    _client_calls: list[dict[str, Any]] = field(default_factory=list)
    _said_with_calls: str = ""  # the text of the model's last message with tool calls
    outcome: Outcome | None = None
    # A pause the turn reached whose details (the question, the approval) may come in
    # the frames right after the state change; `settle()` ends it with what is known.
    paused: str | None = None
    # The stored answer's text the deltas did not carry, sent once `turn.finished` says
    # it is an answer: a failed turn stores the agent's busy message, which is not one.
    _held: str = ""
    # The agent a handoff (`agent.changed`) in this turn gave the conversation to.
    agent: str = ""

    def feed(self, frame: dict[str, Any]) -> str:
        """Take one frame; return the text to stream for it (may be "")."""
        kind, data = frame.get("type"), frame.get("data") or {}
        if self.outcome is not None:
            return ""
        if kind == "message.delta":
            if self.answer is not None or self.buffer_answer:
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
                self._said_with_calls = content
                return ""
            self.answer = content
            # Text the stream did not carry (a model that does not stream, or a lost
            # tail) is sent from the stored message, when what was sent is its start:
            # once the turn's end (in the same commit, the next frame) says it answered.
            if content.startswith(already):
                self._held = content[len(already) :]
            return ""
        if kind == "progress" and data.get("stage") == "question":
            self._question = data
            if self.paused == "paused_for_user":
                return self.settle()
        elif kind == "progress" and data.get("stage") == "client_tools":
            self._client_calls = [c for c in data.get("calls") or [] if isinstance(c, dict)]
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
                    or (to == "paused_for_user" and (self._question or self._client_calls))
                    or (to == "awaiting_approval" and self._approval)
                ):
                    return self.settle()
            else:
                self.paused = None  # the turn went on
        elif kind == "agent.changed":
            self.agent = str(data.get("to") or "") or self.agent
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
        if state == "paused_for_user" and self._client_calls:
            ext["status"] = "awaiting_tool_results"
            self.outcome = Outcome(
                content=self._said_with_calls,
                finish_reason="tool_calls",
                extension=ext,
                tool_calls=[
                    wire_tool_call(
                        str(c.get("call_id") or ""), str(c.get("tool") or ""), c.get("input")
                    )
                    for c in self._client_calls
                ],
            )
            return ""
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
        usage = data.get("usage") or {}
        totals = (int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))
        extension: Extension = {
            "session_id": self.session_id,
            "status": "finished",
            "stop_reason": stop,
        }
        turn = data.get("turn")
        turn = turn if isinstance(turn, int) else None
        if stop in FAILED:
            self.outcome = Outcome(
                content="",
                finish_reason="stop",
                extension=extension,
                totals=totals,
                failure=stop,
                turn=turn,
            )
            return ""
        sent = self._release()
        if self.answer is None and stop not in ANSWERED:
            self._separate = bool(self.streamed)
            sent += self._stream(f"(The turn ended without an answer: {stop}.)", counted=False)
        content = self.answer if self.answer is not None else self.streamed
        self.outcome = Outcome(
            content=content,
            finish_reason="stop",
            extension=extension,
            totals=totals,
            turn=turn,
        )
        return sent

    def _release(self) -> str:
        held, self._held = self._held, ""
        return self._stream(held, counted=False)

    def timed_out(self) -> str:
        """End the wait with what the turn said so far; return the text still to send."""
        sent = self._release()
        self.outcome = Outcome(
            content=self.answer if self.answer is not None else self.streamed,
            finish_reason="length",
            extension={"session_id": self.session_id, "status": "timeout"},
        )
        return sent


# Failures --------------------------------------------------------------------------------

# How soon a client may try again after the model's rate limit, when no breaker says.
RATE_LIMITED_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class FailureFacts:
    """What the database holds about a failed turn: the session's last_error and the
    outcomes of its last step's model calls (the primary's, then the fallback's)."""

    last_error: str = ""
    outcomes: tuple[str, ...] = ()
    # Seconds until the rate-limited endpoints take calls again (their breakers), if known.
    retry_after_s: float | None = None
    # A side-effecting tool call of the turn was sent: a retry would send another.
    side_effects: bool = False


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: ErrorBody
    retry_after_s: int | None = None  # the Retry-After header, for a 503
    # A retry would not cure it, or would repeat a side effect: `x-should-retry: false`.
    final: bool = False


def failure_reply(stop_reason: str, facts: FailureFacts) -> ErrorReply:
    """The HTTP error of a failed turn (`_failure_reply`), final (`x-should-retry: false`)
    when a retry would not cure it (a refusal as configured, no budget or credits left) or
    when a side effect ran in the turn: the client libraries retry a 5xx by default, and
    each retry would be a new turn that sends it again."""
    reply = _failure_reply(stop_reason, facts)
    final = facts.side_effects or reply.status == 429 or stop_reason == "model_refused"
    return replace(reply, final=final)


def _failure_reply(stop_reason: str, facts: FailureFacts) -> ErrorReply:
    """The HTTP error of a turn that ended in a failure (a stop reason of FAILED).

    - No model could answer: 502 `model_unavailable` (timeouts, 5xx, a cut stream, the
      breaker open); 503 `model_overloaded` with Retry-After when a call was rate limited
      (the capacity comes back: the SDKs retry it); 502 `model_refused` when the provider
      refused the request as configured (a bad key, an unknown model: the operator's to fix).
    - An answer still not valid for `response_format` after one repair: 502 `invalid_json`.
    - The turn failed inside the platform: 500 `turn_failed`.
    - The budget or the credits ran out mid-turn: 429 `insufficient_quota`, as OpenAI
      says when an account cannot pay (the request's own check says so before a turn).
    """
    reason = facts.last_error.strip()
    said = f": {reason}" if reason else "."
    if stop_reason == "model_unavailable" and "rate_limited" in facts.outcomes:
        wait = facts.retry_after_s
        return ErrorReply(
            503,
            error_body(
                f"The agent's model is overloaded; retry after a while{said}",
                "server_error",
                "model_overloaded",
            ),
            retry_after_s=max(1, math.ceil(wait)) if wait else RATE_LIMITED_RETRY_AFTER_S,
        )
    if stop_reason == "model_unavailable":
        return ErrorReply(
            502, error_body(f"No model could answer{said}", "server_error", "model_unavailable")
        )
    if stop_reason == "model_refused":
        return ErrorReply(
            502,
            error_body(
                f"The agent's model refused the call as configured{said}",
                "server_error",
                "model_refused",
            ),
        )
    if stop_reason == "invalid_output":
        return ErrorReply(
            502,
            error_body(
                f"The model's answer is not valid for response_format, after one repair{said}",
                "server_error",
                "invalid_json",
                "response_format",
            ),
        )
    if stop_reason in ("budget_exceeded", "insufficient_credits"):
        code = "budget_exceeded" if stop_reason == "budget_exceeded" else "insufficient_quota"
        return ErrorReply(
            429,
            error_body(
                f"The turn stopped before its answer ({stop_reason}){said}",
                "insufficient_quota",
                code,
            ),
        )
    return ErrorReply(
        500, error_body(f"The turn failed ({stop_reason}){said}", "server_error", "turn_failed")
    )

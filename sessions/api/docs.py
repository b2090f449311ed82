"""What the schema tells a customer's developer about each sessions operation.

One `extend_schema` per operation, stacked on the view's own (which names the
serializers): a summary, a description (what it does, who may call it, the errors it
gives and when, paging, retries) and examples that work against the demo `make run`
sets up (the agent `order-support`). The first request example is what Swagger UI's
"Try it out" fills in. tests/e2e/test_api_examples.py sends them to a live server.
"""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema

from restapi.schema import IDEMPOTENCY_KEY_PARAMETER, error_example

SESSION_ID = "0b6f2a4e-5d1c-4e8f-9a3b-7c2d1e0f4a5b"
CREATED_AT = "2026-12-06T09:00:00.000000Z"

SESSION = {
    "id": SESSION_ID,
    "agent": "order-support",
    "role": "support",
    "metadata": {"customer_ref": "crm-4711"},
    "state": "idle",
    "version": 0,
    "turn": 0,
    "queued_count": 0,
    "value": 1.0,
    "ephemeral": False,
    "usage": {"input_tokens": 0, "output_tokens": 0, "cost": "0.000000"},
    "last_error": "",
    "last_turn": None,
    "workflow": None,
    "parent": None,
    "created_at": CREATED_AT,
    "updated_at": CREATED_AT,
}

FINISHED_SESSION = {
    **SESSION,
    "state": "finished",
    "version": 4,
    "turn": 1,
    "usage": {"input_tokens": 412, "output_tokens": 38, "cost": "0.000000"},
    "last_turn": {
        "turn": 1,
        "outcome": "ok",
        "calls": {"ok": 1, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0},
    },
    "updated_at": "2026-12-06T09:00:02.310000Z",
}

USER_MESSAGE = {
    "id": 1,
    "seq": 1,
    "turn": 1,
    "role": "user",
    "status": "final",
    "content": "Where is order SO-1001?",
    "tool_calls": [],
    "tool_call_id": "",
    "name": "",
    "token_count": 10,
    "idempotency_key": "order-SO-1001-question",
    "extra_context": None,
    "created_at": CREATED_AT,
}

NOT_FOUND = error_example(404, "not_found", f"session {SESSION_ID} not found")

SESSION_PARAMETER = OpenApiParameter(
    "session_id",
    str,
    OpenApiParameter.PATH,
    description="The session's `id`, as `POST /api/v1/sessions/` or `GET /api/v1/sessions/` "
    "gave it.",
)


def _limit(default: int, high: int, what: str) -> OpenApiParameter:
    return OpenApiParameter(
        "limit", int, description=f"How many {what} a page holds: 1 to {high}, default {default}."
    )


UNKNOWN_AGENT = error_example(
    400, "unknown_agent", "unknown agent 'order-suport'", {"field": "agent"}
)

session_list = extend_schema(
    parameters=[_limit(20, 200, "sessions")],
    summary="List your sessions",
    description="""
Your sessions, newest first: every session whose owner is your key's user.

- `limit` (1-200, default 20) caps a page. While older sessions exist, the response has a
  `Link: </api/v1/sessions/?limit=20&before=CURSOR>; rel="next"` header: request that URL
  for the next page. Sessions created meanwhile do not shift the pages.
- Stateless requests of the OpenAI-compatible endpoint (no `X-Session-Id`) make short-lived
  sessions that are left out unless `ephemeral=true`.

Errors: 400 `invalid_input` for a `limit` out of range, an `ephemeral` that is not
true/false, or a `before` that no Link header gave.
""",
    examples=[OpenApiExample("Your sessions", value=FINISHED_SESSION, response_only=True)],
)

session_create = extend_schema(
    summary="Open a session on an agent",
    description="""
Creates a conversation with an agent, owned by your key's user. Nothing runs yet: post a
message to start a turn. Not idempotent: each call creates a new session.

- `agent`: the agent's slug (`GET /api/v1/agents/` lists them; the demo's is
  `order-support`).
- `metadata`: your own JSON (a customer reference, a ticket number), returned as is; at
  most 16 KiB.
- `role`: which of your key's roles the session runs with (default: the key's first). It
  decides which tools the agent may use and which keys may post to the session.
- `value`: what the session is worth to you; when credits or workers are scarce, higher
  value goes first. Default: the agent's. Above it only as far as an operator allowed
  your key.

Errors: 400 `unknown_agent` (no enabled agent has that slug), 400 `invalid_input` (an
unknown field, a `role` your key does not hold), 403 `value_not_allowed` (a `value`
above what your key may set), 413 `payload_too_large` (`metadata` too large), 429
`rate_limited` (too many sessions created in a minute).
""",
    examples=[
        OpenApiExample(
            "Demo agent",
            value={"agent": "order-support", "metadata": {"customer_ref": "crm-4711"}},
            request_only=True,
        ),
        OpenApiExample("Created", value=SESSION, response_only=True, status_codes=[201]),
        UNKNOWN_AGENT,
        error_example(
            403,
            "value_not_allowed",
            "value 50 is above what this API key may set (at most 1); an operator grants "
            "more with the key's max_value",
            {"field": "value", "max_value": 1.0},
        ),
    ],
)

session_retrieve = extend_schema(
    parameters=[SESSION_PARAMETER],
    summary="Get a session",
    description="""
A session's state, version (it grows with every step), turn number, usage (tokens and
cost so far), `last_turn` (how the last ended turn went: its `outcome` and its tool
calls by result; null before any turn ended), `workflow` (for a workflow run: where it
stands and, at the end, its result) and `children` (sessions its agent started).

Poll this, or better follow the events, to see where a turn stands: `processing`,
`tool_wait` and `tool_loop` while it runs; `awaiting_approval` (a person must decide a
tool call), `paused_for_user` (the agent asked the user something), `waiting_timer` or
`waiting_credits` (a paid call waits for its credit pool's points) while it waits; `finished` once it answered, `cancelled` or `error` when it stopped. A new
message starts the next turn from `idle`, `finished`, `cancelled` or `error`.

Errors: 404 `not_found` when no session of yours has this id.
""",
    examples=[
        OpenApiExample(
            "After a turn",
            value={**FINISHED_SESSION, "children": []},
            response_only=True,
        ),
        NOT_FOUND,
    ],
)

message_list = extend_schema(
    parameters=[SESSION_PARAMETER, _limit(20, 1000, "messages")],
    summary="Read a session's messages",
    description="""
The conversation, oldest first: the user's messages, the agent's answers and tool calls,
and the tool results. Messages that wait for their turn (sent while a turn ran) come last
with `status: queued`.

- `limit` (1-1000, default 20): the newest `limit` messages.
- While older ones exist, a `Link: <...?before=SEQ&limit=N>; rel="next"` header names the
  page before; `before` takes that seq.

Errors: 400 `invalid_input` for a `limit` or `before` out of range; 404 `not_found`.
""",
    examples=[OpenApiExample("A user message", value=USER_MESSAGE, response_only=True), NOT_FOUND],
)

message_create = extend_schema(
    parameters=[SESSION_PARAMETER, IDEMPOTENCY_KEY_PARAMETER],
    summary="Send a message (starts a turn)",
    description="""
Adds the user's message and starts a turn. The answer is not in the response: the run
goes on in the background. Follow it on the websocket (see the overview) or with
`GET .../events/?after=SEQ` until the `turn.finished` event, then read the answer in
`GET .../messages/`.

- 202: accepted and stored; the turn runs (or waits behind the running one).
- `idempotency_key` (or the `Idempotency-Key` header; up to 200 characters, per owner)
  makes a retry safe: the same key with the same content answers 200 with the first
  message and starts nothing; with other content or another session, 409
  `idempotency_key_reused`.
- `extra_context`: data from your app for this turn (the page the user is on, their
  plan). The model reads it as data, never as instructions.
- `webhook`: `{"url": ...}` is POSTed this turn's outcome, answer and usage when it ends,
  signed (docs/schedules-and-webhooks.md); a URL the egress policy refuses is a 400
  naming `webhook.url`.
- While a turn runs, the agent's policy decides: the message waits for its turn
  (`status: queued`), interrupts the running turn, or is refused with 409
  `turn_in_progress`. When the agent asked the user a question, the message is the
  answer.

Only a key holding the session's role may post (403 `role_not_held`).

Errors: 400 `invalid_input` (empty `content`, an unknown field, a NUL character), 403
`role_not_held`, 404 `not_found`, 409 `turn_in_progress`, `idempotency_key_reused` or
`not_a_conversation` (a workflow run takes no messages), 413 `payload_too_large`
(`content` over 32,000 characters, `extra_context` over 8 KiB).
""",
    examples=[
        OpenApiExample(
            "Ask about an order",
            # No idempotency_key: a key is its owner's across sessions for a day, so "Try
            # it out" on a second session would meet the first's key (409).
            value={"content": "Where is order SO-1001?"},
            request_only=True,
        ),
        OpenApiExample(
            "The full demo task",
            value={
                "content": "find last week's orders with logistics exceptions, notify each "
                "customer, then write a report",
                "extra_context": {"page": "orders", "plan": "gold"},
            },
            request_only=True,
        ),
        OpenApiExample("Accepted", value=USER_MESSAGE, response_only=True, status_codes=[202]),
        OpenApiExample(
            "A repeated idempotency_key", value=USER_MESSAGE, response_only=True, status_codes=[200]
        ),
        error_example(
            400, "invalid_input", "content must be a non-empty string", {"field": "content"}
        ),
        error_example(
            409,
            "idempotency_key_reused",
            "idempotency_key was already used with a different content or extra_context",
            {"idempotency_key": "order-SO-1001-question"},
        ),
        error_example(
            403,
            "role_not_held",
            "this API key does not hold the role 'support' the session runs with "
            "(the key holds: analyst)",
            {"role": "support", "key_roles": ["analyst"]},
        ),
        error_example(
            413,
            "payload_too_large",
            "content has 40000 characters; the limit is 32000",
            {"field": "content", "limit": 32000},
        ),
        NOT_FOUND,
    ],
)

event_list = extend_schema(
    parameters=[
        SESSION_PARAMETER,
        OpenApiParameter(
            "after", int, description="Only events after this seq (0, the default: from the start)."
        ),
        _limit(500, 1000, "events"),
    ],
    summary="Read a session's events",
    description="""
What happened in the session, in order: state changes, messages, tool calls and their
results, approvals, and `turn.finished` at the end of each turn. The same events (and the
same `data`) as the websocket's frames; the event types are listed on the websocket
protocol page linked in the overview. Each event has a `seq` that grows by one per
session.

- `after` (default 0): only events after this seq. Poll with the last seq you saw.
- `limit` (1-1000, default 500), and about 1 MiB of data a page (at least one event).
  While more follow, a `Link: <...?after=SEQ&limit=N>; rel="next"` header names the next
  page; no header means you have everything stored so far.

Streamed answer text (`message.delta`) is not stored and only comes over the websocket.

Errors: 400 `invalid_input` for an `after` or `limit` out of range; 404 `not_found`.
""",
    examples=[
        OpenApiExample(
            "A state change",
            value={
                "seq": 1,
                "type": "state.changed",
                "session": SESSION_ID,
                "ts": CREATED_AT,
                "data": {
                    "from": "idle",
                    "to": "processing",
                    "trigger": "user_message",
                    "reason": "",
                },
            },
            response_only=True,
        ),
        NOT_FOUND,
    ],
)

session_cancel = extend_schema(
    parameters=[SESSION_PARAMETER],
    summary="Cancel the running turn",
    description="""
Stops the session's current turn: a tool call that is running finishes and is recorded,
a model answer being streamed is cut off, and the turn ends with `stop_reason:
cancelled` (a `turn.finished` event says so). The session stays usable: post a new
message to start another turn.

`cancelled` is false when nothing was running; repeating a cancel is harmless. Any key of
the session's owner may cancel.

Errors: 404 `not_found`.
""",
    examples=[
        OpenApiExample(
            "Nothing was running",
            value={"cancelled": False, "session": FINISHED_SESSION},
            response_only=True,
        ),
        NOT_FOUND,
    ],
)

checkpoint_list = extend_schema(
    parameters=[SESSION_PARAMETER, _limit(100, 1000, "checkpoints")],
    summary="List a session's checkpoints",
    description="""
The points a session can be forked from, newest first: one per step of its runs, with
the step number, the turn, the state after it and how many messages it had. Pass a
`step` to `POST .../fork/` as `checkpoint`.

`limit` (1-1000, default 100). Errors: 400 `invalid_input` for a `limit` out of range;
404 `not_found`.
""",
    examples=[
        OpenApiExample(
            "After the first step",
            value={
                "step": 1,
                "turn": 1,
                "state": "processing",
                "message_seq": 1,
                "context": {},
                "fingerprint": "9c1f0e7d",
                "size_bytes": 412,
                "created_at": CREATED_AT,
            },
            response_only=True,
        ),
        NOT_FOUND,
    ],
)

session_fork = extend_schema(
    parameters=[SESSION_PARAMETER],
    summary="Fork a session from a checkpoint",
    description="""
Creates a new session from one of this session's checkpoints: the conversation up to
that step is copied and the original is left untouched. If the copy ends with a user
message or tool results, the agent carries on in the new session at once (tools with
side effects may run again); otherwise it waits for your next message. Not idempotent:
each call creates a new session (counted against the sessions-per-minute limit).

- `checkpoint`: a `step` from `GET .../checkpoints/`.
- `role`: the fork's role, one your key holds (default: the session's).

Errors: 400 `invalid_input` (a missing or non-integer `checkpoint`), 403 `role_not_held`,
404 `not_found` (no such session, or no checkpoint with that step), 429 `rate_limited`.
""",
    examples=[
        OpenApiExample("From step 1", value={"checkpoint": 1}, request_only=True),
        OpenApiExample(
            "The fork",
            value={**SESSION, "id": "6a1d0c3e-2f4b-4d5a-8e9f-0a1b2c3d4e5f"},
            response_only=True,
            status_codes=[201],
        ),
        error_example(
            404,
            "not_found",
            f"session {SESSION_ID} has no checkpoint 99",
            {"field": "checkpoint"},
            name="no_such_checkpoint",
        ),
    ],
)

session_resume = extend_schema(
    parameters=[SESSION_PARAMETER],
    summary="Resume a session that failed",
    description="""
Continues a run that stopped in the `error` state (see `last_error`) from where it
stopped, once the cause is fixed (a model or tool back up). Only a key holding the
session's role may resume it.

Errors: 403 `role_not_held`, 404 `not_found`, 409 `not_resumable` (the session is not in
`error`; resuming twice gives this the second time).
""",
    examples=[
        OpenApiExample("Resumed", value={**SESSION, "state": "tool_loop"}, response_only=True),
        error_example(
            409, "not_resumable", "only a session in error can be resumed; this one is idle"
        ),
    ],
)

session_graph = extend_schema(
    parameters=[
        SESSION_PARAMETER,
        OpenApiParameter(
            "format",
            str,
            enum=["svg", "json"],
            description="Instead of the Accept header: `svg` for the drawing, `json` to get "
            "errors as JSON.",
        ),
    ],
    summary="Draw a workflow run's graph",
    description="""
The workflow a run follows, drawn as SVG: nodes coloured by what the run did (visited,
active, failed) with how many times each ran. Fetch it again on each `node.*` event to
watch the run advance. With `Accept: application/json`, errors come as JSON.

Errors: 404 `not_found`, or 404 `not_a_workflow_run` for a conversation.
""",
    examples=[
        error_example(
            404,
            "not_a_workflow_run",
            f"session {SESSION_ID} is a conversation, not a workflow run",
        ),
    ],
)

agent_list = extend_schema(
    summary="List the agents",
    description="""
The enabled agents a session can be opened on: their `slug` (what `POST /sessions/`
takes as `agent`, and the OpenAI-compatible endpoint as `model`), their name and their
latest configuration `version` (what an evaluation's candidate `{"agent_version":
"<slug>@<number>"}` names; null while none is stored). Any
key may list them.
""",
    examples=[
        OpenApiExample(
            "The demo agent",
            value={"slug": "order-support", "name": "Order support (offline demo)", "version": 1},
            response_only=True,
        )
    ],
)

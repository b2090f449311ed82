"""The API's documentation that is not one operation's: the schema's overview and the
websocket protocol page that the overview links to.

The websocket page (templates/docs/websocket.html) is the one description of the
protocol; the README and the overview link to it instead of copying it.
"""

from typing import Any

from django.views.generic import TemplateView

WEBSOCKET_PAGE = "/api/v1/docs/websocket/"

OVERVIEW = f"""
Talk to the platform's agents from your app: open a **session** on an agent, post the
user's **messages**, and follow the run as **events** (over REST, or live over the
[websocket]({WEBSOCKET_PAGE})). Every request example on this page works against the
offline demo that `make run` starts: the agent `order-support`, the workflows
`logistics-exceptions` and `refund`, the orders `SO-1001` to `SO-1006`.

**Authentication.** Every request carries `Authorization: Bearer <api key>` (press
*Authorize* below and paste the key; `make run` prints the demo key, user `demo`, role
`support`). A key sees only its own user's sessions: anybody else's is a 404. A key
carries roles; a session's role decides which tools its agent may use, and only a key
holding that role may run its turns (403 `role_not_held`).

**Errors.** Every error has one shape, with the HTTP status that fits:

```json
{{"error": {{"code": "unknown_agent", "message": "unknown agent 'nope'", "details": {{"field": "agent"}}}}}}
```

`code` is stable (branch on it), `message` is for a person, `details` says which field
or limit. 400 bad input (`invalid_input`, `malformed_json`, `unknown_agent`), 401 no or a
bad key, 403 the key may not do this, 404 no such resource (or not yours), 409 the
resource's state does not allow it (`turn_in_progress`, `idempotency_key_reused`,
`approval_resolved`), 413 too large (`payload_too_large`), 415 not JSON, 429 too many
requests (`rate_limited`, wait the seconds in `Retry-After`). Bad input is never a 500
and a refused request changes nothing.

**Paging.** Lists return at most `limit` items. While more exist, the response carries
`Link: <...>; rel="next"`: request that URL for the next page.

**Retries.** `POST .../messages/`, `POST /workflows/{{slug}}/runs/` and the OpenAI
chat completions take an `Idempotency-Key` header (or the body's `idempotency_key`): the
same key with the same body returns the first result (200), with another body a 409
`idempotency_key_reused`. A refusal that a retry would meet again, and a failed turn in
which a side effect ran, say `x-should-retry: false`. Repeating a cancel or an approval decision is
harmless (`cancelled: false`, or 409 `approval_resolved`). Each `POST /sessions/` and each
fork creates a new session.

**Following a run.** A message is accepted at once (202) and runs in the background:
watch `GET /sessions/{{id}}/events/?after=SEQ` or the websocket
`/ws/sessions/{{id}}/?after=SEQ` until `turn.finished`. The websocket's URL, sign-in,
frames, event types, client messages and close codes: **[websocket protocol]({WEBSOCKET_PAGE})**.

**OpenAI clients** can talk to an agent too: base URL `/openai/v1`, the same key,
`model` = the agent's slug (operations tagged *openai*; their errors use OpenAI's shape).
"""


def overview_hook(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the schema's description is the overview."""
    result.setdefault("info", {})["description"] = OVERVIEW.strip()
    return result


class WebsocketProtocolView(TemplateView):
    """The websocket protocol page, linked from the overview (Swagger UI's and Redoc's header)."""

    template_name = "docs/websocket.html"

"""What the schema tells a customer's developer about each workflows operation.

Stacked on the views' own `extend_schema` (which names the serializers); see
sessions/api/docs.py for the rules these texts follow. The examples use the demo's
workflows (config/demo.yaml).
"""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema

from restapi.schema import IDEMPOTENCY_KEY_PARAMETER, error_example

RUN = {
    "id": "2c4e6a8b-0d1f-4a3c-9e5b-7d9f1b3d5f7a",
    "workflow": "refund",
    "version": 1,
    "state": "tool_loop",
    "role": "support",
    "metadata": {"ticket": "T-1234"},
    "created_at": "2026-12-06T09:00:00.000000Z",
}

workflow_list = extend_schema(
    summary="List the workflows you may start",
    description="""
The enabled workflows whose role your key holds: their `slug` (for
`POST /api/v1/workflows/{slug}/runs/`), name, current version, and `input`, the JSON
Schema a run's input must satisfy. The demo has `logistics-exceptions` (input
`{"days": 7}`, optional) and `refund` (input `{"order_number": "SO-1001"}`).
""",
    examples=[
        OpenApiExample(
            "The demo's refund workflow",
            value={
                "slug": "refund",
                "name": "Refund with review",
                "description": "",
                "role": "support",
                "version": 1,
                "input": {
                    "type": "object",
                    "required": ["order_number"],
                    "properties": {
                        "order_number": {
                            "type": "string",
                            "pattern": "^SO-[0-9]+$",
                            "description": "The order to refund, for example SO-1001",
                        }
                    },
                    "additionalProperties": False,
                },
            },
            response_only=True,
        )
    ],
)

workflow_run_create = extend_schema(
    parameters=[
        OpenApiParameter(
            "slug",
            str,
            OpenApiParameter.PATH,
            description="The workflow's slug (`GET /api/v1/workflows/`).",
            examples=[OpenApiExample("The demo's refund workflow", value="refund")],
        ),
        IDEMPOTENCY_KEY_PARAMETER,
    ],
    summary="Start a workflow run",
    description="""
Starts a run of the workflow's current version with your `input`. A run is a session:
follow it like any session (its events, the websocket, cancel, fork) with the `id` this
returns; `GET /api/v1/sessions/{id}/` shows in `workflow` the nodes running now and, at
the end, the result. A run takes no messages.

- `input` must satisfy the workflow's `input` schema (`GET /api/v1/workflows/`): for the
  demo's `refund`, `{"order_number": "SO-1001"}`; for `logistics-exceptions`, `{"days": 7}`.
- `idempotency_key` (or the `Idempotency-Key` header) makes a retry safe: the same key
  with the same input and metadata returns the first run (200) and starts nothing; with
  another, 409 `idempotency_key_reused`.
- `metadata`: your own JSON, returned as is.

Only a key holding the workflow's role may start it (403 `role_not_held`). The run's
model calls (its llm and choice nodes) are charged to the key that started it: its
spend per day and its budget, as a session it opens.

Errors: 400 `invalid_input` (`details.path` says where the input is wrong), 403
`role_not_held`, 404 `not_found` (no enabled workflow with this slug), 409
`idempotency_key_reused`, 429 `rate_limited` (runs count as sessions created).
""",
    examples=[
        OpenApiExample(
            "Refund an order",
            value={
                # No idempotency_key: "Try it out" must start a new run each time, not
                # return the run an earlier reader started with the same key.
                "input": {"order_number": "SO-1001"},
                "metadata": {"ticket": "T-1234"},
            },
            request_only=True,
        ),
        OpenApiExample("Started", value=RUN, response_only=True, status_codes=[201]),
        OpenApiExample(
            "A repeated idempotency_key", value=RUN, response_only=True, status_codes=[200]
        ),
        error_example(
            400,
            "invalid_input",
            "$.input.order_number: 'SO1001' does not match '^SO-[0-9]+$'",
            {"field": "input", "path": "$.input.order_number", "errors": 1},
        ),
        error_example(404, "not_found", "workflow refnd not found"),
    ],
)

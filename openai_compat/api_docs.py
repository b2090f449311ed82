"""What the schema tells a developer with an OpenAI client about each operation.

Stacked on the views' own `extend_schema` (which names the serializers and the
operation ids); see sessions/api/docs.py for the rules these texts follow. Errors here
are in OpenAI's shape, documented by OpenAISchema.
"""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema

MODEL = {
    "id": "order-support",
    "object": "model",
    "created": 1796542076,
    "owned_by": "agentplatform",
}

model_list = extend_schema(
    summary="List the agents as models",
    description="""
OpenAI's `GET /models`: every enabled agent, its slug as the model `id`. Point an OpenAI
client at `<server>/openai/v1` with your API key and use an `id` as `model`.
""",
    examples=[
        OpenApiExample(
            "The demo agent", value={"object": "list", "data": [MODEL]}, response_only=True
        )
    ],
)

model_retrieve = extend_schema(
    summary="Get one agent as a model",
    description="OpenAI's `GET /models/{model}`. 404 `model_not_found` when no enabled agent "
    "has this slug.",
    parameters=[
        OpenApiParameter(
            "model",
            str,
            OpenApiParameter.PATH,
            description="An agent's slug.",
            examples=[OpenApiExample("The demo agent", value="order-support")],
        )
    ],
    examples=[OpenApiExample("The demo agent", value=MODEL, response_only=True)],
)

chat_completion_create = extend_schema(
    summary="Run one turn of an agent (OpenAI chat completions)",
    description="""
OpenAI's chat completions, answered by an agent: `model` is the agent's slug, the last
user message is the turn's input. The agent's tools run on the platform; only its answer
comes back, with token usage. `stream: true` answers with server-sent events in OpenAI's
chunk format, ending with `data: [DONE]`.

- **Sessions.** Without the `X-Session-Id` header each request is stateless, as with
  OpenAI: a new short-lived session, seeded with the request's earlier messages. The
  response always carries `X-Session-Id`; send it back to continue that session (then
  only the new last message is read).
- **Your own tools.** Pass `tools`: when the agent calls one, the answer has
  `finish_reason: tool_calls`; send the results as `tool` messages (with the same
  `X-Session-Id`) and the turn goes on.
- **JSON answers.** `response_format` `json_object` or `json_schema` makes the answer
  valid JSON (for the schema).
- `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop` and `seed` reach
  the model within the agent's limits; `user`, `store`, `metadata` and `stream_options`
  are accepted; any other parameter is a 400 naming it in `param`.
- `agentplatform` in the answer says how the turn ended (`status`: `finished`, or waiting
  for an approval, the user, your tools' results or a timer).

Errors come in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`: 400
`invalid_request` (`param` names the field), 401 `invalid_api_key`, 403 (the session's
role), 404 `model_not_found` or an unknown `X-Session-Id`, 409 `client_tools_pending`,
429 (rate or `insufficient_quota`), 502 (no model could answer), 503 `session_busy`
(another turn of that session runs; retry after `Retry-After`). A failed turn is never a
200; once a stream has started, an error arrives as a last chunk.
""",
    examples=[
        OpenApiExample(
            "Ask the demo agent",
            value={
                "model": "order-support",
                "messages": [{"role": "user", "content": "Hello, what can you do?"}],
            },
            request_only=True,
        ),
        OpenApiExample(
            "Look up an order with streaming",
            value={
                "model": "order-support",
                "messages": [{"role": "user", "content": "Where is order SO-1001?"}],
                "stream": True,
            },
            request_only=True,
        ),
        OpenApiExample(
            "The answer",
            value={
                "id": "chatcmpl-0b6f2a4e5d1c4e8f",
                "object": "chat.completion",
                "created": 1796542080,
                "model": "order-support",
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "Hello! I can find orders with delivery problems, notify "
                            "the customers and write a report.",
                            "refusal": None,
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 96, "completion_tokens": 24, "total_tokens": 120},
                "agentplatform": {
                    "session_id": "0b6f2a4e-5d1c-4e8f-9a3b-7c2d1e0f4a5b",
                    "status": "finished",
                    "stop_reason": "answer",
                },
            },
            response_only=True,
            media_type="application/json",
        ),
    ],
)

"""What the schema tells a customer's developer about `GET /api/v1/usage/` (stacked on the
view's own `extend_schema`; see sessions/api/docs.py for the rules these texts follow)."""

from drf_spectacular.utils import OpenApiExample, extend_schema

usage_retrieve = extend_schema(
    summary="Get your credits and usage",
    description="""
Your key's user's credit points and what their sessions used:

- `credits.balance`: points left; `reserved`: held by tool calls running now;
  `daily_cap`: the most that may be spent in a day (null: no cap); `spent_today`.
  Tools may cost points per call; a call your points cannot pay for does not run (the
  agent is told so and the turn's `outcome` says `tool_failures`).
- `tokens.input` / `tokens.output`: model tokens used by all your sessions.
- `cost`: their total model cost, a decimal string.

A user with no credit account shows a zero balance; their calls are not metered unless
the operator requires credits.
""",
    examples=[
        OpenApiExample(
            "Usage",
            value={
                "credits": {"balance": 900, "reserved": 0, "daily_cap": 500, "spent_today": 100},
                "tokens": {"input": 4120, "output": 380},
                "cost": "0.000000",
            },
            response_only=True,
        )
    ],
)

"""What the schema tells a customer's developer about `GET /api/v1/tools/` (stacked on the
view's own `extend_schema`; see sessions/api/docs.py for the rules these texts follow)."""

from drf_spectacular.utils import OpenApiExample, extend_schema

tool_list = extend_schema(
    summary="List the tools your key may use",
    description="""
The tools your key may use (a role of the key is one of theirs, or they are open to
every role), in name order: what each does
(`description`, `result_description`), its arguments (`parameters`, a JSON Schema),
whether it changes something outside (`side_effects`), whether a person must approve
its calls (`requires_approval`, `risk_level` 3), its time limit and its price in credit
points per call (`credit_cost`). An agent's model sees a tool only in a session whose
role may use it.
""",
    examples=[
        OpenApiExample(
            "A demo tool",
            value={
                "name": "get_order",
                "description": "Look up one order by its number (for example SO-1001). Use "
                "when the user names an order. Do not use to search orders by date or status: "
                "query_orders does that.",
                "parameters": {
                    "type": "object",
                    "required": ["number"],
                    "properties": {
                        "number": {
                            "type": "string",
                            "pattern": "^SO-[0-9]+$",
                            "description": "The order number, for example SO-1001",
                        }
                    },
                    "additionalProperties": False,
                },
                "result_description": "The order's number, customer and logistics status.",
                "kind": "http",
                "timeout_s": 5.0,
                "side_effects": False,
                "requires_approval": False,
                "risk_level": None,
                "roles": ["analyst", "support"],
                "credit_cost": 0,
            },
            response_only=True,
        )
    ],
)

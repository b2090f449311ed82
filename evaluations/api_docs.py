"""What the schema tells a customer's developer about each evaluations operation.

Stacked on the views' own `extend_schema`; see sessions/api/docs.py for the rules these
texts follow (a summary, a description, an example of every body and JSON answer)."""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema

from restapi.schema import error_example

SESSION = "2c4e6a8b-0d1f-4a3c-9e5b-7d9f1b3d5f7a"
CALLS = [
    {"tool": "query_orders", "arguments": {"order_number": "SO-1001"}},
    {"tool": "issue_coupon", "arguments": {"customer_id": 7, "amount": 10}},
]
REPORT = {
    "id": 7,
    "state": "finished",
    "agent": "order-support",
    "candidate": {"model": "candidate"},
    "recorded_on": ["order-support@5"],
    "allow_read_only_calls": False,
    "progress": {"done": 2, "total": 2},
    "totals": {
        "turns": 2,
        "trajectory_match": 0.5,
        "outcome_match": 0.5,
        "answer_exact": 0.5,
        "answer_similarity": 0.81,
        "judge_score": None,
        "tokens_ratio": 0.9,
        "cost_ratio": 0.4,
        "latency_ratio": 0.7,
        "would_have_called": 1,
    },
    "spent": "0.000210",
    "budget": None,
    "error": "",
    "created_at": "2026-12-07T09:00:00+00:00",
    "finished_at": "2026-12-07T09:01:00+00:00",
    "turns": [
        {
            "session": SESSION,
            "turn": 2,
            "replay": "5a7c9e1b-3d5f-4b7d-8f1a-3c5e7a9b1d3f",
            "trajectory_match": False,
            "outcome_match": False,
            "answer_exact": False,
            "answer_similarity": 0.62,
            "judge_score": None,
            "baseline": {
                "calls": CALLS,
                "outcome": "ok",
                "answer": "I issued a coupon of 10 for order SO-1001.",
                "input_tokens": 420,
                "output_tokens": 40,
                "cost": "0.000087",
                "latency_ms": 1850,
            },
            "candidate": {
                "calls": [CALLS[0], {"tool": "cancel_order", "arguments": {"number": "SO-1001"}}],
                "outcome": "tool_failures",
                "answer": "I cancelled order SO-1001.",
                "input_tokens": 380,
                "output_tokens": 36,
                "cost": "0.000035",
                "latency_ms": 1200,
                "would_have_called": [{"tool": "cancel_order", "arguments": {"number": "SO-1001"}}],
            },
        }
    ],
}
_ID = OpenApiParameter(
    "evaluation_id",
    int,
    OpenApiParameter.PATH,
    description="The evaluation's id (`POST /api/v1/evaluations/` returns it).",
    examples=[OpenApiExample("An evaluation", value=7)],
)
_NOT_FOUND = error_example(404, "evaluation_not_found", "evaluation 8 not found")

evaluation_list = extend_schema(
    summary="List your evaluations",
    description="""
Your evaluations, newest first (at most 50): `id`, `state`, `candidate`, progress (`done`
of `total` turns) and `totals` once finished. `GET /api/v1/evaluations/{id}/` has every
turn.
""",
    examples=[
        OpenApiExample(
            "One finished evaluation",
            value=[
                {
                    "id": 7,
                    "state": "finished",
                    "candidate": {"model": "candidate"},
                    "done": 2,
                    "total": 2,
                    "totals": REPORT["totals"],
                    "created_at": "2026-12-07T09:00:00Z",
                }
            ],
            response_only=True,
        )
    ],
)

evaluation_create = extend_schema(
    summary="Evaluate a candidate on recorded sessions",
    description="""
Replays every recorded turn of your sessions on a candidate, in the background, and
scores each beside the record (the manual's "Evaluations" page). Tool calls are answered
from the record; a side-effecting call the record lacks is never sent (it is listed as
`would_have_called`); a read-only one runs only with `allow_read_only_calls`.

- `sessions` (ids, all of one agent), `filter` (`agent`, `since`, `until`, `outcome`,
  `search`) or `same_sessions_as` (the saved set of an earlier evaluation of yours): your
  own sessions only; another owner's id is a 404, as a missing one.
- `candidate`: `{"model": endpoint}`, `{"system_prompt": str}`,
  `{"agent_version": "<agent slug>@<number>"}` (one of the sessions' agent's configuration
  versions; `GET /api/v1/agents/` gives each agent's latest `version`) or
  `{"workflow_version": "<workflow slug>@<n>"}`: the last replays your ended runs of that
  workflow (picked by `sessions`, `filter` `since`/`until`/`outcome` (`finished`, `failed`,
  `cancelled`), or `same_sessions_as`) on that version; each run's report has its `path`,
  `output` and `error` beside the record's.
- `judge` `{"model", "rubric"}` (optional) scores each answer 0 to 1 by your rubric;
  `budget` stops it once its replays' model cost reaches it.

Follow it with `GET /api/v1/evaluations/{id}/`. Errors: 400 `invalid_input`,
`unknown_model`, `unknown_agent_version`, `agent_version_mismatch` (a version of another
agent), `unknown_workflow_version`, `not_runs_of_workflow`, `mixed_agents`, `no_sessions`;
404 `session_not_found` (a conversation's id with a workflow version, too).
""",
    examples=[
        OpenApiExample(
            "A candidate system prompt on a session",
            value={
                "sessions": [SESSION],
                "candidate": {"system_prompt": "Answer in one short sentence."},
                "allow_read_only_calls": False,
            },
            request_only=True,
        ),
        OpenApiExample(
            "Queued",
            value={"id": 7, "state": "queued", "progress": {"done": 0, "total": 2}},
            response_only=True,
            status_codes=[201],
        ),
        error_example(
            400, "unknown_model", "unknown model endpoint 'candidat'", {"field": "candidate.model"}
        ),
        error_example(404, "session_not_found", f"session {SESSION} not found"),
    ],
)

evaluation_detail = extend_schema(
    parameters=[_ID],
    summary="Read an evaluation",
    description="""
Its `state` (`queued`, `running`, `finished`, `failed`, `cancelled`), `progress`,
`totals` (shares of matching turns, the mean answer similarity, candidate ÷ baseline
ratios of tokens, cost and latency, the count of calls it would have made), and `turns`:
those that differ first, each with the record's (`baseline`) and the candidate's calls,
outcome and answer (a workflow run's: also its `path`, the nodes it started in order, its
`output` and `error`).
""",
    examples=[OpenApiExample("Finished", value=REPORT, response_only=True), _NOT_FOUND],
)

evaluation_cancel = extend_schema(
    parameters=[_ID],
    summary="Cancel an evaluation",
    description="""
Stops a queued or running evaluation (a running one within a few turns, keeping the
turns scored so far). An evaluation that has ended is a 409 `illegal_transition`.
""",
    examples=[
        OpenApiExample("Cancelled", value={"id": 7, "state": "cancelled"}, response_only=True),
        error_example(409, "illegal_transition", "evaluation 7 has already ended (finished)"),
        _NOT_FOUND,
    ],
)

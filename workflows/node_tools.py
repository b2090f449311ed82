"""The tools a workflow's nodes call besides the business tools: a person's review and a timer.

A `human` node is a call of its own review tool, which always waits for approval in the
approvers' queue (its deadline and default policy are the node's); a `wait` node, and the
pause before a node's retry, is a call of the timer tool, which puts the run in
`waiting_timer` with no worker held. Both go through the tool phase like any call, so
they get its guarantees (recorded intent, approvals over REST, websocket, webhook and
the admin, cancel, fork) without a second mechanism.
"""

from collections.abc import Collection
from typing import Any

from tools.builtin import WORKFLOW_REVIEW_HANDLER
from tools.execution import ToolSnapshot

from .definition import Definition, Node

REVIEW_PREFIX = "workflow.review."
WAIT_TOOL = "workflow.wait"
TIMER_HANDLER = "builtin.schedule_followup"
DEFAULT_REVIEW_TIMEOUT_S = 1800


def _engine_tool(
    name: str, description: str, handler: str, risk: int = 0, **extra: Any
) -> ToolSnapshot:
    """A tool the workflow engine calls for itself: no row, no side effect, every role."""
    extra.setdefault("version", "workflow-1")
    return ToolSnapshot(
        name=name,
        description=description,
        kind="python",
        handler=handler,
        url="",
        method="",
        headers={},
        timeout_s=5.0,
        side_effects=False,
        roles=(),
        risk_level=risk,
        **extra,
    )


_WAIT = _engine_tool(
    WAIT_TOOL,
    "Wait until a time has passed (a workflow's wait node or a retry's pause).",
    TIMER_HANDLER,
    parameters={
        "type": "object",
        "properties": {"after_seconds": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["after_seconds", "note"],
    },
)


def review_tool_name(node_id: str) -> str:
    return f"{REVIEW_PREFIX}{node_id}"


# The risk of a review guarding a call with side effects, when the node declares none.
GUARDED_RISK = 2


def review_risk(node: Node, definition: Definition, side_effecting: Collection[str]) -> int:
    """The risk the review's card shows: the node's own `risk_level`, else derived from what
    it guards: a side-effecting tool node reachable next (on approval) is never risk 0."""
    if node.risk_level is not None:
        return node.risk_level
    following = definition.nodes.get(node.next or "")
    tools = [following, *(following.branches.values() if following else ())]
    if following is not None and following.inner is not None:
        tools.append(following.inner)
    if any(n is not None and n.kind == "tool" and n.tool in side_effecting for n in tools):
        return GUARDED_RISK
    return 0


def _review_tool(node: Node, risk: int) -> ToolSnapshot:
    # What the approver may edit: only the state values the node names (`editable`),
    # sent and checked as `{"editable": {name: value}}`; nothing else of the card.
    editable = {
        "type": "object",
        "properties": {name: {} for name in node.editable},
        "additionalProperties": False,
    }
    return _engine_tool(
        review_tool_name(node.id),
        f"A person's review: workflow node {node.id}.",
        WORKFLOW_REVIEW_HANDLER,
        parameters={"type": "object", "properties": {"editable": editable}},
        risk=risk,
        # Validators are kept by (name, version): every workflow's node `review` has the
        # same name, so the version names the schema.
        version="workflow-1:" + ",".join(node.editable),
        requires_approval=True,
        approval_timeout_s=int(node.timeout_s or DEFAULT_REVIEW_TIMEOUT_S),
        approval_on_timeout=node.on_timeout,
        approval_group=node.group or "",
        approval_reason_argument="summary",
    )


def _human_nodes(definition: Definition) -> list[Node]:
    found: list[Node] = []
    for node in definition.nodes.values():
        inline = [*node.branches.values(), *([node.inner] if node.inner else [])]
        found += [n for n in (node, *inline) if n.kind == "human"]
    return found


def node_tools(
    definition: Definition, side_effecting: Collection[str] = ()
) -> dict[str, ToolSnapshot]:
    """The review tool of each human node, and the timer: by name, as the tool phase looks
    them up. `side_effecting`: the definition's tools that have side effects (for the
    reviews' derived risk)."""
    tools = {
        review_tool_name(n.id): _review_tool(n, review_risk(n, definition, side_effecting))
        for n in _human_nodes(definition)
    }
    tools[WAIT_TOOL] = _WAIT
    return tools

"""The tools a workflow's nodes call besides the business tools: a person's review and a timer.

A `human` node is a call of its own review tool, which always waits for approval in the
approvers' queue (its deadline and default policy are the node's); a `wait` node, and the
pause before a node's retry, is a call of the timer tool, which puts the run in
`waiting_timer` with no worker held. Both go through the tool phase like any call, so
they get its guarantees (recorded intent, approvals over REST, websocket, webhook and
the admin, cancel, fork) without a second mechanism.
"""

from typing import Any

from tools.builtin import WORKFLOW_REVIEW_HANDLER
from tools.execution import ToolSnapshot

from .definition import Definition, Node

REVIEW_PREFIX = "workflow.review."
WAIT_TOOL = "workflow.wait"
TIMER_HANDLER = "builtin.schedule_followup"
DEFAULT_REVIEW_TIMEOUT_S = 1800


def _engine_tool(name: str, description: str, handler: str, **extra: Any) -> ToolSnapshot:
    """A tool the workflow engine calls for itself: no row, no side effect, every role."""
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
        version="workflow-1",
        risk_level=0,
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


def _review_tool(node: Node) -> ToolSnapshot:
    return _engine_tool(
        review_tool_name(node.id),
        f"A person's review: workflow node {node.id}.",
        WORKFLOW_REVIEW_HANDLER,
        parameters={"type": "object"},
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


def node_tools(definition: Definition) -> dict[str, ToolSnapshot]:
    """The review tool of each human node, and the timer: by name, as the tool phase looks them up."""
    tools = {review_tool_name(n.id): _review_tool(n) for n in _human_nodes(definition)}
    tools[WAIT_TOOL] = _WAIT
    return tools

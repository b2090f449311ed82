"""A workflow's definition: its config mapping parsed into immutable values, and checked.

`definition_parse` is the one way in, for the config file and the admin alike (DESIGN
"Workflows": same validation, a new version per edit). It compiles every CEL expression once
and refuses, with every problem at once, naming workflow, node and field: unknown tools,
agents, models and nodes, CEL syntax errors, expressions naming keys not written on every
path, unreachable nodes, nodes that cannot reach `end`, cycles without `max_visits`, tools
the workflow's role may not use, and the structural mistakes behind them.
"""

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from workflows.checks import cycle_problems, data_flow_problems, reachability_problems
from workflows.fields import FieldReader, type_name, unknown
from workflows.limits import limits
from workflows.node_parsing import NAME_PATTERN, NAME_RULE, NodeContext, node_parse
from workflows.nodes import END, INPUT, NODE_KINDS, Case, FrozenMap, Node, RetryPolicy

__all__ = [
    "END",
    "NODE_KINDS",
    "Case",
    "Definition",
    "Node",
    "RetryPolicy",
    "WorkflowInvalid",
    "definition_parse",
]

SLUG_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,99}")
SLUG_RULE = "a slug (a lowercase letter, then up to 99 lowercase letters, digits, '_' or '-')"
RESERVED_NODE_IDS = (END, INPUT)

_WORKFLOW_FIELDS = (
    "slug",
    "name",
    "description",
    "role",
    "input",
    "start",
    "result",
    "model",
    "deadline_s",
    "nodes",
    # The offline `rules` model's answers for llm and choice nodes (checked by the config
    # file's schema; the runtime agent carries them).
    "rules",
)
_WORKFLOW_REQUIRED = ("slug", "role", "start", "nodes")
_DEFAULT_INPUT: dict[str, Any] = {"type": "object"}


class WorkflowInvalid(Exception):
    """A workflow config that cannot be used; `errors` names every problem found."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Definition:
    """One version of a workflow, parsed and checked: what a run walks."""

    slug: str
    name: str
    description: str
    role: str
    input_schema: dict[str, Any]
    start: str
    result: str | None
    model: str | None
    deadline_s: float | None
    nodes: Mapping[str, Node]
    raw: dict[str, Any]

    def node(self, node_id: str) -> Node:
        """A top-level node, or an inline one by its dotted id ("fan.node", "both.a")."""
        parent_id, dot, _ = node_id.partition(".")
        parent = self.nodes.get(parent_id)
        if parent is not None and not dot:
            return parent
        for _, inline in parent.inline_nodes() if parent is not None else ():
            if inline.id == node_id:
                return inline
        raise KeyError(node_id)

    def writers(self) -> dict[str, list[str]]:
        """Output key -> the ids of the nodes that write it, in declaration order."""
        writers: dict[str, list[str]] = {}
        for node_id, node in self.nodes.items():
            if node.output is not None:
                writers.setdefault(node.output, []).append(node_id)
        return writers


def _node_ids(fields: FieldReader, raw: Mapping[str, Any] | None) -> tuple[list[str], bool]:
    """The valid top-level node ids in declaration order, and whether every id was valid."""
    if raw is None:
        return [], False
    if not raw:
        fields.problem("nodes", "must declare at least one node")
    valid = []
    for node_id in raw:
        if not NAME_PATTERN.fullmatch(node_id):
            fields.problem(f"nodes.{node_id}", f"'{node_id}' is not {NAME_RULE}")
        elif node_id in RESERVED_NODE_IDS:
            fields.problem(f"nodes.{node_id}", f"'{node_id}' is reserved; choose another id")
        else:
            valid.append(node_id)
    return valid, len(valid) == len(raw)


def _nodes(
    raw: Mapping[str, Any], node_ids: list[str], ctx: NodeContext
) -> tuple[dict[str, Node], bool]:
    """The top-level nodes that parsed, and whether all did (the graph checks need all)."""
    nodes: dict[str, Node] = {}
    for node_id in node_ids:
        node = node_parse(raw[node_id], node_id, f"{ctx.where}.nodes.{node_id}", ctx, None)
        if node is not None:
            nodes[node_id] = node
    return nodes, len(nodes) == len(node_ids)


# --- the workflow ----------------------------------------------------------------------------


def _input_schema(fields: FieldReader) -> dict[str, Any]:
    if not fields.has("input"):
        return dict(_DEFAULT_INPUT)
    schema = fields.schema("input")
    if schema is not None and schema.get("type") != "object":
        fields.problem("input", "the top level must be {type: object}")
    return schema or dict(_DEFAULT_INPUT)


def _start(fields: FieldReader, ctx: NodeContext, nodes_declared: bool) -> str | None:
    """The first node (judged against the declared ids, when `nodes` is a mapping at all)."""
    start = fields.text("start")
    if start == END:
        fields.problem("start", f"must name a node, not '{END}'")
        return None
    if start is not None and nodes_declared and start not in ctx.node_ids:
        fields.problem("start", unknown("node", start, ctx.node_ids))
        return None
    return start


def _result(fields: FieldReader, nodes: Mapping[str, Node], complete: bool) -> str | None:
    """The state key returned as the run's result: some node must write it (judged once
    every node parsed: a broken node's output is unknown)."""
    result = fields.text("result")
    written = sorted({node.output for node in nodes.values() if node.output is not None})
    if result is not None and complete and result not in written:
        fields.problem(
            "result", f"no node writes '{result}' (written: {', '.join(written) or 'none'})"
        )
    return result


def _item_collisions(where: str, nodes: Mapping[str, Node]) -> list[str]:
    """A map's item name hides a state key of that name from its inner node."""
    writers: dict[str, list[str]] = {}
    for node_id, node in nodes.items():
        if node.output is not None:
            writers.setdefault(node.output, []).append(node_id)
    return [
        f"{where}.nodes.{node_id}.as: '{node.as_name}' is also a state key "
        f"(written by {', '.join(writers[node.as_name])}); choose another name"
        for node_id, node in nodes.items()
        if node.kind == "map" and node.as_name in writers
    ]


def _json_copy(raw: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """The mapping as plain JSON, stored as the version: YAML dates or NaN would not load."""
    try:
        copy: dict[str, Any] = json.loads(json.dumps(raw, allow_nan=False))
    except (TypeError, ValueError) as exc:
        problems.append(f"{where}: not JSON-compatible: {exc}")
        return dict(raw)
    return copy


def _graph_problems(
    ctx: NodeContext, start: str | None, nodes: Mapping[str, Node], complete: bool
) -> list[str]:
    """The whole-graph checks, once every node parsed (a node of unknown kind has unknown
    edges: judging the graph without them would only report its consequences)."""
    if not complete or start is None:
        return []
    where = ctx.where
    return (
        reachability_problems(where, start, nodes, edges_certain=not ctx.uncertain_edges)
        + cycle_problems(where, nodes)
        + data_flow_problems(where, start, nodes)
    )


def definition_parse(
    raw: Mapping[str, Any],
    *,
    where: str,
    known_tools: Mapping[str, Collection[str]],
    known_agents: Collection[str],
    known_models: Collection[str],
) -> Definition:
    """Parse and check one workflow's config; raises WorkflowInvalid with every problem.

    `where` prefixes every message (`workflows[0] (refund)`); `known_tools` maps each tool
    to the roles allowed to use it (empty: everyone).
    """
    if not isinstance(raw, Mapping):
        raise WorkflowInvalid([f"{where}: a workflow must be a mapping, not {type_name(raw)}"])
    problems: list[str] = []
    fields = FieldReader({str(k): v for k, v in raw.items()}, where, problems)
    fields.only(_WORKFLOW_FIELDS, "a workflow")
    fields.require(_WORKFLOW_REQUIRED, "a workflow")
    slug = fields.matching("slug", SLUG_PATTERN, SLUG_RULE)
    name = fields.text("name")
    description = fields.text("description", empty_ok=True)
    role = fields.text("role")
    input_schema = _input_schema(fields)
    model = fields.known("model", known_models, "model")
    deadline_s = fields.number("deadline_s", minimum=0, exclusive=True)
    declared = fields.mapping("nodes")
    if declared is not None and len(declared) > (most := limits().nodes):
        # Refused before any node is read: checking thousands of nodes is itself the cost.
        raise WorkflowInvalid(
            [f"{where}.nodes: has {len(declared)} nodes; at most {most} (WORKFLOW_MAX_NODES)"]
        )
    node_ids, ids_valid = _node_ids(fields, declared)
    # Edges are judged against every declared id: one with a bad id is reported once, as such.
    ctx = NodeContext(
        where, role, tuple(declared or ()), known_tools, known_agents, known_models, problems
    )
    start = _start(fields, ctx, declared is not None)
    nodes, parsed = _nodes(declared or {}, node_ids, ctx)
    result = _result(fields, nodes, ids_valid and parsed)
    problems += _item_collisions(where, nodes)
    problems += _graph_problems(ctx, start, nodes, ids_valid and parsed)
    stored = _json_copy(raw, where, problems)
    if problems or slug is None or role is None or start is None:
        raise WorkflowInvalid(problems)
    return Definition(
        slug=slug,
        name=name or slug,
        description=description or "",
        role=role,
        input_schema=input_schema,
        start=start,
        result=result,
        model=model,
        deadline_s=deadline_s,
        nodes=FrozenMap(nodes),
        raw=stored,
    )

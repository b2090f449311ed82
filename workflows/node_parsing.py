"""Parsing one node of a workflow's config into a Node, a problem recorded per wrong field.

Each kind has its own reader of its own fields; the ones every kind shares (`next`, `output`,
`max_visits`, `timeout_s`, `retry`) are read once. Inline nodes (a map's `node`, a parallel
node's `branches`) are parsed by the same readers, without the fields that move a run on.
"""

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from workflows.expressions import (
    CEL_BUILTIN_NAMES,
    CEL_RESERVED_WORDS,
    EvaluationError,
    Expression,
    expression_compile,
)
from workflows.fields import FieldReader, type_name, unknown
from workflows.limits import limits
from workflows.nodes import END, INPUT, MAP_INDEX, NODE_KINDS, Case, FrozenMap, Node, RetryPolicy

# Node ids, branch names and state keys: CEL identifiers, so expressions can name them.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
NAME_RULE = "a name (a letter or '_', then up to 62 letters, digits or '_')"
_MOVES_ON = ("next", "output", "max_visits")
# Each kind's own fields, inline or not.
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "tool": ("tool", "args", "timeout_s", "retry"),
    "llm": ("prompt", "system", "output_schema", "model"),
    "choice": ("prompt", "system", "options", "default", "model"),
    "condition": ("cases", "default"),
    "human": (
        "summary",
        "on_timeout",
        "rejected",
        "group",
        "timeout_s",
        "title",
        "show",
        "risk_level",
        "editable",
    ),
    "agent": ("agent", "task"),
    "map": ("over", "as", "node", "concurrency"),
    "parallel": ("branches", "join"),
    "wait": ("seconds",),
}
# What a top-level node adds: where it goes next, the state key it writes, its visit cap.
_TOP_FIELDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("tool", "llm", "human", "agent", "map", "parallel"), _MOVES_ON),
    "choice": ("output", "max_visits"),
    "condition": ("max_visits",),
    "wait": ("next", "max_visits"),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "tool": ("tool",),
    "llm": ("prompt",),
    "choice": ("prompt", "options", "default"),
    "condition": ("cases", "default"),
    "human": ("summary",),
    "agent": ("agent", "task"),
    "map": ("over", "node"),
    "parallel": ("branches",),
    "wait": ("seconds",),
}
_TOP_REQUIRED: dict[str, tuple[str, ...]] = {
    "tool": ("next",),
    "llm": ("next", "output"),
    "choice": (),
    "condition": (),
    "human": ("next",),
    "agent": ("next", "output"),
    "map": ("next", "output"),
    "parallel": ("next", "output"),
    "wait": ("next",),
}
# The kinds a map's inner node and a parallel node's branches may be.
_INLINE_KINDS = {"map": ("tool", "llm", "agent"), "parallel": ("tool", "llm", "agent", "wait")}
_INLINE_PLACE = {"map": "a map's node", "parallel": "a parallel branch"}
_RETRY_FIELDS = ("max_attempts", "backoff_s", "max_backoff_s")
_CASE_FIELDS = ("when", "next")
_RETRY_ATTEMPTS_MAX = 10
# Stands in for a case's `when` that did not compile, so its edge still counts (parse only).
_UNKNOWN_CONDITION = "false"


@dataclass(frozen=True)
class NodeContext:
    """What every node's parse needs: where it is, what it may refer to, problems so far."""

    where: str
    role: str | None
    node_ids: tuple[str, ...]
    known_tools: Mapping[str, Collection[str]]
    known_agents: Collection[str]
    known_models: Collection[str]
    problems: list[str]
    # Edge fields that did not parse: which nodes are reachable is then unknown.
    uncertain_edges: list[str] = field(default_factory=list)


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" or kind == "llm" else "a"


# --- edges and names -----------------------------------------------------------------------


def _unknown_target(target: str, ctx: NodeContext) -> str | None:
    """Why `target` is no place to move to (None: a node, or `end`)."""
    if target == END or target in ctx.node_ids:
        return None
    return unknown("node", target, (*ctx.node_ids, END))


def _edge(fields: FieldReader, name: str, ctx: NodeContext) -> str | None:
    """A field naming the node to move to, or `end`. An unknown id is reported and kept:
    the graph checks take it as leaving the graph, so it is not reported twice."""
    reported = len(fields.problems)
    target = fields.text(name)
    problem = _unknown_target(target, ctx) if target is not None else None
    if problem is not None:
        fields.problem(name, problem)
    if len(fields.problems) > reported:
        ctx.uncertain_edges.append(f"{fields.path}.{name}")
    return target


def _state_key_problem(key: str) -> str | None:
    """Why `key` cannot be a state key (None: it can)."""
    if not NAME_PATTERN.fullmatch(key):
        return f"'{key}' is not {NAME_RULE}"
    if key == INPUT:
        return f"'{INPUT}' is the run's input; choose another key"
    if key in CEL_RESERVED_WORDS or key in CEL_BUILTIN_NAMES:
        return f"'{key}' is reserved in CEL; choose another key"
    return None


def _state_key(fields: FieldReader, name: str) -> str | None:
    key = fields.text(name)
    problem = _state_key_problem(key) if key is not None else None
    if problem is not None:
        fields.problem(name, problem)
        return None
    return key


def _as_name(fields: FieldReader) -> str:
    """A map's name for its item, which its inner node reads beside `index` and the state."""
    name = fields.text("as")
    if name is None:
        return "item"
    problem = _state_key_problem(name)
    if problem is None and name == MAP_INDEX:
        problem = f"'{MAP_INDEX}' is the item's position; choose another name"
    if problem is not None:
        fields.problem("as", problem)
        return "item"
    return name


# --- fields every kind may have ------------------------------------------------------------


def _retry(fields: FieldReader) -> RetryPolicy:
    raw = fields.mapping("retry")
    if raw is None:
        return RetryPolicy()
    retry = FieldReader(raw, f"{fields.path}.retry", fields.problems)
    retry.only(_RETRY_FIELDS, "retry")
    default = RetryPolicy()
    max_attempts = retry.integer("max_attempts", minimum=1, maximum=_RETRY_ATTEMPTS_MAX)
    backoff_s = retry.number("backoff_s", minimum=0)
    max_backoff_s = retry.number("max_backoff_s", minimum=0)
    policy = RetryPolicy(
        max_attempts=default.max_attempts if max_attempts is None else max_attempts,
        backoff_s=default.backoff_s if backoff_s is None else backoff_s,
        max_backoff_s=default.max_backoff_s if max_backoff_s is None else max_backoff_s,
    )
    if policy.max_backoff_s < policy.backoff_s:
        retry.problem("max_backoff_s", f"must be at least backoff_s ({policy.backoff_s:g})")
    return policy


def _common(fields: FieldReader, ctx: NodeContext) -> dict[str, Any]:
    """The fields most kinds share; a field the kind does not take was already reported."""
    return {
        "next": _edge(fields, "next", ctx),
        "output": _state_key(fields, "output"),
        "max_visits": fields.integer("max_visits", minimum=1, maximum=limits().visits),
        "timeout_s": fields.number("timeout_s", minimum=0, exclusive=True),
        "retry": _retry(fields),
    }


# --- each kind's own fields ----------------------------------------------------------------


def _tool_name(fields: FieldReader, ctx: NodeContext) -> str | None:
    """A known tool the workflow's role may use (an empty role list: everyone may)."""
    tool = fields.known("tool", ctx.known_tools, "tool")
    roles = ctx.known_tools.get(tool, ()) if tool is not None else ()
    if tool is not None and roles and ctx.role is not None and ctx.role not in roles:
        fields.problem(
            "tool",
            f"the workflow's role '{ctx.role}' may not use tool '{tool}' "
            f"(allowed roles: {', '.join(sorted(roles))})",
        )
    return tool


def _args(fields: FieldReader) -> Mapping[str, Expression]:
    raw = fields.mapping("args")
    if raw is None:
        return FrozenMap({})
    args = FieldReader(raw, f"{fields.path}.args", fields.problems)
    compiled: dict[str, Expression] = {}
    for name, value in raw.items():
        if value is None:
            args.problem(name, "must be a CEL expression, not null")
        elif (expression := args.expression(name)) is not None:
            compiled[name] = expression
    return FrozenMap(compiled)


def _tool(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {"tool": _tool_name(fields, ctx), "args": _args(fields)}


def _llm(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "prompt": fields.template("prompt"),
        "system": fields.template("system"),
        "output_schema": fields.schema("output_schema"),
        "model": fields.known("model", ctx.known_models, "model"),
    }


def _options(fields: FieldReader, ctx: NodeContext) -> Mapping[str, str]:
    """A choice's options: node id -> when the model should pick it."""
    raw = fields.mapping("options")
    if raw is None:
        return FrozenMap({})
    if not raw:
        fields.problem("options", "must name at least one node to choose from")
        ctx.uncertain_edges.append(f"{fields.path}.options")
    options = FieldReader(raw, f"{fields.path}.options", fields.problems)
    described: dict[str, str] = {}
    for node_id, text in raw.items():
        problem = _unknown_target(node_id, ctx)
        if problem is not None:
            options.problem(node_id, problem)
            ctx.uncertain_edges.append(f"{options.path}.{node_id}")
        if text is None:
            options.problem(node_id, "must say when to pick this node, not null")
        described[node_id] = options.text(node_id) or ""
    return FrozenMap(described)


def _choice(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "prompt": fields.template("prompt"),
        "system": fields.template("system"),
        "model": fields.known("model", ctx.known_models, "model"),
        "options": _options(fields, ctx),
        "default": _edge(fields, "default", ctx),
    }


def _case(raw: Any, path: str, ctx: NodeContext) -> Case | None:
    if not isinstance(raw, Mapping):
        ctx.problems.append(f"{path}: must be a mapping {{when, next}}, not {type_name(raw)}")
        ctx.uncertain_edges.append(path)
        return None
    fields = FieldReader({str(k): v for k, v in raw.items()}, path, ctx.problems)
    fields.only(_CASE_FIELDS, "a case")
    fields.require(_CASE_FIELDS, "a case")
    when = fields.expression("when")
    target = _edge(fields, "next", ctx)
    if target is None:
        ctx.uncertain_edges.append(f"{path}.next")
        return None
    return Case(when=when or expression_compile(_UNKNOWN_CONDITION), next=target)


def _cases(fields: FieldReader, ctx: NodeContext) -> tuple[Case, ...]:
    raw = fields.raw.get("cases")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        fields.problem(
            "cases",
            f"must be a non-empty list of {{when, next}}, not {type_name(raw) if raw else 'empty'}",
        )
        ctx.uncertain_edges.append(f"{fields.path}.cases")
        return ()
    cases = (_case(case, f"{fields.path}.cases[{i}]", ctx) for i, case in enumerate(raw))
    return tuple(case for case in cases if case is not None)


def _condition(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {"cases": _cases(fields, ctx), "default": _edge(fields, "default", ctx)}


def _human(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "summary": fields.template("summary"),
        "on_timeout": fields.option("on_timeout", ("reject", "approve"), "reject"),
        "rejected": _edge(fields, "rejected", ctx),
        "group": fields.text("group"),
        "title": fields.text("title"),
        "show": _show(fields),
        "risk_level": fields.integer("risk_level", minimum=0, maximum=3),
        "editable": _editable(fields),
    }


def _show(fields: FieldReader) -> Mapping[str, Expression]:
    """`show: {label: CEL}`: the values an approver's card shows beside the summary."""
    raw = fields.mapping("show")
    if raw is None:
        return FrozenMap({})
    show = FieldReader(raw, f"{fields.path}.show", fields.problems)
    compiled: dict[str, Expression] = {}
    for label, value in raw.items():
        if value is None:
            show.problem(label, "must be a CEL expression, not null")
        elif (expression := show.expression(label)) is not None:
            compiled[label] = expression
    return FrozenMap(compiled)


def _editable(fields: FieldReader) -> tuple[str, ...]:
    """`editable: [name, ...]`: state values the approver may change before the next node."""
    raw = fields.raw.get("editable")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(n, str) and NAME_PATTERN.fullmatch(n) for n in raw
    ):
        fields.problem("editable", f"must be a list of state value names ({NAME_RULE})")
        return ()
    return tuple(dict.fromkeys(raw))


def _agent(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "agent": fields.known("agent", ctx.known_agents, "agent"),
        "task": fields.expression("task"),
    }


def _constant(fields: FieldReader, name: str, expression: Expression | None) -> Any:
    """The value of an expression that reads nothing (None when it reads, or fails: reported)."""
    if expression is None or expression.names:
        return None
    try:
        return expression.evaluate({})
    except EvaluationError as exc:
        fields.problem(name, exc.message)
        return None


def _over(fields: FieldReader) -> Expression | None:
    over = fields.expression("over")
    value = _constant(fields, "over", over)
    if value is not None and not isinstance(value, list):
        fields.problem("over", f"must give a list, gives {json.dumps(value)}")
    return over


def _map(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "over": _over(fields),
        "as_name": _as_name(fields),
        "inner": _inline(
            fields.raw.get("node"), f"{node_id}.node", f"{fields.path}.node", ctx, "map"
        ),
        "concurrency": fields.integer("concurrency", minimum=1, maximum=limits().map_concurrency)
        or 5,
    }


def _branches(fields: FieldReader, ctx: NodeContext, node_id: str) -> Mapping[str, Node]:
    raw = fields.mapping("branches")
    if raw is None:
        return FrozenMap({})
    if not raw:
        fields.problem("branches", "must name at least one branch")
    if len(raw) > (most := limits().branches):
        fields.problem(
            "branches", f"has {len(raw)} branches; at most {most} (WORKFLOW_MAX_BRANCHES)"
        )
        return FrozenMap({})
    branches: dict[str, Node] = {}
    for name, branch in raw.items():
        path = f"{fields.path}.branches.{name}"
        if not NAME_PATTERN.fullmatch(name):
            ctx.problems.append(f"{path}: '{name}' is not {NAME_RULE}")
            continue
        node = _inline(branch, f"{node_id}.{name}", path, ctx, "parallel")
        if node is not None:
            branches[name] = node
    return FrozenMap(branches)


def _parallel(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {
        "branches": _branches(fields, ctx, node_id),
        "join": fields.option("join", ("all", "any"), "all"),
    }


def _seconds(fields: FieldReader) -> Expression | None:
    seconds = fields.expression("seconds")
    value = _constant(fields, "seconds", seconds)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or value < 0
    ):
        fields.problem("seconds", f"must give a number of seconds >= 0, gives {json.dumps(value)}")
    return seconds


def _wait(fields: FieldReader, ctx: NodeContext, node_id: str) -> dict[str, Any]:
    return {"seconds": _seconds(fields)}


_KIND_PARSERS: dict[str, Callable[[FieldReader, NodeContext, str], dict[str, Any]]] = {
    "tool": _tool,
    "llm": _llm,
    "choice": _choice,
    "condition": _condition,
    "human": _human,
    "agent": _agent,
    "map": _map,
    "parallel": _parallel,
    "wait": _wait,
}


# --- nodes -----------------------------------------------------------------------------------


def _kind(fields: FieldReader, parent_kind: str | None) -> str | None:
    """The node's kind, one an inline node of `parent_kind` may have."""
    if not fields.require(("kind",), "every node"):
        return None
    kind = fields.option("kind", NODE_KINDS, "")
    if not kind:
        return None
    if parent_kind is not None and kind not in _INLINE_KINDS[parent_kind]:
        allowed = ", ".join(_INLINE_KINDS[parent_kind])
        fields.problem(
            "kind", f"{_INLINE_PLACE[parent_kind]} must be one of {allowed}, not '{kind}'"
        )
        return None
    return kind


def node_parse(
    raw: Any, node_id: str, path: str, ctx: NodeContext, parent_kind: str | None
) -> Node | None:
    """One node, top-level (`parent_kind` None) or inline in a map or parallel node.

    None when its kind is unknown (its other fields cannot be judged); otherwise a node
    with whatever of it parsed, its problems recorded.
    """
    if not isinstance(raw, Mapping):
        ctx.problems.append(f"{path}: a node must be a mapping, not {type_name(raw)}")
        return None
    given = FieldReader({str(k): v for k, v in raw.items()}, path, ctx.problems)
    kind = _kind(given, parent_kind)
    if kind is None:
        return None
    own = _TOP_FIELDS[kind] if parent_kind is None else ()
    allowed = ("kind", *own, *_KIND_FIELDS[kind])
    what = f"{_article(kind)} {kind} node" if parent_kind is None else f"an inline {kind} node"
    _refuse_inline_moves(given, parent_kind)
    given.only(allowed, what, judged_elsewhere=("next", "output") if parent_kind else ())
    given.require(_REQUIRED[kind] + (_TOP_REQUIRED[kind] if parent_kind is None else ()), what)
    fields = FieldReader({k: v for k, v in given.raw.items() if k in allowed}, path, ctx.problems)
    return Node(
        id=node_id, kind=kind, **_common(fields, ctx), **_KIND_PARSERS[kind](fields, ctx, node_id)
    )


def _refuse_inline_moves(fields: FieldReader, parent_kind: str | None) -> None:
    """An inline node neither moves on nor writes: its map or parallel node does both."""
    if parent_kind is None:
        return
    for name in ("next", "output"):
        if name in fields.raw:
            fields.problem(
                name, f"not for {_INLINE_PLACE[parent_kind]}: the {parent_kind} node has the {name}"
            )


def _inline(raw: Any, node_id: str, path: str, ctx: NodeContext, parent_kind: str) -> Node | None:
    if raw is None:
        return None  # reported as a missing required field
    return node_parse(raw, node_id, path, ctx, parent_kind)

"""Workflow definitions: the DESIGN example parses; each mistake is named by workflow, node, field."""

import copy
import datetime
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from workflows.definition import (
    END,
    NODE_KINDS,
    Case,
    Definition,
    Node,
    RetryPolicy,
    WorkflowInvalid,
    definition_parse,
)
from workflows.expressions import Expression, Template, expression_compile

# DESIGN.md "Workflows", as written there.
EXAMPLE_YAML = """
workflows:
  - slug: refund                 # unique; a run is a session of this workflow
    name: Refund with review
    role: support                # the role its tool nodes run with; a key must hold it to start a run
    input:                       # JSON Schema of the run's input
      type: object
      properties: {order_number: {type: string}}
      required: [order_number]
    start: lookup
    result: answer               # the state key returned as the run's result
    nodes:
      lookup:
        kind: tool               # tool | llm | choice | condition | human | agent | map | parallel | wait
        tool: get_order
        args: {number: input.order_number}     # each value is a CEL expression over the state
        output: order            # the one state key this node writes
        next: check
      check:
        kind: condition
        cases:
          - {when: "double(order.total) > 50.0", next: review}   # first true case wins
        default: refund
      review:
        kind: human              # an approval in the approvers' queue (contract above)
        summary: "Refund {{ order.total }} on {{ input.order_number }}"
        timeout_s: 600
        on_timeout: reject       # reject | approve
        next: refund             # approved
        rejected: tell_no        # rejected or expired
      refund:
        kind: tool
        tool: issue_coupon
        args: {customer_id: order.customer_id, amount: "double(order.total)"}
        output: coupon
        next: tell
      tell:
        kind: llm                # one model call: text, or JSON valid against output_schema
        prompt: "Tell the customer that coupon {{ coupon.code }} was issued."
        output: answer
        next: end                # `end` is reserved
      tell_no: {kind: llm, prompt: "Tell the customer the refund was declined.", output: answer, next: end}
"""
WHERE = "workflows[0] (refund)"
TOOLS: dict[str, list[str]] = {"get_order": [], "issue_coupon": ["support"]}
AGENTS = ("researcher", "billing")
MODELS = ("cheap", "smart")

# Every kind at once: a choice, a map of an agent, a parallel of a tool, an llm and a wait.
EVERY_KIND_YAML = """
slug: triage
role: support
model: smart
deadline_s: 3600
input: {type: object, properties: {topic: {type: string}}}
start: pick
result: report
nodes:
  pick:
    kind: choice
    prompt: "Which way for {{ input.topic }}?"
    system: "You route requests."
    options: {research: "the topic needs research", quick: "a short answer will do"}
    default: quick
    output: picked
    model: cheap
  quick:
    kind: llm
    prompt: "Answer briefly: {{ input.topic }}"
    output: report
    next: end
  research:
    kind: map
    over: "['history', 'today']"
    as: angle
    concurrency: 2
    node:
      kind: agent
      agent: researcher
      task: "'Research ' + input.topic + ' (' + angle + ', part ' + string(index) + ')'"
    output: findings
    next: both
  both:
    kind: parallel
    join: any
    branches:
      lookup: {kind: tool, tool: get_order, args: {number: "input.topic"}, timeout_s: 5}
      summary:
        kind: llm
        prompt: "Summarise {{ findings }}"
        output_schema: {type: object, properties: {text: {type: string}}}
      pause: {kind: wait, seconds: 30}
    output: gathered
    next: review
  review:
    kind: human
    summary: "Publish {{ gathered }}?"
    on_timeout: approve
    group: editors
    output: verdict
    next: write
  write:
    kind: llm
    prompt: "Write the report from {{ gathered }}"
    output: report
    max_visits: 3
    next: check
  check:
    kind: condition
    cases:
      - {when: "size(report) < 10", next: write}
    default: end
"""


def _example() -> dict[str, Any]:
    workflow: dict[str, Any] = yaml.safe_load(EXAMPLE_YAML)["workflows"][0]
    return workflow


def _parse(raw: Any, where: str = WHERE) -> Definition:
    return definition_parse(
        raw, where=where, known_tools=TOOLS, known_agents=AGENTS, known_models=MODELS
    )


def _errors(raw: Any) -> list[str]:
    with pytest.raises(WorkflowInvalid) as caught:
        _parse(raw)
    assert caught.value.errors, "WorkflowInvalid without errors"
    return caught.value.errors


def _mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    workflow = _example()
    change(workflow)
    return workflow


def _one_error(change: Callable[[dict[str, Any]], None]) -> str:
    errors = _errors(_mutated(change))
    assert len(errors) == 1, errors
    return errors[0]


def _nodes(workflow: dict[str, Any]) -> dict[str, Any]:
    nodes: dict[str, Any] = workflow["nodes"]
    return nodes


@pytest.fixture
def example() -> dict[str, Any]:
    return _example()


# --- the examples parse -----------------------------------------------------------------------


def test_the_design_example_parses(example: dict[str, Any]) -> None:
    definition = _parse(example)

    assert (definition.slug, definition.name, definition.role) == (
        "refund",
        "Refund with review",
        "support",
    )
    assert definition.description == ""
    assert definition.start == "lookup"
    assert definition.result == "answer"
    assert definition.model is None and definition.deadline_s is None
    assert definition.input_schema == example["input"]
    assert list(definition.nodes) == ["lookup", "check", "review", "refund", "tell", "tell_no"]
    assert definition.raw == example
    assert definition.writers() == {
        "order": ["lookup"],
        "coupon": ["refund"],
        "answer": ["tell", "tell_no"],
    }


def test_the_example_nodes_are_typed(example: dict[str, Any]) -> None:
    nodes = _parse(example).nodes

    lookup = nodes["lookup"]
    assert (lookup.kind, lookup.tool, lookup.output, lookup.next) == (
        "tool",
        "get_order",
        "order",
        "check",
    )
    assert lookup.args == {"number": expression_compile("input.order_number")}
    assert lookup.retry == RetryPolicy()
    check = nodes["check"]
    assert check.cases == (
        Case(when=expression_compile("double(order.total) > 50.0"), next="review"),
    )
    assert (check.default, check.next) == ("refund", None)
    review = nodes["review"]
    assert isinstance(review.summary, Template)
    assert (review.timeout_s, review.on_timeout, review.next, review.rejected) == (
        600.0,
        "reject",
        "refund",
        "tell_no",
    )
    assert isinstance(nodes["tell"].prompt, Template)


def test_successors_and_reads(example: dict[str, Any]) -> None:
    nodes = _parse(example).nodes

    assert {n: nodes[n].successors() for n in nodes} == {
        "lookup": ("check",),
        "check": ("review", "refund"),
        "review": ("refund", "tell_no"),
        "refund": ("tell",),
        "tell": (END,),
        "tell_no": (END,),
    }
    assert {n: nodes[n].reads() for n in nodes} == {
        "lookup": {"input"},
        "check": {"order"},
        "review": {"order", "input"},
        "refund": {"order"},
        "tell": {"coupon"},
        "tell_no": set(),
    }


def test_a_definition_is_immutable(example: dict[str, Any]) -> None:
    definition = _parse(example)

    with pytest.raises(AttributeError):
        definition.start = "check"  # type: ignore[misc]
    with pytest.raises(TypeError):
        definition.nodes["x"] = definition.nodes["lookup"]  # type: ignore[index]
    with pytest.raises(TypeError):
        definition.nodes["lookup"].args["x"] = expression_compile("1")  # type: ignore[index]


def test_raw_is_a_json_copy(example: dict[str, Any]) -> None:
    definition = _parse(example)
    example["nodes"]["lookup"]["tool"] = "changed"

    assert definition.raw["nodes"]["lookup"]["tool"] == "get_order"


def test_every_kind_parses() -> None:
    definition = _parse(yaml.safe_load(EVERY_KIND_YAML), where="workflows[1] (triage)")

    assert {node.kind for node in definition.nodes.values()} | {"tool", "agent", "wait"} == set(
        NODE_KINDS
    )
    assert (definition.model, definition.deadline_s) == ("smart", 3600.0)
    pick = definition.nodes["pick"]
    assert pick.options == {
        "research": "the topic needs research",
        "quick": "a short answer will do",
    }
    assert pick.successors() == ("research", "quick")
    assert (pick.model, pick.output) == ("cheap", "picked")
    research = definition.nodes["research"]
    assert (research.as_name, research.concurrency) == ("angle", 2)
    assert research.inner is not None and research.inner.id == "research.node"
    assert research.inner.retry == RetryPolicy()  # retries are a tool node's
    assert research.reads() == {"input"}  # `angle` and `index` are the map's own
    both = definition.nodes["both"]
    assert list(both.branches) == ["lookup", "summary", "pause"]
    assert both.join == "any" and both.reads() == {"input", "findings"}
    assert both.branches["summary"].output_schema == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
    }
    assert both.branches["pause"].seconds == expression_compile("30")
    review = definition.nodes["review"]
    assert (review.on_timeout, review.group, review.rejected) == ("approve", "editors", None)
    assert review.successors() == ("write",)
    assert definition.nodes["write"].max_visits == 3


def test_node_finds_inline_nodes_by_dotted_id() -> None:
    definition = _parse(yaml.safe_load(EVERY_KIND_YAML))

    assert definition.node("research").kind == "map"
    assert definition.node("research.node").kind == "agent"
    assert definition.node("both.summary").kind == "llm"
    assert definition.node("both.pause").id == "both.pause"
    for missing in ("nope", "research.x", "both.node", "quick.node", "both.summary.x"):
        with pytest.raises(KeyError):
            definition.node(missing)


def test_defaults_of_optional_fields(example: dict[str, Any]) -> None:
    del example["input"], example["result"], example["name"]

    definition = _parse(example)

    assert definition.input_schema == {"type": "object"}
    assert definition.result is None
    assert definition.name == "refund"


def test_a_yaml_number_is_a_cel_literal(example: dict[str, Any]) -> None:
    example["nodes"]["lookup"]["args"] = {"number": 1001, "strict": True}

    args = _parse(example).nodes["lookup"].args

    assert args == {"number": expression_compile("1001"), "strict": expression_compile("true")}


def test_a_loop_with_max_visits_parses(example: dict[str, Any]) -> None:
    nodes = _nodes(example)
    nodes["tell"]["next"] = "again"
    nodes["again"] = {
        "kind": "condition",
        "cases": [{"when": "answer == ''", "next": "tell"}],
        "default": "end",
        "max_visits": 2,
    }

    assert _parse(example).nodes["again"].successors() == ("tell", "end")


# --- unknown references ---------------------------------------------------------------------


def test_an_unknown_tool() -> None:
    assert _one_error(lambda w: w["nodes"]["lookup"].update(tool="get_ordr")) == (
        f"{WHERE}.nodes.lookup.tool: unknown tool 'get_ordr' (known: get_order, issue_coupon)"
    )


def test_an_unknown_agent() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "agent",
            "agent": "helper",
            "task": "'decline'",
            "output": "answer",
            "next": "end",
        }

    assert (
        _one_error(change)
        == f"{WHERE}.nodes.tell_no.agent: unknown agent 'helper' (known: billing, researcher)"
    )


def test_an_unknown_model() -> None:
    def change(w: dict[str, Any]) -> None:
        w["model"] = "gpt"
        w["nodes"]["tell"]["model"] = "fast"

    assert _errors(_mutated(change)) == [
        f"{WHERE}.model: unknown model 'gpt' (known: cheap, smart)",
        f"{WHERE}.nodes.tell.model: unknown model 'fast' (known: cheap, smart)",
    ]


KNOWN_NODES = "check, end, lookup, refund, review, tell, tell_no"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            lambda w: w.update(start="lokup"),
            "start: unknown node 'lokup' (known: check, lookup, refund, review, tell, tell_no)",
        ),
        (lambda w: w.update(start="end"), "start: must name a node, not 'end'"),
        (
            lambda w: w["nodes"]["lookup"].update(next="chek"),
            f"nodes.lookup.next: unknown node 'chek' (known: {KNOWN_NODES})",
        ),
        (
            lambda w: w["nodes"]["check"]["cases"][0].update(next="reveiw"),
            f"nodes.check.cases[0].next: unknown node 'reveiw' (known: {KNOWN_NODES})",
        ),
        (
            lambda w: w["nodes"]["check"].update(default="refnd"),
            f"nodes.check.default: unknown node 'refnd' (known: {KNOWN_NODES})",
        ),
        (
            lambda w: w["nodes"]["review"].update(rejected="tell_nope"),
            f"nodes.review.rejected: unknown node 'tell_nope' (known: {KNOWN_NODES})",
        ),
    ],
)
def test_an_unknown_node(change: Callable[[dict[str, Any]], None], error: str) -> None:
    assert _one_error(change) == f"{WHERE}.{error}"


def test_an_unknown_node_among_a_choices_options() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["check"] = {
            "kind": "choice",
            "prompt": "Review {{ order.total }}?",
            "options": {"review": "a large refund", "refnd": "a small one"},
            "default": "review",
        }

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.check.options.refnd: unknown node 'refnd' (known: {KNOWN_NODES})",
    ]


# --- CEL syntax -----------------------------------------------------------------------------


def _syntax_error_at(path: str, change: Callable[[dict[str, Any]], None]) -> None:
    error = _one_error(change)
    assert error.startswith(f"{WHERE}.nodes.{path}: CEL syntax error: "), error
    assert "\n" not in error


def test_a_syntax_error_in_args() -> None:
    _syntax_error_at(
        "lookup.args.number",
        lambda w: w["nodes"]["lookup"]["args"].update(number="input.order_number +"),
    )


def test_a_syntax_error_in_a_case() -> None:
    _syntax_error_at(
        "check.cases[0].when",
        lambda w: w["nodes"]["check"]["cases"][0].update(when="order.total >> 50"),
    )


@pytest.mark.parametrize("field", ["prompt", "system"])
def test_a_syntax_error_in_an_llm_placeholder(field: str) -> None:
    _syntax_error_at(
        f"tell.{field}", lambda w: w["nodes"]["tell"].update({field: "Coupon {{ coupon. }}"})
    )


def test_a_syntax_error_in_a_summary_placeholder() -> None:
    _syntax_error_at(
        "review.summary", lambda w: w["nodes"]["review"].update(summary="{{ order.total ) }}")
    )


def test_an_unclosed_placeholder() -> None:
    assert _one_error(lambda w: w["nodes"]["tell"].update(prompt="Coupon {{ coupon.code")) == (
        f"{WHERE}.nodes.tell.prompt: unclosed '{{{{' at column 8"
    )


def test_a_syntax_error_in_a_task() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "agent",
            "agent": "billing",
            "task": "'decline' +",
            "output": "answer",
            "next": "end",
        }

    _syntax_error_at("tell_no.task", change)


def test_a_syntax_error_in_over_and_in_an_inline_node() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "map",
            "over": "[1, 2",
            "node": {"kind": "tool", "tool": "get_order", "args": {"number": "item +"}},
            "output": "answer",
            "next": "end",
        }

    errors = _errors(_mutated(change))
    assert [e.split(": CEL syntax error")[0] for e in errors] == [
        f"{WHERE}.nodes.tell_no.over",
        f"{WHERE}.nodes.tell_no.node.args.number",
    ]


def test_a_syntax_error_in_seconds_of_a_branch() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "parallel",
            "branches": {"pause": {"kind": "wait", "seconds": "60 *"}},
            "output": "answer",
            "next": "end",
        }

    _syntax_error_at("tell_no.branches.pause.seconds", change)


def test_a_constant_that_cannot_be_a_wait_or_a_list() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {"kind": "wait", "seconds": "'soon'", "next": "tell_no_map"}
        w["nodes"]["tell_no_map"] = {
            "kind": "map",
            "over": "{'a': 1}",
            "node": {"kind": "llm", "prompt": "{{ item }}"},
            "output": "answer",
            "next": "end",
        }

    assert _errors(_mutated(change)) == [
        f'{WHERE}.nodes.tell_no.seconds: must give a number of seconds >= 0, gives "soon"',
        f'{WHERE}.nodes.tell_no_map.over: must give a list, gives {{"a": 1}}',
    ]


# --- data flow ------------------------------------------------------------------------------


def test_an_expression_naming_a_key_no_node_writes() -> None:
    assert _one_error(lambda w: w["nodes"]["lookup"]["args"].update(number="ordr.number")) == (
        f"{WHERE}.nodes.lookup.args.number: names 'ordr', which is not written on every path "
        "to this node (written: input)"
    )


def test_an_expression_naming_a_key_written_on_some_paths_only() -> None:
    # check -> review -> tell_no never passes refund, which writes `coupon`.
    assert _one_error(
        lambda w: w["nodes"]["tell_no"].update(prompt="Coupon {{ coupon.code }} not issued")
    ) == (
        f"{WHERE}.nodes.tell_no.prompt: names 'coupon', which is not written on every path "
        "to this node (written: input, order)"
    )


def test_a_node_reads_its_own_output_only_on_a_later_visit() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["lookup"]["args"]["number"] = "order.number"

    assert _one_error(change).startswith(
        f"{WHERE}.nodes.lookup.args.number: names 'order', which is not written"
    )


def test_an_inline_node_reads_the_item_and_index_but_not_its_parents_output() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "map",
            "over": "order.lines",
            "as": "line",
            "node": {"kind": "llm", "prompt": "{{ index }}: {{ line.sku }} of {{ answer }}"},
            "output": "answer",
            "next": "end",
        }

    assert _one_error(change) == (
        f"{WHERE}.nodes.tell_no.node.prompt: names 'answer', which is not written on every path "
        "to this node (written: index, input, line, order)"
    )


def test_a_parallel_output_exists_only_after_its_join() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "parallel",
            "branches": {"a": {"kind": "llm", "prompt": "{{ both }}"}},
            "output": "both",
            "next": "after",
        }
        w["nodes"]["after"] = {
            "kind": "llm",
            "prompt": "{{ both.a }}",
            "output": "answer",
            "next": "end",
        }

    assert _one_error(change) == (
        f"{WHERE}.nodes.tell_no.branches.a.prompt: names 'both', which is not written on every "
        "path to this node (written: input, order)"
    )


def test_a_loop_does_not_write_before_its_first_pass() -> None:
    workflow = yaml.safe_load(EVERY_KIND_YAML)
    workflow["nodes"]["write"]["prompt"] = "Improve {{ report }}"

    with pytest.raises(WorkflowInvalid) as caught:
        _parse(workflow, where="w")

    assert caught.value.errors == [
        "w.nodes.write.prompt: names 'report', which is not written on every path to this node "
        "(written: findings, gathered, input, picked, verdict)"
    ]


def test_choice_and_human_outputs_are_written() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["review"]["output"] = "decision"
        w["nodes"]["tell_no"]["prompt"] = "Declined: {{ decision }}"

    assert _parse(_mutated(change)).nodes["review"].output == "decision"


def test_comprehension_names_are_not_state_keys() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["check"]["cases"][0]["when"] = "order.lines.exists(l, l.total > 50.0)"

    assert _parse(_mutated(change)).nodes["check"].reads() == {"order"}


# --- graph ------------------------------------------------------------------------------------


def test_an_unreachable_node() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["orphan"] = {"kind": "llm", "prompt": "Hi", "output": "answer", "next": "end"}

    assert _one_error(change) == f"{WHERE}.nodes.orphan: unreachable from start 'lookup'"


def test_a_node_that_cannot_reach_end() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell"]["next"] = "again"
        w["nodes"]["again"] = {
            "kind": "llm",
            "prompt": "Again",
            "output": "answer",
            "next": "tell",
            "max_visits": 3,
        }

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.{node}: cannot reach end (no path from this node leads to end)"
        for node in ("refund", "tell", "again")
    ]


def test_a_cycle_without_max_visits() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell"]["next"] = "again"
        w["nodes"]["again"] = {
            "kind": "condition",
            "cases": [{"when": "answer == ''", "next": "tell"}],
            "default": "end",
        }

    assert _one_error(change) == (
        f"{WHERE}.nodes.tell: cycle tell -> again -> tell without max_visits (set max_visits on one of its nodes)"
    )


def test_a_self_loop_without_max_visits() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["check"]["cases"].append({"when": "false", "next": "check"})

    assert _one_error(change) == (
        f"{WHERE}.nodes.check: cycle check -> check without max_visits (set max_visits on one of its nodes)"
    )


def test_an_unknown_edge_is_reported_once() -> None:
    # The edge to nowhere is its own mistake: no "cannot reach end" on top of it.
    assert len(_errors(_mutated(lambda w: w["nodes"]["tell"].update(next="ennd")))) == 1


# --- roles ----------------------------------------------------------------------------------


def test_a_tool_the_role_may_not_use() -> None:
    assert _one_error(lambda w: w.update(role="sales")) == (
        f"{WHERE}.nodes.refund.tool: the workflow's role 'sales' may not use tool 'issue_coupon' "
        "(allowed roles: support)"
    )


def test_a_tool_the_role_may_not_use_inside_a_branch() -> None:
    def change(w: dict[str, Any]) -> None:
        w["role"] = "sales"
        w["nodes"]["refund"] = {
            "kind": "parallel",
            "branches": {
                "a": {"kind": "tool", "tool": "get_order"},
                "b": {"kind": "tool", "tool": "issue_coupon"},
            },
            "output": "coupon",
            "next": "tell",
        }

    assert _one_error(change).startswith(
        f"{WHERE}.nodes.refund.branches.b.tool: the workflow's role 'sales'"
    )


# --- structure ------------------------------------------------------------------------------


def test_an_unknown_workflow_field() -> None:
    assert _one_error(lambda w: w.update(strat="lookup")) == (
        f"{WHERE}.strat: unknown field for a workflow (allowed: slug, name, description, role, "
        "input, start, result, model, deadline_s, nodes, rules)"
    )


def test_an_unknown_node_field() -> None:
    assert _one_error(lambda w: w["nodes"]["lookup"].update(arg={})) == (
        f"{WHERE}.nodes.lookup.arg: unknown field for a tool node (allowed: kind, next, output, "
        "max_visits, tool, args, timeout_s, retry)"
    )


def test_a_field_of_another_kind_is_unknown() -> None:
    assert _one_error(lambda w: w["nodes"]["tell"].update(tool="get_order")).startswith(
        f"{WHERE}.nodes.tell.tool: unknown field for an llm node (allowed: kind, next, output, max_visits, prompt,"
    )


def test_unknown_fields_of_a_case_and_a_retry() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["check"]["cases"][0]["then"] = "x"
        w["nodes"]["lookup"]["retry"] = {"attempts": 3}

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.lookup.retry.attempts: unknown field for retry (allowed: max_attempts, backoff_s, max_backoff_s)",
        f"{WHERE}.nodes.check.cases[0].then: unknown field for a case (allowed: when, next)",
    ]


def test_an_unknown_kind() -> None:
    assert _one_error(lambda w: w["nodes"]["tell"].update(kind="prompt")) == (
        f"{WHERE}.nodes.tell.kind: must be one of {', '.join(NODE_KINDS)}, not 'prompt'"
    )


def test_a_node_without_kind() -> None:
    assert (
        _one_error(lambda w: w["nodes"]["tell"].pop("kind"))
        == f"{WHERE}.nodes.tell.kind: required for every node"
    )


@pytest.mark.parametrize(
    ("kind", "required"),
    [
        ("tool", ["tool", "next"]),
        ("llm", ["prompt", "next", "output"]),
        ("choice", ["prompt", "options", "default"]),
        ("condition", ["cases", "default"]),
        ("human", ["summary", "next"]),
        ("agent", ["agent", "task", "next", "output"]),
        ("map", ["over", "node", "next", "output"]),
        ("parallel", ["branches", "next", "output"]),
        ("wait", ["seconds", "next"]),
    ],
)
def test_required_fields_per_kind(kind: str, required: list[str]) -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {"kind": kind}

    errors = _errors(_mutated(change))

    article = "an" if kind in ("llm", "agent") else "a"
    assert errors == [
        f"{WHERE}.nodes.tell_no.{field}: required for {article} {kind} node" for field in required
    ]


def test_an_empty_condition_or_parallel() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["check"]["cases"] = []
        w["nodes"]["tell_no"] = {
            "kind": "parallel",
            "branches": {},
            "output": "answer",
            "next": "end",
        }

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.check.cases: must be a non-empty list of {{when, next}}, not empty",
        f"{WHERE}.nodes.tell_no.branches: must name at least one branch",
    ]


def test_condition_and_choice_take_no_next() -> None:
    assert _one_error(lambda w: w["nodes"]["check"].update(next="refund")).startswith(
        f"{WHERE}.nodes.check.next: unknown field for a condition node (allowed: kind, max_visits, cases, default)"
    )


def test_inline_nodes_neither_move_on_nor_write() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "map",
            "over": "order.lines",
            "node": {
                "kind": "llm",
                "prompt": "{{ item }}",
                "output": "x",
                "next": "end",
                "max_visits": 2,
            },
            "output": "answer",
            "next": "end",
        }

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.tell_no.node.next: not for a map's node: the map node has the next",
        f"{WHERE}.nodes.tell_no.node.output: not for a map's node: the map node has the output",
        f"{WHERE}.nodes.tell_no.node.max_visits: unknown field for an inline llm node "
        "(allowed: kind, prompt, system, output_schema, model)",
    ]


@pytest.mark.parametrize(
    ("parent", "inline_kind", "error"),
    [
        ("map", "wait", "node.kind: a map's node must be one of tool, llm, agent, not 'wait'"),
        (
            "parallel",
            "human",
            "branches.a.kind: a parallel branch must be one of tool, llm, agent, wait, not 'human'",
        ),
        (
            "parallel",
            "map",
            "branches.a.kind: a parallel branch must be one of tool, llm, agent, wait, not 'map'",
        ),
    ],
)
def test_inline_kinds(parent: str, inline_kind: str, error: str) -> None:
    inline = {"kind": inline_kind}
    node: dict[str, Any] = {"kind": parent, "output": "answer", "next": "end"}
    node.update({"over": "[1]", "node": inline} if parent == "map" else {"branches": {"a": inline}})

    assert _one_error(lambda w: w["nodes"].update(tell_no=node)) == f"{WHERE}.nodes.tell_no.{error}"


@pytest.mark.parametrize(
    ("slug", "valid"),
    [
        ("refund", True),
        ("refund-2_b", True),
        ("Refund", False),
        ("2refund", False),
        ("", False),
        ("a" * 101, False),
    ],
)
def test_slug_format(slug: str, valid: bool) -> None:
    workflow = _mutated(lambda w: w.update(slug=slug))
    if valid:
        assert _parse(workflow).slug == slug
    else:
        assert _errors(workflow)[0].startswith(f"{WHERE}.slug: ")


def test_node_id_format_and_reserved_ids() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell-no"] = w["nodes"]["end"] = w["nodes"]["input"] = {
            "kind": "wait",
            "seconds": 1,
            "next": "end",
        }

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.tell-no: 'tell-no' is not a name (a letter or '_', then up to 62 letters, digits or '_')",
        f"{WHERE}.nodes.end: 'end' is reserved; choose another id",
        f"{WHERE}.nodes.input: 'input' is reserved; choose another id",
    ]


def test_an_edge_to_a_node_with_a_bad_id_is_not_unknown() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell-no"] = w["nodes"].pop("tell_no")
        w["nodes"]["review"]["rejected"] = "tell-no"

    assert _one_error(change).startswith(f"{WHERE}.nodes.tell-no: 'tell-no' is not a name")


def test_an_output_named_input_or_a_cel_word() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["lookup"]["output"] = "input"
        w["nodes"]["refund"]["output"] = "null"

    errors = _errors(_mutated(change))
    assert errors[:2] == [
        f"{WHERE}.nodes.lookup.output: 'input' is the run's input; choose another key",
        f"{WHERE}.nodes.refund.output: 'null' is reserved in CEL; choose another key",
    ]


def test_an_output_colliding_with_a_maps_item_name() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "map",
            "over": "order.lines",
            "as": "order",
            "node": {"kind": "llm", "prompt": "{{ order }}"},
            "output": "answer",
            "next": "end",
        }

    assert _one_error(change) == (
        f"{WHERE}.nodes.tell_no.as: 'order' is also a state key (written by lookup); choose another name"
    )


@pytest.mark.parametrize("name", ["index", "input"])
def test_a_maps_item_name_cannot_hide_index_or_input(name: str) -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "map",
            "over": "order.lines",
            "as": name,
            "node": {"kind": "llm", "prompt": "hi"},
            "output": "answer",
            "next": "end",
        }

    assert _one_error(change).startswith(f"{WHERE}.nodes.tell_no.as: '{name}' is ")


def test_role_is_required() -> None:
    assert _one_error(lambda w: w.pop("role")) == f"{WHERE}.role: required for a workflow"


def test_every_required_workflow_field() -> None:
    assert _errors({}) == [
        f"{WHERE}.{field}: required for a workflow" for field in ("slug", "role", "start", "nodes")
    ]


def test_the_input_must_be_an_object_schema() -> None:
    assert _one_error(lambda w: w.update(input={"type": "string"})) == (
        f"{WHERE}.input: the top level must be {{type: object}}"
    )
    assert _one_error(lambda w: w.update(input={"type": "object", "required": "x"})).startswith(
        f"{WHERE}.input: not a valid JSON Schema: "
    )


def test_an_output_schema_must_be_a_json_schema() -> None:
    assert _one_error(
        lambda w: w["nodes"]["tell"].update(output_schema={"type": "thing"})
    ).startswith(f"{WHERE}.nodes.tell.output_schema: not a valid JSON Schema: ")


def test_the_result_must_be_written() -> None:
    assert _one_error(lambda w: w.update(result="anwser")) == (
        f"{WHERE}.result: no node writes 'anwser' (written: answer, coupon, order)"
    )


@pytest.mark.parametrize(
    ("node", "field", "value", "error"),
    [
        ("tell_no", "concurrency", 0, None),
        ("tell_no", "concurrency", 51, "must be an integer from 1 to 50, not 51"),
        ("lookup", "max_visits", 0, "must be an integer from 1 to 1000, not 0"),
        ("lookup", "max_visits", True, "must be an integer from 1 to 1000, not True"),
        ("lookup", "max_visits", 10**9, "must be an integer from 1 to 1000, not 1000000000"),
        ("lookup", "timeout_s", 0, "must be a number > 0, not 0"),
        ("lookup", "timeout_s", "10", "must be a number > 0, not str"),
        ("tell_no", "join", "some", "must be one of all, any, not 'some'"),
        ("review", "on_timeout", "escalate", "must be one of reject, approve, not 'escalate'"),
    ],
)
def test_field_ranges(node: str, field: str, value: Any, error: str | None) -> None:
    def change(w: dict[str, Any]) -> None:
        if node == "tell_no" and field == "concurrency":
            w["nodes"]["tell_no"] = {
                "kind": "map",
                "over": "[1]",
                "node": {"kind": "llm", "prompt": "x"},
                "output": "answer",
                "next": "end",
            }
        if node == "tell_no" and field == "join":
            w["nodes"]["tell_no"] = {
                "kind": "parallel",
                "branches": {"a": {"kind": "llm", "prompt": "x"}},
                "output": "answer",
                "next": "end",
            }
        w["nodes"][node][field] = value

    expected = error or "must be an integer from 1 to 50, not 0"
    assert _one_error(change) == f"{WHERE}.nodes.{node}.{field}: {expected}"


@pytest.mark.parametrize(
    ("retry", "error"),
    [
        ({"max_attempts": 0}, "retry.max_attempts: must be an integer from 1 to 10, not 0"),
        ({"max_attempts": 11}, "retry.max_attempts: must be an integer from 1 to 10, not 11"),
        ({"backoff_s": -1}, "retry.backoff_s: must be a number >= 0, not -1"),
        ({"backoff_s": 60}, "retry.max_backoff_s: must be at least backoff_s (60)"),
        ([3], "retry: must be a mapping, not a list"),
    ],
)
def test_retry_fields(retry: Any, error: str) -> None:
    assert (
        _one_error(lambda w: w["nodes"]["lookup"].update(retry=retry))
        == f"{WHERE}.nodes.lookup.{error}"
    )


def test_a_deadline_must_be_positive() -> None:
    assert (
        _one_error(lambda w: w.update(deadline_s=-5))
        == f"{WHERE}.deadline_s: must be a number > 0, not -5"
    )


def test_wrong_types() -> None:
    def change(w: dict[str, Any]) -> None:
        w["nodes"]["lookup"]["args"] = ["input.order_number"]
        w["nodes"]["check"]["cases"] = [["order.total > 50", "review"]]
        w["nodes"]["tell"]["prompt"] = 42
        w["nodes"]["tell_no"] = "llm"

    assert _errors(_mutated(change)) == [
        f"{WHERE}.nodes.lookup.args: must be a mapping, not a list",
        f"{WHERE}.nodes.check.cases[0]: must be a mapping {{when, next}}, not a list",
        f"{WHERE}.nodes.tell.prompt: must be a string, not int",
        f"{WHERE}.nodes.tell_no: a node must be a mapping, not str",
    ]


def test_nodes_must_be_a_non_empty_mapping() -> None:
    assert (
        _one_error(lambda w: w.update(nodes=["lookup"]))
        == f"{WHERE}.nodes: must be a mapping, not a list"
    )
    assert _errors(_mutated(lambda w: w.update(nodes={})))[0] == (
        f"{WHERE}.nodes: must declare at least one node"
    )


def test_a_workflow_must_be_a_mapping() -> None:
    assert _errors(["refund"]) == [f"{WHERE}: a workflow must be a mapping, not a list"]


def test_a_value_json_cannot_hold() -> None:
    def change(w: dict[str, Any]) -> None:
        w["input"]["properties"]["order_number"]["examples"] = [datetime.date(2024, 1, 1)]

    assert _one_error(change) == (
        f"{WHERE}: not JSON-compatible: Object of type date is not JSON serializable"
    )


# --- all at once ------------------------------------------------------------------------------


def test_every_error_is_collected_in_a_stable_order() -> None:
    def change(w: dict[str, Any]) -> None:
        w["slug"] = "Refund"
        w["nodes"]["lookup"]["tool"] = "get_ordr"
        w["nodes"]["check"]["cases"][0]["when"] = "order.total >"
        w["nodes"]["refund"]["args"]["amount"] = "cupon.amount"
        w["nodes"]["tell"]["next"] = "ennd"

    first = _errors(_mutated(change))
    assert [error.split(": ")[0] for error in first] == [
        f"{WHERE}.slug",
        f"{WHERE}.nodes.lookup.tool",
        f"{WHERE}.nodes.check.cases[0].when",
        f"{WHERE}.nodes.tell.next",
        f"{WHERE}.nodes.refund.args.amount",
    ]
    assert _errors(_mutated(change)) == first


def test_workflow_invalid_carries_the_list() -> None:
    error = WorkflowInvalid(["a: x", "b: y"])

    assert error.errors == ["a: x", "b: y"]
    assert str(error) == "a: x; b: y"


def test_nodes_are_plain_values() -> None:
    node = Node(id="n", kind="wait", next="end", seconds=expression_compile("5"))

    assert node.successors() == ("end",)
    assert node.reads() == frozenset()
    assert node.retry == RetryPolicy(max_attempts=1, backoff_s=1.0, max_backoff_s=30.0)
    assert isinstance(node.seconds, Expression)
    assert copy.deepcopy(node) == node


def test_a_definition_pickles() -> None:
    definition = _parse(yaml.safe_load(EVERY_KIND_YAML))

    assert pickle.loads(pickle.dumps(definition)) == definition
    assert copy.deepcopy(definition).node("both.summary") == definition.node("both.summary")


def test_a_workflow_of_more_than_500_nodes_is_refused_before_its_nodes_are_read() -> None:
    def many(w: dict[str, Any]) -> None:
        w["nodes"].update(
            {f"n{i}": {"kind": "wait", "seconds": "1", "next": "end"} for i in range(495)}
        )

    assert len(_mutated(many)["nodes"]) == 501
    assert _one_error(many) == (f"{WHERE}.nodes: has 501 nodes; at most 500 (WORKFLOW_MAX_NODES)")


def test_a_parallel_node_of_more_than_32_branches_is_refused() -> None:
    def wide(w: dict[str, Any]) -> None:
        w["nodes"]["tell_no"] = {
            "kind": "parallel",
            "branches": {f"b{i}": {"kind": "llm", "prompt": "x"} for i in range(33)},
            "output": "answer",
            "next": "end",
        }

    assert _one_error(wide) == (
        f"{WHERE}.nodes.tell_no.branches: has 33 branches; at most 32 (WORKFLOW_MAX_BRANCHES)"
    )


def test_comprehensions_nested_three_deep_are_refused_naming_node_and_field() -> None:
    nested = "order.items.all(a, order.items.all(b, order.items.all(c, a == b)))"
    error = _one_error(lambda w: w["nodes"]["check"]["cases"][0].update(when=nested))
    assert error.startswith(f"{WHERE}.nodes.check.cases[0].when: expression_limit: ")
    assert "nests comprehensions 3 deep, more than EXPRESSION_MAX_NESTING (2)" in error


def test_a_human_nodes_card_fields_parse_and_bad_ones_are_named() -> None:
    def card(workflow: dict[str, Any]) -> None:
        _nodes(workflow)["review"].update(
            title="Refund",
            show={"amount": "order.total"},
            risk_level=3,
            editable=["order"],
        )

    review = _parse(_mutated(card)).nodes["review"]
    assert (review.title, review.risk_level, review.editable) == ("Refund", 3, ("order",))
    assert review.show["amount"].evaluate({"order": {"total": 5}}) == 5

    assert "nodes.review.risk_level: must be an integer from 0 to 3" in _one_error(
        lambda w: _nodes(w)["review"].update(risk_level=4)
    )
    assert "nodes.review.editable: must be a list of state value names" in _one_error(
        lambda w: _nodes(w)["review"].update(editable="order")
    )
    assert "nodes.review.show.amount" in _one_error(
        lambda w: _nodes(w)["review"].update(show={"amount": "order.total +"})
    )

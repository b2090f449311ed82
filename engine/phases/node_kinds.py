"""The workflow node kinds: how each settles a node of its kind in a node step's walk.

A handler gets the walk (engine/phases/node.py: the run's state, the calls its nodes
opened, the step's writes), the node, the node's progress and what an inline node sees
besides the state (a map's item and index); it returns the node's outcome: done (its
output and the next node), waiting (for a call it opened) or failed. `NODE_KINDS` is the
registry the walk looks a node's kind up in.
"""

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from engine.gates.budget import budget_hold, model_gate, model_rate_limit
from engine.model.calls import call_model
from engine.model.context import AGENT_TOOL_PREFIX
from engine.model.credits import model_credits_check
from engine.model.structured import answer_check, answer_instruction, repair_messages
from llm.types import ChatMessage, ChatRequest, ResponseFormat
from record.models import ModelEndpoint, ToolCall, ToolCallStatus
from workflows.definition import Node
from workflows.expressions import EvaluationError
from workflows.node_tools import WAIT_TOOL, review_tool_name

if TYPE_CHECKING:
    from engine.phases.node import Walk


@dataclass(frozen=True)
class Done:
    output: Any
    next: str | None = None  # inline nodes have no edge of their own


@dataclass(frozen=True)
class Waiting:
    pass


@dataclass(frozen=True)
class Failed:
    error: str


Outcome = Done | Waiting | Failed
WAITING = Waiting()


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class ModelFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _picked(text: str, options: list[str]) -> str | None:
    """The option an answer names: `{"option": name}` (structured output), the bare name, or
    the one option the text mentions."""
    try:
        structured = json.loads(text)
    except ValueError:
        structured = None
    if isinstance(structured, dict) and structured.get("option") in options:
        return str(structured["option"])
    cleaned = text.strip().strip(".'\"`").strip()
    if cleaned in options:
        return cleaned
    lowered = {o.lower(): o for o in options}
    if cleaned.lower() in lowered:
        return lowered[cleaned.lower()]
    mentioned = [o for o in options if o.lower() in text.lower()]
    return mentioned[0] if len(mentioned) == 1 else None


def _condition(
    walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]
) -> Outcome:
    scope = walk.scope(extra)
    for case in node.cases:
        if case.when.evaluate(scope) is True:
            return Done(None, case.next)
    return Done(None, node.default)


def _tool(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    assert node.tool is not None
    arguments = None
    in_step = False
    if "call" not in progress:
        scope = walk.scope(extra)
        arguments = {name: expr.evaluate(scope) for name, expr in node.args.items()}
        in_step = not walk.ran_in_step and walk.in_step_allowed(node, progress)
    found = walk.called(node, progress, extra, node.tool, arguments, in_step)
    if not isinstance(found, ToolCall):
        return found
    if found.status == ToolCallStatus.SUCCESS:
        return Done(found.output, node.next)
    return walk.retry_or_fail(
        node, progress, found, found.error or f"{node.tool} ended {found.status}"
    )


def _human(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    arguments = None
    if "call" not in progress:
        assert node.summary is not None
        scope = walk.scope(extra)
        # What the approver's card says is decided (approvals/ shows it as it is).
        arguments = {
            "summary": node.summary.render(scope),
            "workflow": walk.definition.slug,
            "node": node.id,
            "title": node.title or node.id,
            "show": {label: e.evaluate(scope) for label, e in node.show.items()},
        }
        if node.editable:
            values = walk.state.values
            arguments["editable"] = {name: values.get(name) for name in node.editable}
    found = walk.called(node, progress, extra, review_tool_name(node.id), arguments)
    if not isinstance(found, ToolCall):
        return found
    if found.status == ToolCallStatus.SUCCESS:
        output = dict(found.output or {})
        output["approved"] = True
        edited = found.input.get("editable") if isinstance(found.input, dict) else None
        if isinstance(edited, dict):
            # The approver's edits (only the names the node declares) are what the
            # next node reads.
            for name in node.editable:
                if name in edited:
                    walk.state.values[name] = edited[name]
        return Done(output, node.next)
    if found.status == ToolCallStatus.REJECTED:
        output = {"approved": False, "reason": found.error}
        if node.rejected:
            return Done(output, node.rejected)
        return Failed(f"rejected: {found.error}")
    return Failed(found.error or f"review ended {found.status}")


def _wait(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    arguments = None
    if "call" not in progress:
        assert node.seconds is not None
        seconds = node.seconds.evaluate(walk.scope(extra))
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            return Failed(f"seconds must be a number, not {compact(seconds)}")
        if seconds <= 0:
            return Done(None, node.next)
        arguments = {"after_seconds": max(1, round(seconds)), "note": f"wait node {node.id}"}
    found = walk.called(node, progress, extra, WAIT_TOOL, arguments)
    if not isinstance(found, ToolCall):
        return found
    if found.status == ToolCallStatus.SUCCESS:
        return Done(None, node.next)
    return Failed(found.error or "the timer could not be set")


def _agent(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    """The agent's loop as a child session (engine/gates/children.py); the output is its
    answer. The run holds no worker meanwhile."""
    assert node.agent is not None and node.task is not None
    arguments = None
    if "call" not in progress:
        task = node.task.evaluate(walk.scope(extra))
        if not isinstance(task, str) or not task.strip():
            return Failed(f"task must give a non-empty string, not {compact(task)[:200]}")
        arguments = {"task": task}
    found = walk.called(node, progress, extra, f"{AGENT_TOOL_PREFIX}{node.agent}", arguments)
    if not isinstance(found, ToolCall):
        return found
    if found.status == ToolCallStatus.SUCCESS and isinstance(found.output, dict):
        return Done(found.output.get("answer"), node.next)
    return walk.retry_or_fail(node, progress, found, found.error or "the agent's run failed")


def _endpoint(walk: "Walk", node: Node) -> ModelEndpoint | None:
    name = node.model or walk.definition.model
    if not name:
        return None
    return ModelEndpoint.objects.filter(name=name, enabled=True).first()


def _ask(
    walk: "Walk", node: Node, messages: list[ChatMessage], answer: ResponseFormat | None
) -> str:
    """One model call through the adapters (the run's agent: fallback, budgets, credits,
    the rate limit); its record rides on this step's commit. Raises ModelFailed."""
    agent = walk.runtime.agent
    request = ChatRequest(
        messages=tuple(messages),
        tool_choice="none",
        response_format=answer,
        agent_config={"rules": list(agent.rules or []), "fallback_answer": ""},
    )
    override = _endpoint(walk, node)
    gate = model_gate(walk.session, agent, request, keep=walk.run.figures, chosen=override)
    if not gate.verdict.allowed:
        raise ModelFailed(f"budget_exceeded: {gate.verdict.message}")
    check = model_credits_check(
        walk.session,
        gate.endpoint,
        request,
        settings.BUDGET_OUTPUT_ESTIMATE_TOKENS,
        None,
        walk.run.figures.points_since,
    )
    if check is not None and check.outcome == "insufficient":
        raise ModelFailed(
            f"insufficient_credits: the model call needs {check.points} points, {check.points_left} left"
        )
    model_rate_limit(walk.session, gate.endpoint, gate.request)
    gate = budget_hold(walk.session, gate)
    if not gate.verdict.allowed:
        raise ModelFailed(f"budget_exceeded: {gate.verdict.message}")
    tier = override or gate.tier
    routed = call_model(walk.session, agent, gate.request, tier=tier)
    walk.writes.model_calls += routed.calls
    if routed.response is None:
        raise ModelFailed(str(routed.error) if routed.error else "the model call failed")
    return routed.response.text


def _prompt_messages(walk: "Walk", node: Node, extra: dict[str, Any]) -> list[ChatMessage]:
    scope = walk.scope(extra)
    assert node.prompt is not None
    messages = []
    if node.system is not None:
        messages.append(ChatMessage(role="system", content=node.system.render(scope)))
    messages.append(ChatMessage(role="user", content=node.prompt.render(scope)))
    return messages


def _llm(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    messages = _prompt_messages(walk, node, extra)
    if node.output_schema is None:
        try:
            return Done(_ask(walk, node, messages, None), node.next)
        except ModelFailed as exc:
            return Failed(exc.message)
    answer = ResponseFormat(schema=node.output_schema)
    messages = [*messages, ChatMessage(role="system", content=answer_instruction(answer))]
    problem = ""
    for _attempt in range(2):  # the answer, then one repair with what was wrong
        try:
            text = _ask(walk, node, messages, answer)
        except ModelFailed as exc:
            return Failed(exc.message)
        checked = answer_check(text, answer)
        problem = checked.problem
        if not problem:
            return Done(checked.value, node.next)
        messages += repair_messages(text, problem)
    return Failed(f"invalid_json: the model's answer is not valid against output_schema: {problem}")


def _choice(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    options = list(node.options)
    listing = "\n".join(f"- {name}: {when}" for name, when in node.options.items())
    messages = [
        *_prompt_messages(walk, node, extra),
        ChatMessage(
            role="system",
            content=f"Pick exactly one option. Options:\n{listing}\n"
            f"Answer with the option's name only: one of {', '.join(options)}.",
        ),
    ]
    # Constrained where the wire has structured output: the answer can only be an option.
    schema = {
        "type": "object",
        "properties": {"option": {"type": "string", "enum": options}},
        "required": ["option"],
        "additionalProperties": False,
    }
    for _attempt in range(2):  # an invalid pick is asked again once, then the default
        try:
            text = _ask(walk, node, messages, ResponseFormat(schema=schema, name="option"))
        except ModelFailed as exc:
            return Failed(exc.message)
        picked = _picked(text, options)
        if picked is not None:
            return Done(picked, picked)
        messages += [
            ChatMessage(role="assistant", content=text),
            ChatMessage(
                role="user",
                content=f"'{text.strip()[:200]}' is not one of the options. Answer with one of: {', '.join(options)}.",
            ),
        ]
    return Done(node.default, node.default)


def _map(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    """Each item runs the inline node (its own call and idempotency key), at most
    `concurrency` at a time; the output is the list of results in the items' order."""
    assert node.inner is not None and node.over is not None
    if "items" not in progress:
        listed = node.over.evaluate(walk.scope())
        if not isinstance(listed, list):
            return Failed(f"over must give a list, not {compact(listed)[:200]}")
        if len(listed) > (most := settings.WORKFLOW_MAP_MAX_ITEMS):
            return Failed(
                f"expression_limit: workflow '{walk.definition.slug}', node '{node.id}', "
                f"field 'over': it gave {len(listed)} items; a map takes at most {most} "
                "(WORKFLOW_MAP_MAX_ITEMS)"
            )
        progress.update(items=listed, results={}, items_progress={})
    items: list[Any] = progress["items"]
    results: dict[str, Any] = progress["results"]
    running: dict[str, Any] = progress["items_progress"]
    for index_key in list(running):
        index = int(index_key)
        extra = {node.as_name: items[index], "index": index}
        outcome = walk.settle(node.inner, running[index_key], extra)
        if isinstance(outcome, Failed):
            return Failed(f"item {index}: {outcome.error}")
        if isinstance(outcome, Done):
            results[index_key] = outcome.output
            running.pop(index_key)
    model_items = 0
    next_index = len(results) + len(running)
    while len(running) < node.concurrency and next_index < len(items):
        index_key = str(next_index)
        extra = {node.as_name: items[next_index], "index": next_index}
        running[index_key] = {}
        outcome = walk.settle(node.inner, running[index_key], extra)
        if isinstance(outcome, Failed):
            return Failed(f"item {next_index}: {outcome.error}")
        if isinstance(outcome, Done):
            results[index_key] = outcome.output
            running.pop(index_key)
            model_items += 1
        next_index += 1
        if model_items >= node.concurrency:
            # A batch of model calls is checkpointed before the next one.
            return WAITING
    if len(results) == len(items):
        return Done([results[str(i)] for i in range(len(items))], node.next)
    return WAITING


def _parallel(walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
    """Every branch runs; `all` waits for each, `any` takes the first to finish (of
    branches whose calls ran in the same step, the quickest) and the others are
    cancelled: their calls that have not run are never sent. Under `any` a wait branch
    is a timer the others race (`_race`), not a call of its own: its timer would hold
    the run until due even when another branch had finished long before."""
    done: dict[str, Any] = progress.setdefault("done", {})
    failed: dict[str, str] = progress.setdefault("failed", {})
    branches: dict[str, Any] = progress.setdefault("branches", {})
    timers = _race_timers(walk, node, progress, extra) if node.join == "any" else {}
    finished_now: list[str] = []
    for name, branch in node.branches.items():
        if name in done or name in failed or name in timers:
            continue
        outcome = walk.settle(branch, branches.setdefault(name, {}), extra)
        if isinstance(outcome, Done):
            done[name] = outcome.output
            finished_now.append(name)
        elif isinstance(outcome, Failed):
            failed[name] = outcome.error
    if node.join == "any":
        return _race(walk, node, progress, finished_now, timers)
    if failed:
        return Failed("; ".join(f"{k}: {v}" for k, v in failed.items()))
    if len(done) == len(node.branches):
        return Done({name: done[name] for name in node.branches}, node.next)
    return WAITING


def _race_timers(
    walk: "Walk", node: Node, progress: dict[str, Any], extra: dict[str, Any]
) -> dict[str, float]:
    """`join: any`: each wait branch's seconds, evaluated once, when the race began."""
    if "timers" not in progress:
        timers: dict[str, float] = {}
        for name, branch in node.branches.items():
            if branch.kind == "wait":
                assert branch.seconds is not None
                seconds = branch.seconds.evaluate(walk.scope(extra))
                if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                    raise EvaluationError(
                        f"{name}: seconds must be a number, not {compact(seconds)}"
                    )
                timers[name] = float(seconds)
        progress["timers"] = timers
        progress["since"] = time.time()
    return dict(progress["timers"])


def _race(
    walk: "Walk",
    node: Node,
    progress: dict[str, Any],
    finished_now: list[str],
    timers: dict[str, float],
) -> Outcome:
    done, failed, branches = progress["done"], progress["failed"], progress["branches"]
    # When each contender finished, in seconds from the start: a call by its own run
    # time (a step's calls run side by side), a timer by its seconds.
    finish = {n: _elapsed(walk, branches.get(n, {})) / 1000 for n in finished_now}
    over = time.time() - float(progress["since"]) if timers else 0.0
    for name, seconds in timers.items():
        fired = _call_done(walk, branches.get(name, {}))
        if fired or seconds <= over or (finish and seconds < min(finish.values())):
            finish[name] = seconds
    if finish:
        winner = min(finish, key=lambda n: finish[n])
        unsent: set[str] = set()
        for name in node.branches:
            if name != winner:
                walk.state.status[f"{node.id}.{name}"] = "cancelled"
                unsent.update(walk.opened_ids(branches.get(name, {})))
        # Calls the losers opened in this very step are never sent.
        walk.writes.new_calls = [c for c in walk.writes.new_calls if c.call_id not in unsent]
        return Done({winner: done.get(winner)}, node.next)  # a timer's output is null
    racing = [n for n in node.branches if n not in failed and n not in timers]
    if not racing and timers:
        # Nothing else can finish first: the shortest timer, for what is left of it.
        name = min(timers, key=lambda n: timers[n])
        branch = branches.setdefault(name, {})
        if "call" not in branch:
            branch["call"] = walk.call_id(node.branches[name], {})
            left = max(1, math.ceil(timers[name] - over))
            walk.open(
                branch["call"],
                WAIT_TOOL,
                {"after_seconds": left, "note": f"wait node {node.id}.{name}"},
            )
        return WAITING
    if not racing:
        return Failed("every branch failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return WAITING


def _call_done(walk: "Walk", progress: dict[str, Any]) -> bool:
    call = walk.calls.get(progress.get("call") or "")
    return call is not None and call.status == ToolCallStatus.SUCCESS


def _elapsed(walk: "Walk", progress: dict[str, Any]) -> int:
    call = walk.calls.get(progress.get("call") or "")
    return int(call.elapsed_ms or 0) if call is not None else 0


Handler = Callable[["Walk", Node, dict[str, Any], dict[str, Any]], Outcome]
NODE_KINDS: dict[str, Handler] = {
    "condition": _condition,
    "tool": _tool,
    "human": _human,
    "wait": _wait,
    "llm": _llm,
    "choice": _choice,
    "map": _map,
    "parallel": _parallel,
    "agent": _agent,
}

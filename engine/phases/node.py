"""The node phase of a workflow run: walk the graph from the active nodes as far as it can go.

"The framework sets the flow, the model makes the choices." A run is a session whose
`processing` state runs this phase instead of the model's tool loop. One step:

- reads the calls its waiting nodes opened (their results, folded back by the tool phase);
- runs every node that needs no call (condition, choice, llm, a finished call's node) and
  moves on along the edges, as far as the graph goes without waiting;
- opens the calls the next nodes need (tool, a map's items, human, wait, a retry's pause),
  which the tool phase runs with all its guarantees (role gating, schema validation,
  approvals, idempotency keys, probes after a crash, credits, the breaker);
- except one: the call of a tool node whose tool is read-only and needs nothing committed
  before it is sent (no person, no credits, no pre-run checkpoint: `tools.runs_in_step`)
  runs in the step itself, through the tool phase's gates and executor
  (`tools.tool_run_in_step`), and its result is committed with the node's output and the
  next active nodes: one commit per such node instead of two (intent, then result). A
  step runs at most one such call: the next node that would is left active for the next
  step, so each node still gets a checkpoint of its own and a step stays short;
- ends in one move (engine/moves/node.py) that writes outputs, the next active nodes and
  a checkpoint together. No model or HTTP call happens inside a transaction.

A node reads only the state keys its expressions name and writes only its `output`.
"""

import json
import math
import random
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from engine.gates.budget import budget_hold, hold_carried, model_gate, model_rate_limit
from engine.gates.children import AGENT_TOOL_PREFIX
from engine.gates.metering import model_credits_check
from engine.model.calls import RunCancelled, call_model
from engine.model.structured import answer_check, answer_instruction, repair_messages
from engine.moves.node import NodeWrites, nodes_commit
from engine.moves.turn import call_result, turn_cancel
from engine.phases.tools import runs_in_step, tool_run_in_step
from engine.run_cache import RunContext, WorkflowRuntime, agent_runtime, workflow_runtime
from engine.store.open_calls import calls_by_id
from llm.types import ChatMessage, ChatRequest, ResponseFormat
from record.events import EventSpec, EventType, NodeFailed, NodeFinished, NodeStarted
from record.models import ModelEndpoint, Session, ToolCall, ToolCallStatus
from tools.execution import ToolSnapshot
from workflows.definition import END, Node
from workflows.expressions import EvaluationError, Expression, ExpressionLimitError, Template
from workflows.node_tools import WAIT_TOOL, review_tool_name

WALK_MAX_NODES = 500  # nodes settled in one step: a guard against a runaway cycle of instant nodes


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


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class Walk:
    """One node step's walk over the graph; `writes` is what its move commits."""

    def __init__(self, session: Session, workflow: WorkflowRuntime, run: RunContext) -> None:
        self.session = session
        self.workflow = workflow
        self.definition = definition = workflow.definition
        self.run = run
        # This step ran a read-only call itself (at most one: `_runs_in_step`).
        self.ran_in_step = False
        self._tools: dict[str, ToolSnapshot] | None = None
        raw = session.workflow_state or {}
        self.state: dict[str, Any] = json.loads(json.dumps(raw))  # a copy the step may change
        self.state.setdefault("values", {})
        self.state.setdefault("active", [definition.start])
        self.state.setdefault("visits", {definition.start: 1})
        self.state.setdefault("progress", {})
        self.state.setdefault("status", {})
        self.writes = NodeWrites(state=self.state)
        self.calls = self._read_calls()
        self.runtime = agent_runtime(session.agent_id, session)
        if "error" in self.state:
            self._restart_failed()

    def _restart_failed(self) -> None:
        """An operator resumed the failed run: the node that failed runs again, its failed
        calls re-sent with the same idempotency keys (probed first if they were sent)."""
        error = self.state.pop("error")
        node_id = error.get("node") if isinstance(error, dict) else None
        if not node_id or node_id not in self.state["active"]:
            return
        self.state["status"][node_id] = "active"
        progress = self.state["progress"].get(node_id, {})
        again = [
            self.calls[i]
            for i in self._opened_ids(progress)
            if i in self.calls and self.calls[i].status != ToolCallStatus.SUCCESS
        ]
        for call in again:
            call.status, call.output, call.error = ToolCallStatus.EXECUTING, None, ""
            self.writes.reopened.append(call)
        if not again:
            self.state["progress"][node_id] = {"started": True}

    # --- Reading what the waiting nodes opened ---------------------------------

    def _opened_ids(self, progress: Any) -> list[str]:
        """The calls a node's progress names: its own, its retry's pause, and those of its
        inline nodes (a map's running items, a parallel node's branches)."""
        found: list[str] = []
        if not isinstance(progress, dict):
            return found
        found += [progress[k] for k in ("call", "wait_call") if isinstance(progress.get(k), str)]
        for container in ("items_progress", "branches"):
            inner = progress.get(container)
            if isinstance(inner, dict):
                for value in inner.values():
                    found += self._opened_ids(value)
        return found

    def _read_calls(self) -> dict[str, ToolCall]:
        ids = [i for p in self.state["progress"].values() for i in self._opened_ids(p)]
        if not ids:
            return {}
        # The tool step's results' commit just wrote them: taken from it, not read again.
        return calls_by_id(self.session, ids)

    # --- The walk -----------------------------------------------------------------

    def scope(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**self.state["values"], **(extra or {})}

    def walk(self) -> NodeWrites:
        """Settle the active nodes in order; a node that finishes activates its successor,
        which is settled in this same step when it needs no call."""
        deadline = self.state.get("deadline_at")
        if deadline is not None and time.time() > float(deadline):
            self._fail(self.state["active"][0] if self.state["active"] else "", "deadline")
            return self.writes
        queue = list(self.state["active"])
        settled = 0
        while queue and self.writes.failed is None:
            node_id = queue.pop(0)
            node = self.definition.node(node_id)
            if self.ran_in_step and self._runs_in_step(node, self.state["progress"].get(node_id)):
                # This step ran its one call already: the next step starts this node.
                self._cached_read(node)
                continue
            progress = self.state["progress"].setdefault(node_id, {})
            if not progress.get("started"):
                progress["started"] = True
                self._event_started(node, progress)
            outcome = self.settle(node, progress, {})
            if isinstance(outcome, Waiting):
                continue
            settled += 1
            if isinstance(outcome, Failed):
                self._fail(node_id, outcome.error)
                break
            self._finish(node, outcome)
            target = outcome.next or END
            if target != END:
                if not self._activate(target):
                    break
                if target not in queue:
                    queue.append(target)
            if settled >= WALK_MAX_NODES:
                break  # the next step goes on from here: each step stays short
        if self.writes.failed is None and not self.state["active"]:
            self._complete()
        writes = self.writes
        if not (
            writes.settled
            or writes.new_calls
            or writes.ran_calls
            or writes.reopened
            or writes.model_calls
            or writes.failed
            or writes.finished
        ):
            # Nothing moved and nothing was asked for: a step again would do the same.
            stuck = self.state["active"][0] if self.state["active"] else ""
            self._fail(stuck, f"node {stuck} cannot go on (no call open and nothing to run)")
        return self.writes

    def _event_started(self, node: Node, progress: dict[str, Any]) -> None:
        started: NodeStarted = {
            "node": node.id,
            "kind": node.kind,
            "visit": int(self.state["visits"].get(node.id, 1)),
        }
        self.writes.events.append(EventSpec(EventType.NODE_STARTED, started))

    def _finish(self, node: Node, outcome: Done) -> None:
        if node.output:
            self.state["values"][node.output] = outcome.output
        self.state["active"] = [n for n in self.state["active"] if n != node.id]
        self.state["progress"].pop(node.id, None)
        self.state["status"][node.id] = "finished"
        self.state["last_output"] = outcome.output
        self.writes.settled.append(node.id)
        finished: NodeFinished = {"node": node.id, "output": outcome.output}
        finished["next"] = outcome.next or END
        self.writes.events.append(EventSpec(EventType.NODE_FINISHED, finished))

    def _activate(self, node_id: str) -> bool:
        visits = int(self.state["visits"].get(node_id, 0)) + 1
        node = self.definition.node(node_id)
        if node.max_visits is not None and visits > node.max_visits:
            self._fail(
                node_id,
                f"max_visits: node {node_id} would run a {visits}th time; its max_visits is {node.max_visits}",
            )
            return False
        self.state["visits"][node_id] = visits
        if node_id not in self.state["active"]:
            self.state["active"].append(node_id)
        self.state["status"][node_id] = "active"
        self.state["progress"].pop(node_id, None)
        return True

    def _fail(self, node_id: str, error: str) -> None:
        self.state["status"][node_id] = "failed"
        self.state["error"] = {"node": node_id, "message": error}
        self.writes.failed = (node_id, error)
        self.writes.settled.append(node_id)
        failed: NodeFailed = {"node": node_id, "error": error}
        self.writes.events.append(EventSpec(EventType.NODE_FAILED, failed))

    def _complete(self) -> None:
        result_key = self.definition.result
        if result_key:
            result = self.state["values"].get(result_key)
        else:
            result = self.state.get("last_output")
        self.state["result"] = result
        self.writes.finished = True

    # --- One node, by kind ----------------------------------------------------------

    def settle(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        """Run (or go on with) one node; `extra` is what an inline node sees besides the
        state (a map's item and index)."""
        try:
            return self._settle(node, progress, extra)
        except ExpressionLimitError as exc:
            return Failed(self._limit_message(node, exc))
        except EvaluationError as exc:
            return Failed(exc.message)

    def _limit_message(self, node: Node, exc: ExpressionLimitError) -> str:
        """`expression_limit: ...` naming the workflow, the node and the field."""
        field = next(
            (
                name
                for name, value in node.cel_fields()
                for part in (value.parts if isinstance(value, Template) else (value,))
                if isinstance(part, Expression) and part.source == exc.source
            ),
            "?",
        )
        return (
            f"expression_limit: workflow '{self.definition.slug}', node '{node.id}', "
            f"field '{field}': {exc.message}"
        )

    def _settle(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        kind = node.kind
        if kind == "condition":
            scope = self.scope(extra)
            for case in node.cases:
                if case.when.evaluate(scope) is True:
                    return Done(None, case.next)
            return Done(None, node.default)
        if kind == "tool":
            return self._tool(node, progress, extra)
        if kind == "human":
            return self._human(node, progress, extra)
        if kind == "wait":
            return self._wait(node, progress, extra)
        if kind == "llm":
            return self._llm(node, progress, extra)
        if kind == "choice":
            return self._choice(node, progress, extra)
        if kind == "map":
            return self._map(node, progress)
        if kind == "parallel":
            return self._parallel(node, progress, extra)
        if kind == "agent":
            return self._agent(node, progress, extra)
        return Failed(f"node kind '{kind}' is not supported")

    def _call_id(self, node: Node, extra: dict[str, Any], suffix: str = "") -> str:
        visit = int(self.state["visits"].get(node.id.split(".")[0], 1))
        item = f"[{extra['index']}]" if "index" in extra else ""
        return f"{node.id}#{visit}{item}{suffix}"

    def _call(self, call_id: str, tool: str, arguments: dict[str, Any]) -> ToolCall:
        return ToolCall(
            turn=self.session.turn,
            step=self.session.step + 1,
            position=len(self.writes.new_calls) + len(self.writes.ran_calls),
            call_id=call_id[:100],
            tool_name=tool[:100],
            input=arguments,
            # Stable per logical call: a re-run of this step (after a crash before its
            # commit) opens the same call with the same key.
            idempotency_key=f"{self.session.pk}:{call_id}"[:200],
        )

    def _open(self, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        self.writes.new_calls.append(self._call(call_id, tool, arguments))

    # --- A read-only call run in the step ------------------------------------------

    @property
    def tools(self) -> dict[str, ToolSnapshot]:
        """The tools the run's calls may use, as the tool phase looks them up."""
        if self._tools is None:
            self._tools = self.workflow.tools_with(self.runtime.tools_for(self.session.role))
        return self._tools

    def _runs_in_step(self, node: Node, progress: Any) -> bool:
        """A top-level tool node not started yet whose tool may run in the step (map items
        and parallel branches run their calls concurrently, the ordinary way)."""
        return (
            node.kind == "tool"
            and not (isinstance(progress, dict) and "call" in progress)
            and self.definition.nodes.get(node.id) is node
            and runs_in_step(self.tools.get(node.tool or ""))
        )

    def _cached_read(self, node: Node) -> None:
        """Have this step's commit read the cached output the next step's call would look
        up (the latest identical successful call), in the same round trip."""
        if self.writes.cached_read is not None or node.tool is None:
            return
        try:
            scope = self.scope()
            arguments = {name: expr.evaluate(scope) for name, expr in node.args.items()}
        except EvaluationError:
            return  # the next step fails the node on it
        self.writes.cached_read = (node.tool, arguments)

    def _run_in_step(self, call: ToolCall) -> bool:
        """Run the call now through the tool phase's gates and executor; False when it has
        to take the ordinary way. Its row, result, tool message and `tool.finished` ride on
        this step's commit, as a tool step's results' commit would write them."""
        outcome = tool_run_in_step(
            self.session,
            call,
            self.tools,
            workflow=self.workflow,
            step_timeout_s=self.runtime.agent.step_timeout_s,
        )
        if outcome is None:
            return False
        message, event = call_result(self.session, call, outcome, timezone.now())
        self.writes.ran_calls.append(call)
        self.writes.message_slots.append(len(self.writes.events))  # with its tool.finished
        self.writes.messages.append(message)
        self.writes.events.append(event)
        self.calls[call.call_id] = call
        self.ran_in_step = True
        return True

    def _retry_or_fail(
        self, node: Node, progress: dict[str, Any], call: ToolCall, error: str
    ) -> Outcome:
        """A failed call: transient failures are tried again after a pause (a durable timer,
        no worker held) with the same call and idempotency key; the rest fail the node."""
        attempt = int(progress.get("attempt", 1))
        if attempt >= node.retry.max_attempts or not _transient(call):
            return Failed(error)
        wait_id = progress.get("wait_call")
        if wait_id is None:
            pause = min(node.retry.max_backoff_s, node.retry.backoff_s * 2 ** (attempt - 1))
            pause = pause * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not security
            wait_id = f"{call.call_id}~retry{attempt}"
            progress["wait_call"] = wait_id
            self._open(
                wait_id,
                WAIT_TOOL,
                {"after_seconds": max(1, round(pause)), "note": f"retry of {node.id}"},
            )
            return WAITING
        if wait_id not in self.calls:
            return WAITING
        # The pause is over: the same call again, same key (probed first if it was sent).
        progress.pop("wait_call", None)
        progress["attempt"] = attempt + 1
        call.status, call.output, call.error = ToolCallStatus.EXECUTING, None, ""
        self.writes.reopened.append(call)
        return WAITING

    def _called(
        self,
        node: Node,
        progress: dict[str, Any],
        extra: dict[str, Any],
        tool: str,
        arguments: dict[str, Any] | None,
        in_step: bool = False,
    ) -> ToolCall | Outcome:
        """The node's call: opened now (WAITING), still running (WAITING), or finished
        (`in_step`: run in this step when it may be, `_run_in_step`)."""
        call_id = progress.get("call")
        if call_id is None:
            call_id = self._call_id(node, extra)
            progress["call"] = call_id
            fresh = self._call(call_id, tool, arguments or {})
            if in_step and self._run_in_step(fresh):
                return fresh
            self.writes.new_calls.append(fresh)
            return WAITING
        call = self.calls.get(call_id)
        if call is None or call.status == ToolCallStatus.EXECUTING:
            return WAITING
        return call

    def _tool(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        assert node.tool is not None
        arguments = None
        in_step = False
        if "call" not in progress:
            scope = self.scope(extra)
            arguments = {name: expr.evaluate(scope) for name, expr in node.args.items()}
            in_step = not self.ran_in_step and self._runs_in_step(node, progress)
        found = self._called(node, progress, extra, node.tool, arguments, in_step)
        if not isinstance(found, ToolCall):
            return found
        if found.status == ToolCallStatus.SUCCESS:
            return Done(found.output, node.next)
        return self._retry_or_fail(
            node, progress, found, found.error or f"{node.tool} ended {found.status}"
        )

    def _human(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        arguments = None
        if "call" not in progress:
            assert node.summary is not None
            scope = self.scope(extra)
            # What the approver's card says is decided (approvals/ shows it as it is).
            arguments = {
                "summary": node.summary.render(scope),
                "workflow": self.definition.slug,
                "node": node.id,
                "title": node.title or node.id,
                "show": {label: e.evaluate(scope) for label, e in node.show.items()},
            }
            if node.editable:
                values = self.state["values"]
                arguments["editable"] = {name: values.get(name) for name in node.editable}
        found = self._called(node, progress, extra, review_tool_name(node.id), arguments)
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
                        self.state["values"][name] = edited[name]
            return Done(output, node.next)
        if found.status == ToolCallStatus.REJECTED:
            output = {"approved": False, "reason": found.error}
            if node.rejected:
                return Done(output, node.rejected)
            return Failed(f"rejected: {found.error}")
        return Failed(found.error or f"review ended {found.status}")

    def _wait(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        arguments = None
        if "call" not in progress:
            assert node.seconds is not None
            seconds = node.seconds.evaluate(self.scope(extra))
            if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                return Failed(f"seconds must be a number, not {_compact(seconds)}")
            if seconds <= 0:
                return Done(None, node.next)
            arguments = {"after_seconds": max(1, round(seconds)), "note": f"wait node {node.id}"}
        found = self._called(node, progress, extra, WAIT_TOOL, arguments)
        if not isinstance(found, ToolCall):
            return found
        if found.status == ToolCallStatus.SUCCESS:
            return Done(None, node.next)
        return Failed(found.error or "the timer could not be set")

    def _agent(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        """The agent's loop as a child session (engine/gates/children.py); the output is its
        answer. The run holds no worker meanwhile."""
        assert node.agent is not None and node.task is not None
        arguments = None
        if "call" not in progress:
            task = node.task.evaluate(self.scope(extra))
            if not isinstance(task, str) or not task.strip():
                return Failed(f"task must give a non-empty string, not {_compact(task)[:200]}")
            arguments = {"task": task}
        found = self._called(node, progress, extra, f"{AGENT_TOOL_PREFIX}{node.agent}", arguments)
        if not isinstance(found, ToolCall):
            return found
        if found.status == ToolCallStatus.SUCCESS and isinstance(found.output, dict):
            return Done(found.output.get("answer"), node.next)
        return self._retry_or_fail(node, progress, found, found.error or "the agent's run failed")

    # --- Model nodes -------------------------------------------------------------------

    def _endpoint(self, node: Node) -> ModelEndpoint | None:
        name = node.model or self.definition.model
        if not name:
            return None
        return ModelEndpoint.objects.filter(name=name, enabled=True).first()

    def _ask(self, node: Node, messages: list[ChatMessage], answer: ResponseFormat | None) -> str:
        """One model call through the adapters (the run's agent: fallback, budgets, credits,
        the rate limit); its record rides on this step's commit. Raises ModelFailed."""
        agent = self.runtime.agent
        request = ChatRequest(
            messages=tuple(messages),
            tool_choice="none",
            response_format=answer,
            agent_config={"rules": list(agent.rules or []), "fallback_answer": ""},
        )
        override = self._endpoint(node)
        gate = model_gate(self.session, agent, request, keep=self.run.figures, chosen=override)
        if not gate.verdict.allowed:
            raise ModelFailed(f"budget_exceeded: {gate.verdict.message}")
        check = model_credits_check(
            self.session,
            gate.endpoint,
            request,
            settings.BUDGET_OUTPUT_ESTIMATE_TOKENS,
            None,
            self.run.figures.points_since,
        )
        if check is not None and check.outcome == "insufficient":
            raise ModelFailed(
                f"insufficient_credits: the model call needs {check.points} points, {check.points_left} left"
            )
        model_rate_limit(self.session, gate.endpoint, gate.request)
        gate = budget_hold(self.session, gate)
        if not gate.verdict.allowed:
            raise ModelFailed(f"budget_exceeded: {gate.verdict.message}")
        tier = override or gate.tier
        routed = call_model(self.session, agent, gate.request, tier=tier)
        self.writes.model_calls += routed.calls
        if routed.response is None:
            raise ModelFailed(str(routed.error) if routed.error else "the model call failed")
        return routed.response.text

    def _prompt_messages(self, node: Node, extra: dict[str, Any]) -> list[ChatMessage]:
        scope = self.scope(extra)
        assert node.prompt is not None
        messages = []
        if node.system is not None:
            messages.append(ChatMessage(role="system", content=node.system.render(scope)))
        messages.append(ChatMessage(role="user", content=node.prompt.render(scope)))
        return messages

    def _llm(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        messages = self._prompt_messages(node, extra)
        if node.output_schema is None:
            try:
                return Done(self._ask(node, messages, None), node.next)
            except ModelFailed as exc:
                return Failed(exc.message)
        answer = ResponseFormat(schema=node.output_schema)
        messages = [*messages, ChatMessage(role="system", content=answer_instruction(answer))]
        problem = ""
        for _attempt in range(2):  # the answer, then one repair with what was wrong
            try:
                text = self._ask(node, messages, answer)
            except ModelFailed as exc:
                return Failed(exc.message)
            checked = answer_check(text, answer)
            problem = checked.problem
            if not problem:
                return Done(checked.value, node.next)
            messages += repair_messages(text, problem)
        return Failed(
            f"invalid_json: the model's answer is not valid against output_schema: {problem}"
        )

    def _choice(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        options = list(node.options)
        listing = "\n".join(f"- {name}: {when}" for name, when in node.options.items())
        messages = [
            *self._prompt_messages(node, extra),
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
                text = self._ask(node, messages, ResponseFormat(schema=schema, name="option"))
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

    # --- Nodes of nodes ------------------------------------------------------------------

    def _map(self, node: Node, progress: dict[str, Any]) -> Outcome:
        """Each item runs the inline node (its own call and idempotency key), at most
        `concurrency` at a time; the output is the list of results in the items' order."""
        assert node.inner is not None and node.over is not None
        if "items" not in progress:
            listed = node.over.evaluate(self.scope())
            if not isinstance(listed, list):
                return Failed(f"over must give a list, not {_compact(listed)[:200]}")
            if len(listed) > (most := settings.WORKFLOW_MAP_MAX_ITEMS):
                return Failed(
                    f"expression_limit: workflow '{self.definition.slug}', node '{node.id}', "
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
            outcome = self.settle(node.inner, running[index_key], extra)
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
            outcome = self.settle(node.inner, running[index_key], extra)
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

    def _parallel(self, node: Node, progress: dict[str, Any], extra: dict[str, Any]) -> Outcome:
        """Every branch runs; `all` waits for each, `any` takes the first to finish (of
        branches whose calls ran in the same step, the quickest) and the others are
        cancelled: their calls that have not run are never sent. Under `any` a wait branch
        is a timer the others race (`_race`), not a call of its own: its timer would hold
        the run until due even when another branch had finished long before."""
        done: dict[str, Any] = progress.setdefault("done", {})
        failed: dict[str, str] = progress.setdefault("failed", {})
        branches: dict[str, Any] = progress.setdefault("branches", {})
        timers = self._race_timers(node, progress, extra) if node.join == "any" else {}
        finished_now: list[str] = []
        for name, branch in node.branches.items():
            if name in done or name in failed or name in timers:
                continue
            outcome = self.settle(branch, branches.setdefault(name, {}), extra)
            if isinstance(outcome, Done):
                done[name] = outcome.output
                finished_now.append(name)
            elif isinstance(outcome, Failed):
                failed[name] = outcome.error
        if node.join == "any":
            return self._race(node, progress, finished_now, timers)
        if failed:
            return Failed("; ".join(f"{k}: {v}" for k, v in failed.items()))
        if len(done) == len(node.branches):
            return Done({name: done[name] for name in node.branches}, node.next)
        return WAITING

    def _race_timers(
        self, node: Node, progress: dict[str, Any], extra: dict[str, Any]
    ) -> dict[str, float]:
        """`join: any`: each wait branch's seconds, evaluated once, when the race began."""
        if "timers" not in progress:
            timers: dict[str, float] = {}
            for name, branch in node.branches.items():
                if branch.kind == "wait":
                    assert branch.seconds is not None
                    seconds = branch.seconds.evaluate(self.scope(extra))
                    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                        raise EvaluationError(
                            f"{name}: seconds must be a number, not {_compact(seconds)}"
                        )
                    timers[name] = float(seconds)
            progress["timers"] = timers
            progress["since"] = time.time()
        return dict(progress["timers"])

    def _race(
        self,
        node: Node,
        progress: dict[str, Any],
        finished_now: list[str],
        timers: dict[str, float],
    ) -> Outcome:
        done, failed, branches = progress["done"], progress["failed"], progress["branches"]
        # When each contender finished, in seconds from the start: a call by its own run
        # time (a step's calls run side by side), a timer by its seconds.
        finish = {n: self._elapsed(branches.get(n, {})) / 1000 for n in finished_now}
        over = time.time() - float(progress["since"]) if timers else 0.0
        for name, seconds in timers.items():
            fired = self._call_done(branches.get(name, {}))
            if fired or seconds <= over or (finish and seconds < min(finish.values())):
                finish[name] = seconds
        if finish:
            winner = min(finish, key=lambda n: finish[n])
            unsent: set[str] = set()
            for name in node.branches:
                if name != winner:
                    self.state["status"][f"{node.id}.{name}"] = "cancelled"
                    unsent.update(self._opened_ids(branches.get(name, {})))
            # Calls the losers opened in this very step are never sent.
            self.writes.new_calls = [c for c in self.writes.new_calls if c.call_id not in unsent]
            return Done({winner: done.get(winner)}, node.next)  # a timer's output is null
        racing = [n for n in node.branches if n not in failed and n not in timers]
        if not racing and timers:
            # Nothing else can finish first: the shortest timer, for what is left of it.
            name = min(timers, key=lambda n: timers[n])
            branch = branches.setdefault(name, {})
            if "call" not in branch:
                branch["call"] = self._call_id(node.branches[name], {})
                left = max(1, math.ceil(timers[name] - over))
                self._open(
                    branch["call"],
                    WAIT_TOOL,
                    {"after_seconds": left, "note": f"wait node {node.id}.{name}"},
                )
            return WAITING
        if not racing:
            return Failed(
                "every branch failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
            )
        return WAITING

    def _call_done(self, progress: dict[str, Any]) -> bool:
        call = self.calls.get(progress.get("call") or "")
        return call is not None and call.status == ToolCallStatus.SUCCESS

    def _elapsed(self, progress: dict[str, Any]) -> int:
        call = self.calls.get(progress.get("call") or "")
        return int(call.elapsed_ms or 0) if call is not None else 0


class ModelFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _transient(call: ToolCall) -> bool:
    """Worth trying again: a timeout, an outage, the breaker; not a refusal, a business
    error or arguments the tool rejected (the same call would fail the same way)."""
    if call.status == ToolCallStatus.TIMEOUT:
        return True
    if call.status != ToolCallStatus.FAILED:
        return False
    error = call.error or ""
    if isinstance(call.output, dict) and call.output:
        return False  # the tool answered: a business error or an HTTP refusal with a body
    return not error.startswith(("invalid arguments", "arguments are not valid")) and (
        "could not be reached" in error
        or "temporarily unavailable" in error
        or " failed: " in error
    )


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


def node_step(session: Session, owner: str, run: RunContext | None = None) -> None:
    """Walk the run's graph as far as it goes without waiting, then make the one move.

    1. Read the calls the waiting nodes opened (the tool phase folded their results back).
    2. Settle the active nodes in order (`Walk.walk`); each that finishes writes its
       output and activates its successor, settled in this same step when it needs no
       call. Model nodes call the model here, outside any transaction.
    3. One move (`nodes_commit`): new calls (-> tool_wait), the run's end (-> finished),
       a node's failure (-> error), or a checkpoint of the progress.
    """
    run = run or RunContext()
    workflow = workflow_runtime(session)
    assert workflow is not None
    walk = Walk(session, workflow, run)
    try:
        writes = walk.walk()
    except RunCancelled:
        turn_cancel(session=hold_carried(Session.objects.get(pk=session.pk), session), owner=owner)
        return
    nodes_commit(session, owner, writes)

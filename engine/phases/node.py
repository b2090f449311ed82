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

import random
import time
from typing import Any

from django.utils import timezone

from engine.gates.budget import hold_carried
from engine.model.calls import RunCancelled
from engine.moves.node import NodeWrites, nodes_commit
from engine.moves.turn import call_result, turn_cancel
from engine.phases.node_kinds import NODE_KINDS, WAITING, Done, Failed, Outcome, Waiting
from engine.phases.tools import runs_in_step, tool_run_in_step
from engine.run_cache import RunContext, WorkflowRuntime, agent_runtime, workflow_runtime
from engine.store.open_calls import calls_by_id
from record.events import EventSpec, EventType, NodeFailed, NodeFinished, NodeStarted
from record.models import Session, ToolCall, ToolCallStatus
from tools.execution import ToolSnapshot
from workflows.definition import END, Node
from workflows.expressions import EvaluationError, Expression, ExpressionLimitError, Template
from workflows.node_tools import WAIT_TOOL
from workflows.state import UNSET, RunState

WALK_MAX_NODES = 500  # nodes settled in one step: a guard against a runaway cycle of instant nodes


class Walk:
    """One node step's walk over the graph; `writes` is what its move commits."""

    def __init__(self, session: Session, workflow: WorkflowRuntime, run: RunContext) -> None:
        self.session = session
        self.workflow = workflow
        self.definition = definition = workflow.definition
        self.run = run
        # This step ran a read-only call itself (at most one: `in_step_allowed`).
        self.ran_in_step = False
        self._tools: dict[str, ToolSnapshot] | None = None
        # A copy the step may change.
        self.state = RunState.from_json(session.workflow_state, definition.start)
        self.writes = NodeWrites(state=self.state)
        self.calls = self._read_calls()
        self.runtime = agent_runtime(session.agent_id, session)
        if self.state.error is not None:
            self._restart_failed()

    def _restart_failed(self) -> None:
        """An operator resumed the failed run: the node that failed runs again, its failed
        calls re-sent with the same idempotency keys (probed first if they were sent)."""
        error, self.state.error = self.state.error, None
        node_id = error.get("node") if error is not None else None
        if not node_id or node_id not in self.state.active:
            return
        self.state.status[node_id] = "active"
        progress = self.state.progress.get(node_id, {})
        again = [
            self.calls[i]
            for i in self.opened_ids(progress)
            if i in self.calls and self.calls[i].status != ToolCallStatus.SUCCESS
        ]
        for call in again:
            call.status, call.output, call.error = ToolCallStatus.EXECUTING, None, ""
            self.writes.reopened.append(call)
        if not again:
            self.state.progress[node_id] = {"started": True}

    # --- Reading what the waiting nodes opened ---------------------------------

    def opened_ids(self, progress: Any) -> list[str]:
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
                    found += self.opened_ids(value)
        return found

    def _read_calls(self) -> dict[str, ToolCall]:
        ids = [i for p in self.state.progress.values() for i in self.opened_ids(p)]
        if not ids:
            return {}
        # The tool step's results' commit just wrote them: taken from it, not read again.
        return calls_by_id(self.session, ids)

    # --- The walk -----------------------------------------------------------------

    def scope(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**self.state.values, **(extra or {})}

    def walk(self) -> NodeWrites:
        """Settle the active nodes in order; a node that finishes activates its successor,
        which is settled in this same step when it needs no call."""
        deadline = self.state.deadline_at
        if deadline is not None and time.time() > deadline:
            self._fail(self.state.active[0] if self.state.active else "", "deadline")
            return self.writes
        queue = list(self.state.active)
        settled = 0
        while queue and self.writes.failed is None:
            node_id = queue.pop(0)
            node = self.definition.node(node_id)
            if self.ran_in_step and self.in_step_allowed(node, self.state.progress.get(node_id)):
                # This step ran its one call already: the next step starts this node.
                self._cached_read(node)
                continue
            progress = self.state.progress.setdefault(node_id, {})
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
        if self.writes.failed is None and not self.state.active:
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
            stuck = self.state.active[0] if self.state.active else ""
            self._fail(stuck, f"node {stuck} cannot go on (no call open and nothing to run)")
        return self.writes

    def _event_started(self, node: Node, progress: dict[str, Any]) -> None:
        started: NodeStarted = {
            "node": node.id,
            "kind": node.kind,
            "visit": int(self.state.visits.get(node.id, 1)),
        }
        self.writes.events.append(EventSpec(EventType.NODE_STARTED, started))

    def _finish(self, node: Node, outcome: Done) -> None:
        if node.output:
            self.state.values[node.output] = outcome.output
        self.state.active = [n for n in self.state.active if n != node.id]
        self.state.progress.pop(node.id, None)
        self.state.status[node.id] = "finished"
        self.state.last_output = outcome.output
        self.writes.settled.append(node.id)
        finished: NodeFinished = {"node": node.id, "output": outcome.output}
        finished["next"] = outcome.next or END
        self.writes.events.append(EventSpec(EventType.NODE_FINISHED, finished))

    def _activate(self, node_id: str) -> bool:
        visits = int(self.state.visits.get(node_id, 0)) + 1
        node = self.definition.node(node_id)
        if node.max_visits is not None and visits > node.max_visits:
            self._fail(
                node_id,
                f"max_visits: node {node_id} would run a {visits}th time; its max_visits is {node.max_visits}",
            )
            return False
        self.state.visits[node_id] = visits
        if node_id not in self.state.active:
            self.state.active.append(node_id)
        self.state.status[node_id] = "active"
        self.state.progress.pop(node_id, None)
        return True

    def _fail(self, node_id: str, error: str) -> None:
        self.state.status[node_id] = "failed"
        self.state.error = {"node": node_id, "message": error}
        self.writes.failed = (node_id, error)
        self.writes.settled.append(node_id)
        failed: NodeFailed = {"node": node_id, "error": error}
        self.writes.events.append(EventSpec(EventType.NODE_FAILED, failed))

    def _complete(self) -> None:
        result_key = self.definition.result
        if result_key:
            result = self.state.values.get(result_key)
        else:
            result = None if self.state.last_output is UNSET else self.state.last_output
        self.state.result = result
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
        settle = NODE_KINDS.get(node.kind)
        if settle is None:
            return Failed(f"node kind '{node.kind}' is not supported")
        return settle(self, node, progress, extra)

    def call_id(self, node: Node, extra: dict[str, Any], suffix: str = "") -> str:
        visit = int(self.state.visits.get(node.id.split(".")[0], 1))
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

    def open(self, call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        self.writes.new_calls.append(self._call(call_id, tool, arguments))

    # --- A read-only call run in the step ------------------------------------------

    @property
    def tools(self) -> dict[str, ToolSnapshot]:
        """The tools the run's calls may use, as the tool phase looks them up."""
        if self._tools is None:
            self._tools = self.workflow.tools_with(self.runtime.tools_for(self.session.role))
        return self._tools

    def in_step_allowed(self, node: Node, progress: Any) -> bool:
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

    def retry_or_fail(
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
            self.open(
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

    def called(
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
            call_id = self.call_id(node, extra)
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

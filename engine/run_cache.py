"""Per-process caches that keep a step's reads to a minimum without going stale.

An agent's configuration (its model endpoints and tools) is re-validated at
every step against the rows' versions (`agent_config_stamp`, returned by the
previous step's commit or read by one small query), so an edit in the admin or
by apply_config takes effect at the next step; only a changed stamp reloads the
rows, and with them the step environment kept per role. A run's history is read
once, then only its new messages.
"""

import threading
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from engine.gates.budget import FiguresKeeper
from engine.gates.children import agent_tools
from engine.gates.guards import CallRecord
from engine.gates.memory import MemoryBlock, turn_memory_block
from engine.model.context import AGENT_TOOL_PREFIX, SUMMARY_NAME
from engine.model.environment import Environment, environment
from engine.store.commit import CallsCommitted
from record.events import CallCounts, call_counts
from record.models import Agent, Message, MessageStatus, Session, ToolCall
from record.rows import json_value, jsonb_value, row_reader
from tools.execution import ToolSnapshot, tools_for_agent
from tools.models import Tool
from workflows.definition import Definition
from workflows.node_tools import node_tools
from workflows.selectors import version_definition


@dataclass(frozen=True)
class AgentRuntime:
    agent: Agent
    tools: dict[str, ToolSnapshot]
    stamp: tuple[Any, ...]
    # Built on first use, one per role: a changed row replaces the whole runtime.
    environments: dict[str, Environment] = field(default_factory=dict, compare=False, repr=False)

    def tools_for(self, role: str) -> dict[str, ToolSnapshot]:
        return {name: tool for name, tool in self.tools.items() if tool.allows(role)}

    def environment(self, role: str) -> Environment:
        """What a step for this role runs against (its checkpoint's `env`), with its
        fingerprint: hashed once per runtime, not at every step."""
        env = self.environments.get(role)
        if env is None:
            env = environment(self.agent, self.tools_for(role), self.agent.model.name)
            self.environments[role] = env
        return env


# The versions of the rows themselves (each row's xmin), so any change is seen, even
# one made with a queryset update() that leaves `updated_at` alone: the agent row, its
# model endpoints and its tools, read by the function `agent_config_stamp` (migration
# agent_sessions 0015, which keeps its plan per connection). Given the agent's id: a
# parameter here, the session row's column in the step commit's RETURNING (which
# validates the cache for the next step without a query).
_STAMP_SQL = "SELECT agent_config_stamp(%s)"

_agents: dict[int, AgentRuntime] = {}
_lock = threading.Lock()


def agent_runtime(agent_id: int, session: Session | None = None) -> AgentRuntime:
    """The agent with its endpoints and enabled tools, fresh as of this step.

    With `session`: the stamp its last commit returned stands for this step's
    (validated as of that commit), if the session has not moved since.
    """
    known = getattr(session, "config_stamp", None) if session is not None else None
    if known is not None and known[0] == session.version:  # type: ignore[union-attr]
        stamp: tuple[Any, ...] = (known[1],)
    else:
        with connection.cursor() as cursor:
            cursor.execute(_STAMP_SQL, [agent_id])
            row = cursor.fetchone()
        stamp = tuple(row) if row else ()
    cached = _agents.get(agent_id)
    if cached is not None and cached.stamp == stamp:
        return cached
    agent = Agent.objects.select_related(
        "model", "fallback_model", "candidate_model", "cheap_model", "summary_model"
    ).get(pk=agent_id)
    # Its own tools, then the agents it may ask (agent.<slug>) or hand over to (transfer_to_<slug>).
    own = [n for n in agent.tools if not n.startswith(AGENT_TOOL_PREFIX)]
    tools = {**tools_for_agent(own), **agent_tools(list(agent.tools), list(agent.handoffs))}
    runtime = AgentRuntime(agent=agent, tools=tools, stamp=stamp)
    with _lock:
        _agents[agent_id] = runtime
    return runtime


@dataclass(frozen=True)
class WorkflowRuntime:
    """A workflow run's compiled version, with the tools its nodes add (a person's review,
    the timer) and each node call's own time limit, by the call's id."""

    definition: Definition
    tools: dict[str, ToolSnapshot]

    def tools_with(self, tools: dict[str, ToolSnapshot]) -> dict[str, ToolSnapshot]:
        return {**tools, **self.tools}

    def timeout_of(self, call_id: str) -> float | None:
        node_id = call_id.partition("#")[0]
        try:
            node = self.definition.node(node_id)
        except KeyError:
            return None
        inner = node.inner if node.kind == "map" and node.inner is not None else node
        return inner.timeout_s if inner.kind == "tool" else None


_workflows: dict[int, WorkflowRuntime] = {}


def _all_nodes(definition: Definition) -> list[Any]:
    found: list[Any] = []
    for node in definition.nodes.values():
        found += [node, *node.branches.values(), *([node.inner] if node.inner else [])]
    return found


def workflow_runtime(session: Session) -> WorkflowRuntime | None:
    """The run's workflow (None for a conversation): a version never changes, so kept."""
    version_id = session.workflow_version_id
    if version_id is None:
        return None
    found = _workflows.get(version_id)
    if found is None:
        definition = version_definition(version_id)
        named = {n.tool for n in _all_nodes(definition) if n.tool}
        # Once per version (it is kept): which of its tools have side effects, for the
        # reviews guarding them (workflows/node_tools.py: review_risk).
        side_effecting = set(
            Tool.objects.filter(name__in=named, side_effects=True).values_list("name", flat=True)
        )
        found = WorkflowRuntime(definition=definition, tools=node_tools(definition, side_effecting))
        with _lock:
            _workflows[version_id] = found
    return found


# A call's key: (step, position) orders a turn's calls; the idempotency key is unique.
CallKey = tuple[int, int, str]


def _turn_calls_rows(session: Session) -> dict[CallKey, CallRecord]:
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            "SELECT step, position, idempotency_key, tool_name, input, output, status, refusal "
            f'FROM "{ToolCall._meta.db_table}" '
            "WHERE session_id = %s AND turn = %s",  # nosec B608
            [session.pk, session.turn],
        )
        return {
            (step, position, key): CallRecord(
                name, json_value(raw_input), json_value(raw_output), status, refusal
            )
            for step, position, key, name, raw_input, raw_output, status, refusal in (
                cursor.fetchall()
            )
        }


def _by_step(calls: dict[CallKey, CallRecord]) -> list[list[CallRecord]]:
    steps: dict[int, list[CallRecord]] = {}
    for (step, _, _), record in sorted(calls.items(), key=lambda item: item[0]):
        steps.setdefault(step, []).append(record)
    return list(steps.values())


def turn_calls_read(session: Session) -> list[list[CallRecord]]:
    """The tool calls of the session's turn, one list per model step (by position), as stored."""
    return _by_step(_turn_calls_rows(session))


@dataclass
class TurnCalls:
    """The tool calls of one turn as of one session version."""

    turn: int
    version: int
    calls: dict[CallKey, CallRecord]

    def apply(self, commit: CallsCommitted) -> None:
        for step, position, key, name, arguments, output, status, refusal in commit.calls:
            # As the database gives them back, so a re-run from the rows judges alike.
            self.calls[(step, position, key)] = CallRecord(
                name, jsonb_value(arguments), jsonb_value(output), status, refusal
            )
        self.version = commit.after


@dataclass
class RunContext:
    """What one `session_run` keeps between its steps."""

    history_cache: list[Message] = field(default_factory=list)
    # The long-term memory block of the turn being run: computed at its first step.
    memory_turn: tuple[str, int] | None = None
    memory_text: str = ""
    # The owner's budget and credit figures of the turn, advanced locally (budget_gate).
    figures: FiguresKeeper = field(default_factory=FiguresKeeper)
    # The turn's tool calls for the loop guards, kept by this run's own commits.
    turn_calls_cache: TurnCalls | None = None

    def turn_calls(self, session: Session) -> list[list[CallRecord]]:
        """The turn's tool calls per model step, as `turn_calls_read` would return them.

        1. Replay this run's commits since the last read (`step_commit` logs
           each on the session object): a commit that started the turn starts
           an empty list, as does a lease that found the turn without calls
           (`lease_take`); one that follows the known version adds its calls.
        2. Any gap (a commit by someone else: an approval decided, a takeover,
           or a run that starts mid-turn) reads the database once, so a re-run
           reaches the same verdict as the run before it.
        """
        known = self.turn_calls_cache
        seed = getattr(session, "turn_calls_none", None)
        if seed is not None:
            # The lease saw the turn without calls: the run's commits since tell the rest.
            session.turn_calls_none = None  # type: ignore[attr-defined]
            if known is None:
                known = TurnCalls(turn=seed[1], version=seed[0], calls={})
        for commit in getattr(session, "committed_calls", ()):
            if commit.new_turn:
                known = TurnCalls(turn=commit.turn, version=commit.before, calls={})
            if known is not None and known.version == commit.before and known.turn == commit.turn:
                known.apply(commit)
            else:
                known = None
        session.committed_calls = []  # type: ignore[attr-defined]
        if known is None or known.version != session.version or known.turn != session.turn:
            known = TurnCalls(
                turn=session.turn, version=session.version, calls=_turn_calls_rows(session)
            )
        self.turn_calls_cache = known
        return _by_step(known.calls)

    def turn_call_counts(self, session: Session) -> CallCounts:
        """The turn's calls by how they ended (`turn.finished` `calls`), from `turn_calls`."""
        return call_counts(
            (record.status, record.refusal) for step in self.turn_calls(session) for record in step
        )

    def memory_block(self, session: Session, agent: Agent, history: list[Message]) -> MemoryBlock:
        """The turn's memory block, made at its first step; later steps get its text with
        no items `used` (the first step's phase marked them already)."""
        key = (str(session.pk), session.turn)
        if self.memory_turn != key:
            # Whether the owner has memory items, as the lease's round trip read it.
            known = getattr(session, "memory_known", None)
            has_items = known[1] if known is not None and known[0] == session.turn else None
            block = turn_memory_block(session, agent, history, has_items)
            self.memory_text = block.text
            self.memory_turn = key
            return block
        return MemoryBlock(text=self.memory_text)

    def history(self, session: Session) -> list[Message]:
        """The session's history, read incrementally: messages never change once in it.

        What a summary replaced is neither read (archived rows) nor kept (a
        summary seen in new messages drops what it covers), so a step's work
        follows the live context, not the whole conversation.
        """
        known = len(self.history_cache)
        seed = getattr(session, "history_seed", None)
        if seed is not None:
            # Read with the lease (lease_take): the run's first read, as the database had
            # it then; what came after is read or replayed below, as after any read.
            session.history_seed = None  # type: ignore[attr-defined]
            if not self.history_cache:
                self.history_cache = list(seed)
        last = (self.history_cache[-1].seq or 0) if self.history_cache else 0
        self._read(session, last)
        through = max(
            (
                m.data["through_seq"]
                for m in self.history_cache[known:]
                if m.role == "system"
                and m.name == SUMMARY_NAME
                and isinstance(m.data, dict)
                and isinstance(m.data.get("through_seq"), int)
            ),
            default=None,
        )
        if through is not None:
            self.history_cache = [
                m
                for m in self.history_cache
                if m.seq is None or m.seq > through or m.name == SUMMARY_NAME
            ]
        return list(self.history_cache)

    def _read(self, session: Session, last: int) -> None:
        # What this run's own last commit added is already in memory.
        committed = [m for m in getattr(session, "committed_messages", ()) if m.seq > last]
        session.committed_messages = []  # type: ignore[attr-defined]
        if last and [m.seq for m in committed] == list(range(last + 1, session.message_seq + 1)):
            self.history_cache.extend(committed)
        elif last != session.message_seq:
            # A plain cursor: a RawQuerySet resolves its columns against the model anew
            # at every read.
            reader = row_reader(Message)
            with connection.cursor() as cursor:
                cursor.execute(
                    # SQL names from model metadata (constants); every value is a bound parameter.
                    f'SELECT {reader.select()} FROM "{Message._meta.db_table}" WHERE session_id = %s '
                    "AND status = %s AND seq > %s AND archived_at IS NULL ORDER BY seq",  # nosec B608
                    [session.pk, MessageStatus.FINAL.value, last],
                )
                new = [reader.instance(row) for row in cursor.fetchall()]
            if new and last and new[0].seq != (last or 0) + 1:
                self.history_cache = []
                self._read(session, 0)
                return
            self.history_cache.extend(new)


def agent_tool_names(agent_id: int) -> frozenset[str]:
    """Every tool the agent offers its model, whatever the session's role: the names a
    client's own tools (the OpenAI-compatible request's `tools`) may not take."""
    return frozenset(agent_runtime(agent_id).tools)

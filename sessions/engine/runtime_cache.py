"""Per-process caches that keep a step's reads to a minimum without going stale.

An agent's configuration (its model endpoints and tools) is re-validated at
every step by one small query hashing those rows, so an edit
in the admin or by apply_config takes effect at the next step; only a changed
stamp reloads the rows. A run's history is read once, then only its new
messages.
"""

import threading
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from tools.execution import ToolSnapshot, tools_for_agent
from tools.models import Tool

from ..models import Agent, Message, MessageStatus, ModelEndpoint, Session
from .budget_gate import FiguresKeeper
from .context import SUMMARY_NAME
from .memory_glue import turn_memory_block


@dataclass(frozen=True)
class AgentRuntime:
    agent: Agent
    tools: dict[str, ToolSnapshot]
    stamp: tuple[Any, ...]

    def tools_for(self, role: str) -> dict[str, ToolSnapshot]:
        return {name: tool for name, tool in self.tools.items() if tool.allows(role)}


# Hashes of the rows themselves, so any change is seen, even one made with a
# queryset update() that leaves `updated_at` alone. `{agent}` is the agent's
# id: a parameter here, the session row's column in the step commit's
# RETURNING (which validates the cache for the next step without a query).
# SQL names from model metadata (constants); every value is a bound parameter.
_STAMP_EXPR = f"""(
SELECT concat_ws('|', md5(a::text), md5(m::text), md5(f::text), md5(c::text),
       (SELECT string_agg(md5(t::text), ',' ORDER BY t.id)
          FROM "{Tool._meta.db_table}" t WHERE t.name = ANY(a.tools)))
  FROM "{Agent._meta.db_table}" a
  JOIN "{ModelEndpoint._meta.db_table}" m ON m.id = a.model_id
  LEFT JOIN "{ModelEndpoint._meta.db_table}" f ON f.id = a.fallback_model_id
  LEFT JOIN "{ModelEndpoint._meta.db_table}" c ON c.id = a.candidate_model_id
 WHERE a.id = {{agent}})"""  # nosec B608
_STAMP_SQL = "SELECT " + _STAMP_EXPR.format(agent="%s")
STAMP_RETURNING = _STAMP_EXPR.format(agent=f'"{Session._meta.db_table}"."agent_id"')

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
    tools = tools_for_agent(list(agent.tools))
    runtime = AgentRuntime(agent=agent, tools=tools, stamp=stamp)
    with _lock:
        _agents[agent_id] = runtime
    return runtime


@dataclass
class RunContext:
    """What one `session_run` keeps between its steps."""

    history_cache: list[Message] = field(default_factory=list)
    # The long-term memory block of the turn being run: computed at its first step.
    memory_turn: tuple[str, int] | None = None
    memory_text: str = ""
    # The owner's budget and credit figures of the turn, advanced locally (budget_gate).
    figures: FiguresKeeper = field(default_factory=FiguresKeeper)

    def memory_block(self, session: Session, agent: Agent, history: list[Message]) -> str:
        key = (str(session.pk), session.turn)
        if self.memory_turn != key:
            self.memory_text = turn_memory_block(session, agent, history)
            self.memory_turn = key
        return self.memory_text

    def history(self, session: Session) -> list[Message]:
        """The session's history, read incrementally: messages never change once in it.

        What a summary replaced is neither read (archived rows) nor kept (a
        summary seen in new messages drops what it covers), so a step's work
        follows the live context, not the whole conversation.
        """
        last = (self.history_cache[-1].seq or 0) if self.history_cache else 0
        known = len(self.history_cache)
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
            new = list(
                Message.objects.raw(
                    # SQL names from model metadata (constants); every value is a bound parameter.
                    f'SELECT * FROM "{Message._meta.db_table}" WHERE session_id = %s AND status = %s AND seq > %s '
                    "AND archived_at IS NULL ORDER BY seq",  # nosec B608
                    [session.pk, MessageStatus.FINAL.value, last],
                )
            )
            if new and last and new[0].seq != (last or 0) + 1:
                self.history_cache = []
                self._read(session, 0)
                return
            self.history_cache.extend(new)

"""A workflow's nodes as typed, immutable values (DESIGN "Workflows").

Parsing and validation live in workflows/definition.py, which also exports these names: a
node here is always one that parsed, its expressions already compiled.
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workflows.expressions import Expression, Template

NODE_KINDS = ("tool", "llm", "choice", "condition", "human", "agent", "map", "parallel", "wait")
END = "end"  # reserved node id: moving there finishes the run
INPUT = "input"  # the state key holding the run's input
MAP_INDEX = "index"  # inside a map's inner node: the item's position

_V = TypeVar("_V")


class FrozenMap(Mapping[str, _V]):
    """A read-only mapping that pickles and copies (a MappingProxyType does neither): a
    parsed definition cannot be changed, and can still be cached or sent to a worker."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, _V] | Iterable[tuple[str, _V]] = ()) -> None:
        self._items: dict[str, _V] = dict(items)

    def __getitem__(self, key: str) -> _V:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, _V]]]:
        return (FrozenMap, (self._items,))


def _frozen_empty() -> Mapping[str, Any]:
    return FrozenMap()


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing tool, model or agent call is tried again, and how long to wait."""

    max_attempts: int = 1  # 1 = no retry
    backoff_s: float = 1.0  # first wait; doubles each attempt, with jitter, capped by max_backoff_s
    max_backoff_s: float = 30.0


@dataclass(frozen=True)
class Case:
    """One branch of a condition node: the first case whose `when` is true wins."""

    when: Expression
    next: str


@dataclass(frozen=True)
class Node:
    """One step of a workflow; which fields mean something depends on `kind`.

    `id` is the top-level id, "<parent>.<branch>" for a parallel branch or "<parent>.node"
    for a map's inner node. Inline nodes have no `next` and no `output`: their parent moves
    on and writes the result.
    """

    id: str
    kind: str
    next: str | None = None
    output: str | None = None
    max_visits: int | None = None
    timeout_s: float | None = None
    retry: RetryPolicy = RetryPolicy()
    # tool
    tool: str | None = None
    args: Mapping[str, Expression] = field(default_factory=_frozen_empty)
    # llm / choice
    prompt: Template | None = None
    system: Template | None = None
    output_schema: dict[str, Any] | None = None
    model: str | None = None
    options: Mapping[str, str] = field(default_factory=_frozen_empty)
    default: str | None = None  # choice and condition
    # condition
    cases: tuple[Case, ...] = ()
    # human
    summary: Template | None = None
    on_timeout: str = "reject"
    rejected: str | None = None
    group: str | None = None
    # What the approver's card says: its title, the values worth showing (label -> CEL),
    # the risk the definition declares (0-3; None: derived), and the state values the
    # approver may edit (the next node reads them).
    title: str | None = None
    show: Mapping[str, Expression] = field(default_factory=_frozen_empty)
    risk_level: int | None = None
    editable: tuple[str, ...] = ()
    # agent
    agent: str | None = None
    task: Expression | None = None
    # map
    over: Expression | None = None
    as_name: str = "item"
    inner: "Node | None" = None
    concurrency: int = 5
    # parallel
    branches: "Mapping[str, Node]" = field(default_factory=_frozen_empty)
    join: str = "all"
    # wait
    seconds: Expression | None = None

    def successors(self) -> tuple[str, ...]:
        """Every node id (or `end`) this node can move to, in declaration order, once each."""
        targets: list[str | None]
        if self.kind == "condition":
            targets = [*(case.next for case in self.cases), self.default]
        elif self.kind == "choice":
            targets = [*self.options, self.default]
        elif self.kind == "human":
            targets = [self.next, self.rejected]
        else:
            targets = [self.next]
        return tuple(dict.fromkeys(t for t in targets if t is not None))

    def cel_fields(self) -> Iterator[tuple[str, Expression | Template]]:
        """This node's own expressions and templates by field path (`args.number`,
        `cases[0].when`), inline nodes left out: what the checks name in their messages."""
        for name, expression in self.args.items():
            yield f"args.{name}", expression
        for i, case in enumerate(self.cases):
            yield f"cases[{i}].when", case.when
        for label, expression in self.show.items():
            yield f"show.{label}", expression
        for name in ("prompt", "system", "summary", "task", "over", "seconds"):
            value = getattr(self, name)
            if value is not None:
                yield name, value

    def inline_nodes(self) -> Iterator[tuple[str, "Node"]]:
        """The nodes this one runs inside itself, by field path (`node`, `branches.a`)."""
        if self.inner is not None:
            yield "node", self.inner
        for name, branch in self.branches.items():
            yield f"branches.{name}", branch

    def inner_scope(self) -> frozenset[str]:
        """The names an inline node can read beyond the state: a map's item and its index."""
        return frozenset({self.as_name, MAP_INDEX}) if self.kind == "map" else frozenset()

    def reads(self) -> frozenset[str]:
        """The top-level state keys this node's expressions and templates name, its inline
        nodes' included: what the engine hands it, and what must be written before it runs."""
        names: set[str] = set()
        for _, source in self.cel_fields():
            names |= source.names
        for _, inline in self.inline_nodes():
            names |= inline.reads() - self.inner_scope()
        return frozenset(names)

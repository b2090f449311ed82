"""What one CEL evaluation may cost, known before it runs.

cel 0.10 has no cost limit of its own, and its `execute` holds the GIL: a runaway
expression blocks the worker's lease heartbeat along with everything else in the process.
Measured here (2 cores): `all` over 1,000 items takes ~0.8 ms, `map` or `filter` over
1,000 items ~130 ms (they copy the list they build on every step), three nested `all` over
100 items ~0.9 s, three nested `map` ~27 s.

So each expression carries a cost bound, a polynomial in the longest list or map it may
range over, worked out from its comprehensions when it is compiled:

    loop cost = R * (1 + body tokens + V * names the body reads + cost of its inner loops)
                + R^2 / 2 * item size                     (map and filter only)
    R         = (1 + number of `+`) * max(longest input list or map, commas + 1)
    V         = how many values the inputs hold

(`+` may join two lists; a list written in the expression has at most commas + 1 items; cel copies a
variable's whole value each time a loop body reads it; an item is a list of R when the body
has a loop.) One unit is about one evaluator step: from ~0.02 to ~0.7 µs here. Before an expression with a comprehension runs,
its inputs are measured and the bound checked against EXPRESSION_COST_LIMIT; an
expression without one costs no more than its inputs' size and is not measured.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workflows.cel_scan import Loop, loops


@dataclass(frozen=True)
class Extent:
    """What the bound depends on in the inputs: the longest list or map, and the number of
    values in all (each is converted for cel before it runs)."""

    longest: int
    values: int


def _loop_cost(loop: Loop, length: int, values: int) -> int:
    inner = sum(_loop_cost(inner, length, values) for inner in loop.inner)
    body = 1 + loop.body_tokens + loop.body_reads * values + inner
    if not loop.accumulates:
        return length * body
    # Each step copies the list built so far, whose items may be lists themselves.
    item = 1 + (length if loop.inner else 0) + (values if loop.body_reads else 0)
    return length * body + length * length // 2 * item


@dataclass(frozen=True)
class CostBound:
    """An expression's cost as a function of its inputs' extent."""

    loops: tuple[Loop, ...]
    tokens: int
    joins: int  # `+` in the expression
    written: int  # the most items a list or map written in it may have

    @property
    def depth(self) -> int:
        """How deep its comprehensions nest (0: none)."""
        return max((loop.depth for loop in self.loops), default=0)

    def units(self, extent: Extent) -> int:
        length = (1 + self.joins) * max(extent.longest, self.written)
        loops = sum(_loop_cost(loop, length, extent.values) for loop in self.loops)
        # Converting a value for cel costs about two steps.
        return self.tokens + 2 * extent.values + loops


def cost_bound(source: str) -> CostBound:
    scan = loops(source)
    return CostBound(loops=scan.loops, tokens=scan.tokens, joins=scan.joins, written=scan.written)


def extent(values: Iterable[object]) -> Extent:
    """The longest list or map anywhere in `values`, and how many values they hold."""
    longest = count = 0
    pending = list(values)
    while pending:
        value = pending.pop()
        count += 1
        if isinstance(value, Mapping):
            longest = max(longest, len(value))
            pending.extend(value.values())
        elif isinstance(value, list | tuple):
            longest = max(longest, len(value))
            pending.extend(value)
    return Extent(longest=longest, values=count)

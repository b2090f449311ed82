"""Graph facts about a workflow's top-level nodes, on plain adjacency maps.

Every function takes `edges`: node id -> the node ids it can move to, declaration order kept,
targets outside the map (`end`, unknown ids) already left out by the caller. Results follow
declaration order so error messages come out the same every time.
"""

from collections import deque
from collections.abc import Collection, Iterable, Mapping

import igraph

Edges = Mapping[str, tuple[str, ...]]


def reachable(start: str, edges: Edges) -> set[str]:
    """The nodes some path from `start` visits, `start` included."""
    seen = {start} if start in edges else set()
    queue = deque(seen)
    while queue:
        for target in edges[queue.popleft()]:
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def reaching(exits: Iterable[str], edges: Edges) -> set[str]:
    """The nodes from which some path reaches one of `exits` (the exits included)."""
    predecessors = _predecessors(edges)
    seen = set(exits)
    queue = deque(seen)
    while queue:
        for source in predecessors[queue.popleft()]:
            if source not in seen:
                seen.add(source)
                queue.append(source)
    return seen


def _predecessors(edges: Edges) -> dict[str, list[str]]:
    predecessors: dict[str, list[str]] = {node: [] for node in edges}
    for source, targets in edges.items():
        for target in dict.fromkeys(targets):
            predecessors[target].append(source)
    return predecessors


def unguarded_cycles(edges: Edges, guarded: Collection[str]) -> list[list[str]]:
    """Cycles no `guarded` node breaks, each as a path `[a, b, ..., a]`, one per knot.

    A loop is bounded when some node on it counts its visits; taking the guarded nodes out,
    any cycle left could run forever. Each strongly connected component left reports the
    shortest cycle through its first node in declaration order.
    """
    rest = {
        n: tuple(t for t in ts if t not in guarded) for n, ts in edges.items() if n not in guarded
    }
    order = {node: i for i, node in enumerate(rest)}
    cycles = []
    for component in sorted(_components(rest), key=lambda c: min(order[n] for n in c)):
        first = min(component, key=order.__getitem__)
        inside = {n: tuple(t for t in rest[n] if t in component) for n in component}
        path = _shortest_cycle(first, inside)
        if path is not None:
            cycles.append(path)
    return cycles


def _components(edges: Edges) -> list[set[str]]:
    """Strongly connected components (igraph's, in C: a graph may be large and deep)."""
    names = list(edges)
    index = {name: i for i, name in enumerate(names)}
    links = [(index[source], index[t]) for source, targets in edges.items() for t in targets]
    found = igraph.Graph(n=len(names), edges=links, directed=True).connected_components("strong")
    return [{names[i] for i in component} for component in found]


def _shortest_cycle(first: str, edges: Edges) -> list[str] | None:
    """The shortest path from `first` back to itself (None: no cycle through it)."""
    came_from: dict[str, str] = {}
    queue = deque([first])
    while queue:
        node = queue.popleft()
        for target in edges[node]:
            if target == first:
                path = [node]
                while path[-1] != first:
                    path.append(came_from[path[-1]])
                return [*reversed(path), first]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    return None


def available_keys(
    start: str, edges: Edges, outputs: Mapping[str, str | None], initial: frozenset[str]
) -> dict[str, frozenset[str]]:
    """For each node reachable from `start`, the state keys written on every path to it.

    A forward "must" analysis: the start node has `initial`; any other node has the
    intersection, over its reachable predecessors p, of p's keys plus p's output. Starting
    from everything and shrinking to the fixpoint gives the largest sets that hold on every
    path, loops included.
    """
    nodes = reachable(start, edges)
    predecessors = {n: [p for p in ps if p in nodes] for n, ps in _predecessors(edges).items()}
    everything = initial | {o for n in nodes if (o := outputs.get(n))}
    available = {n: initial if n == start else frozenset(everything) for n in nodes}
    changed = True
    while changed:
        changed = False
        for node in edges:
            if node not in nodes or node == start:
                continue
            incoming = [_after(p, available, outputs) for p in predecessors[node]]
            keys = frozenset.intersection(*incoming) if incoming else initial
            if keys != available[node]:
                available[node] = keys
                changed = True
    return available


def _after(
    node: str, available: Mapping[str, frozenset[str]], outputs: Mapping[str, str | None]
) -> frozenset[str]:
    output = outputs.get(node)
    return available[node] | {output} if output else available[node]

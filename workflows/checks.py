"""The checks over a workflow's whole graph: what no single node can tell about itself.

They run on nodes that parsed. An edge to `end`, or to a node id already reported unknown,
counts as leaving the graph, and so does a node whose own edges are missing (also already
reported): one mistake gives one message, not a cascade of "cannot reach end".
"""

from collections.abc import Mapping

from workflows import graph
from workflows.nodes import INPUT, Node


def _edges(nodes: Mapping[str, Node]) -> graph.Edges:
    return {
        node_id: tuple(t for t in node.successors() if t in nodes)
        for node_id, node in nodes.items()
    }


def _edges_incomplete(node: Node) -> bool:
    """A node missing the edge its kind requires (a problem reported when parsing)."""
    if node.kind in ("choice", "condition"):
        return node.default is None
    return node.next is None


def _exits(nodes: Mapping[str, Node]) -> list[str]:
    return [
        node_id
        for node_id, node in nodes.items()
        if _edges_incomplete(node) or any(t not in nodes for t in node.successors())
    ]


def reachability_problems(
    where: str, start: str, nodes: Mapping[str, Node], *, edges_certain: bool
) -> list[str]:
    """Nodes no run can get to, and nodes from which no run can finish.

    "Unreachable" is judged only when every edge parsed: a mistyped edge would otherwise
    make everything behind it unreachable. "Cannot reach end" takes a broken edge as an
    exit, so it never blames a node for another's mistake.
    """
    edges = _edges(nodes)
    reached = graph.reachable(start, edges)
    finishing = graph.reaching(_exits(nodes), edges)
    certain = edges_certain and not any(_edges_incomplete(node) for node in nodes.values())
    problems = [
        f"{where}.nodes.{node_id}: unreachable from start '{start}'"
        for node_id in nodes
        if certain and node_id not in reached
    ]
    problems += [
        f"{where}.nodes.{node_id}: cannot reach end (no path from this node leads to end)"
        for node_id in nodes
        if node_id not in finishing
    ]
    return problems


def cycle_problems(where: str, nodes: Mapping[str, Node]) -> list[str]:
    """Loops that could run forever: no node on them has max_visits."""
    guarded = {node_id for node_id, node in nodes.items() if node.max_visits is not None}
    return [
        f"{where}.nodes.{cycle[0]}: cycle {' -> '.join(cycle)} without max_visits "
        "(set max_visits on one of its nodes)"
        for cycle in graph.unguarded_cycles(_edges(nodes), guarded)
    ]


def data_flow_problems(where: str, start: str, nodes: Mapping[str, Node]) -> list[str]:
    """Expressions naming a state key that some path to their node never writes.

    A node reads only what is written on every path to it: `input`, and the outputs of the
    nodes every path passes. A parallel node's output exists only after its join, so its
    branches never see it; a map's inner node also sees the item and its index.
    """
    outputs = {node_id: node.output for node_id, node in nodes.items()}
    available = graph.available_keys(start, _edges(nodes), outputs, frozenset({INPUT}))
    problems: list[str] = []
    for node_id, node in nodes.items():
        if node_id in available:
            problems += _node_reads(f"{where}.nodes.{node_id}", node, available[node_id])
    return problems


def _node_reads(path: str, node: Node, available: frozenset[str]) -> list[str]:
    problems = [
        f"{path}.{field}: names '{name}', which is not written on every path to this node "
        f"(written: {', '.join(sorted(available))})"
        for field, source in node.cel_fields()
        for name in sorted(source.names - available)
    ]
    for field, inline in node.inline_nodes():
        problems += _node_reads(f"{path}.{field}", inline, available | node.inner_scope())
    return problems

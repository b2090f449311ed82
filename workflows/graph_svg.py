"""A workflow's graph drawn as SVG on the server, for the admin, the API and the playground.

The layout is a Sugiyama pipeline whose hard parts are igraph's (C, near linear):

1. back edges (cycles) are igraph's feedback arc set; they are left out of the
   layering and drawn as dashed detours beside the graph (self-loops beside their box);
2. layers are the longest-path distance from start over the remaining DAG, so the flow
   reads top to bottom and the "end" pill is always the last row;
3. igraph orders each layer (barycenters) and places it; an edge spanning several rows
   gets a dummy vertex in every row it crosses, and each edge's label is itself a vertex
   in the row right below its source (graphviz's trick): labels then take part in
   spacing, so they never sit on a box or on another label;
4. x: igraph's positions, each row spread just enough for its boxes' widths (an exact
   isotonic solve keeps the row's order and spacing).

Drawing is split in two: `workflow_picture` (layout, edges, labels: the costly part) is
kept per version; `picture_svg` draws a run's marks onto it in milliseconds.

The output is deterministic (same mapping in, same string out): every loop runs over
lists or insertion-ordered dicts, every tie is broken by a position.
"""

from __future__ import annotations

import html
import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import igraph

__all__ = [
    "END",
    "REVISION",
    "NodeMark",
    "Picture",
    "picture_svg",
    "workflow_picture",
    "workflow_svg",
]

END = "end"  # the reserved target: the run is over

STATUSES = ("visited", "active", "failed")


@dataclass(frozen=True)
class NodeMark:
    """What a run did at a node: how often it ran and where it stands now."""

    visits: int = 0
    status: str = ""  # "" (not visited) | "visited" | "active" | "failed"
    seconds: float | None = None  # how long its last finished visit took


# Bump when the drawing changes: a kept picture of an older revision is drawn again.
REVISION = 2


@dataclass(frozen=True)
class NodeBox:
    """A node's box as laid out, with its texts: what a run's marks are drawn onto."""

    node_id: str
    kind: str
    x: float  # left
    y: float  # top
    w: float
    h: float
    sub: str
    inner: str
    tag: str
    title: str


@dataclass(frozen=True)
class Picture:
    """A version's drawing without a run, kept once drawn: the SVG of its edges, pills and
    labels, and its node boxes, which `picture_svg` colours by a run in milliseconds."""

    width: int
    height: int
    name: str
    defs: str
    edges: str
    terminals: str
    labels: str
    nodes: tuple[NodeBox, ...]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["nodes"] = [[getattr(n, f.name) for f in fields(NodeBox)] for n in self.nodes]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Picture:
        return cls(**{**data, "nodes": tuple(NodeBox(*n) for n in data["nodes"])})


# --- sizes (px) ------------------------------------------------------------------------------

MARGIN = 24
END_REACH = 12  # layers an edge may run down to the end pill; further, it gets its own
UNIT_X = 90.0  # igraph's unit gap between neighbours in a row, before the row makes room
GAP_Y = 22  # between a row and the next (node row ↔ label row)
GAP_NODES = 40  # between two boxes in a row
GAP_THIN = 14  # between anything and a dummy or a label
NODE_MIN_W = 136
NODE_MAX_CHARS_ID = 36
NODE_MAX_CHARS_SUB = 42
PAD_X = 12
ACCENT_W = 7  # also the box corner radius: the accent is the rounded left edge
ID_SIZE = 13.0
SUB_SIZE = 11.5
INNER_SIZE = 10.5
TAG_SIZE = 10.0
LABEL_SIZE = 11.0
LABEL_H = 18.0
LABEL_MAX_CHARS = 28
PILL_W = 64.0
PILL_H = 26.0
DUMMY_W = 4.0
BACK_CORNER = 10.0
LOOP_OUT = 20.0  # how far a self-loop reaches right of its box
LOOP_STEP = 12.0  # and each further self-loop of the same node

# One accent per kind: the kind reads at a glance without reading the text. None of
# them is the mark colours' green, blue or red, so a run's marks stay unambiguous.
KIND_COLOURS: dict[str, str] = {
    "tool": "#0a7ea4",
    "llm": "#8250df",
    "agent": "#bf3989",
    "choice": "#bf8700",
    "condition": "#e16f24",
    "human": "#1b7c83",
    "map": "#4d7c0f",
    "parallel": "#953800",
    "wait": "#6e7781",
}
OTHER_KIND_COLOUR = "#8c959f"

EDGE_COLOUR = "#8c959f"
TEXT_COLOUR = "#1f2328"
MUTED_COLOUR = "#57606a"

# status → (fill, stroke, stroke width)
MARK_STYLES: dict[str, tuple[str, str, float]] = {
    "": ("#ffffff", "#8c959f", 1.2),
    "visited": ("#dafbe1", "#1a7f37", 1.6),
    "active": ("#ddf4ff", "#0969da", 2.6),
    "failed": ("#ffebe9", "#cf222e", 2.6),
}

FONT_STACK = (
    'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, '
    '"Noto Sans", "Liberation Sans", "DejaVu Sans", sans-serif'
)


# --- text ------------------------------------------------------------------------------------

# XML 1.0 forbids most control characters even when escaped: a stray one in a YAML
# string would make the whole picture unparsable.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _esc(text: str) -> str:
    """Escape for element text and double-quoted attributes alike."""
    return html.escape(_XML_INVALID.sub("\ufffd", text), quote=True)


def _shorten(text: str, limit: int) -> str:
    """One line of at most `limit` characters; the full text goes in a <title>."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rstrip() + "…"


# Character widths in em. The servers cannot measure a font, so boxes are sized from an
# estimate that errs wide (DejaVu Sans, the widest common fallback): a box a little too
# wide on a Mac beats text spilling over its border on Linux.
_NARROW = set("ijl.,:;'|!`")
_SEMI = set('frt()[]{}/\\-"* ')
_WIDE = set("mwMW@%")


def _text_width(text: str, size: float, bold: bool = False) -> float:
    em = 0.0
    for ch in text:
        if ch in _NARROW:
            em += 0.32
        elif ch in _SEMI:
            em += 0.42
        elif ch in _WIDE:
            em += 0.92
        elif ch.isupper() or ch.isdigit():
            em += 0.68
        elif ch.islower():
            em += 0.6
        else:
            em += 0.72
    return em * size * (1.08 if bold else 1.0)


def _num(value: float) -> str:
    """Coordinates with one decimal, no trailing zeros: short and stable output."""
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return "0" if text == "-0" else text


def _str(value: Any) -> str:
    return "" if value is None else str(value)


# --- the graph as declared -------------------------------------------------------------------


@dataclass(frozen=True)
class _Edge:
    index: int  # declaration order; -1 for the start pill's edge
    source: str  # vertex key
    target: str  # vertex key
    label: str  # shortened, shown
    title: str  # full text, a tooltip
    source_id: str  # node id as declared ("" for the start pill)
    target_id: str  # node id, or END


def _node_key(node_id: str) -> str:
    return "n:" + node_id


START_KEY = "s"
END_KEY = "e"


def _edges_of(node_id: str, spec: Mapping[str, Any], first_index: int) -> list[_Edge]:
    """The node's outgoing edges, in a fixed order: cases, options, next, default, rejected."""
    kind = _str(spec.get("kind"))
    found: list[tuple[str, str, str]] = []  # (target, label, title)
    cases = spec.get("cases")
    if isinstance(cases, Sequence) and not isinstance(cases, str):
        for case in cases:
            if isinstance(case, Mapping) and case.get("next") is not None:
                when = _str(case.get("when"))
                found.append((_str(case["next"]), _shorten(when, LABEL_MAX_CHARS), f"when {when}"))
    options = spec.get("options")
    if isinstance(options, Mapping):
        for target, text in options.items():
            found.append((_str(target), _shorten(_str(text), LABEL_MAX_CHARS), _str(text)))
    elif isinstance(options, Sequence) and not isinstance(options, str):
        for target in options:
            found.append((_str(target), "", ""))
    if spec.get("next") is not None:
        label = "approved" if kind == "human" else ""
        found.append((_str(spec["next"]), label, label))
    if spec.get("default") is not None:
        found.append((_str(spec["default"]), "default", "default"))
    if spec.get("rejected") is not None:
        found.append((_str(spec["rejected"]), "rejected/expired", "rejected or expired"))
    return [
        _Edge(
            index=first_index + offset,
            source=_node_key(node_id),
            target=END_KEY if target == END else _node_key(target),
            label=label,
            title=title,
            source_id=node_id,
            target_id=target,
        )
        for offset, (target, label, title) in enumerate(found)
    ]


def _inner_text(spec: Any) -> str:
    """An inline node (map's `node`, a parallel branch) in a few words."""
    if not isinstance(spec, Mapping):
        return "?"
    kind = _str(spec.get("kind")) or "?"
    if kind == "tool" and spec.get("tool"):
        return f"tool {_str(spec['tool'])}"
    if kind == "agent" and spec.get("agent"):
        return f"agent {_str(spec['agent'])}"
    return kind


def _describe(kind: str, spec: Mapping[str, Any]) -> tuple[str, str]:
    """The box's second line (kind and main detail) and its optional third (inline nodes)."""
    if kind == "tool":
        sub = f"tool · {_str(spec.get('tool'))}"
    elif kind == "agent":
        sub = f"agent · {_str(spec.get('agent'))}"
    elif kind == "map":
        times = f" ×{_str(spec['concurrency'])}" if spec.get("concurrency") is not None else ""
        sub = f"map{times} over {_str(spec.get('over'))}"
    elif kind == "parallel":
        sub = f"parallel (join {_str(spec.get('join') or 'all')})"
    elif kind == "wait":
        seconds = _str(spec.get("seconds"))
        # A literal reads "wait 30s"; an expression keeps a space so it is not glued to "s".
        sub = f"wait {seconds}s" if re.fullmatch(r"\d+(\.\d+)?", seconds) else f"wait {seconds} s"
    elif kind == "condition":
        cases = spec.get("cases")
        count = len(cases) if isinstance(cases, Sequence) and not isinstance(cases, str) else 0
        sub = f"condition · {count} case{'s' if count != 1 else ''}"
    elif kind == "choice":
        options = spec.get("options")
        count = len(options) if isinstance(options, Mapping | list) else 0
        sub = f"choice · {count} option{'s' if count != 1 else ''}"
    else:
        sub = kind or "?"
    if spec.get("output"):
        sub += f" → {_str(spec['output'])}"
    inner = ""
    if kind == "map":
        inner = "↳ " + _inner_text(spec.get("node"))
    elif kind == "parallel":
        branches = spec.get("branches")
        if isinstance(branches, Mapping):
            inner = " · ".join(f"{_str(name)}: {_inner_text(b)}" for name, b in branches.items())
    return sub, inner


def _node_title(node_id: str, kind: str, spec: Mapping[str, Any]) -> str:
    lines = [f"{node_id} ({kind or '?'})"]
    for key in ("tool", "agent", "over", "concurrency", "join", "seconds", "output"):
        if spec.get(key) is not None:
            lines.append(f"{key}: {_str(spec[key])}")
    for key in ("prompt", "summary", "task"):
        if spec.get(key):
            lines.append(f"{key}: {_shorten(_str(spec[key]), 240)}")
    if kind == "map" and spec.get("node") is not None:
        lines.append(f"node: {_inner_text(spec['node'])}")
    branches = spec.get("branches")
    if kind == "parallel" and isinstance(branches, Mapping):
        for name, branch in branches.items():
            lines.append(f"branch {_str(name)}: {_inner_text(branch)}")
    if spec.get("max_visits") is not None:
        lines.append(f"max_visits: {_str(spec['max_visits'])}")
    return "\n".join(lines)


# --- layout ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Vertex:
    key: str
    role: str  # "node" | "start" | "end" | "label" | "dummy"
    row: int
    width: float
    height: float
    order_hint: float  # initial position in its row
    x: float = 0.0  # centre
    y: float = 0.0  # centre
    # node-only drawing data
    node_id: str = ""
    kind: str = ""
    sub: str = ""
    inner: str = ""
    tag: str = ""
    title: str = ""
    edge: _Edge | None = None  # for label vertices
    # Room right of the box for its self-loops and their labels: reserved in the layout so
    # a loop is drawn right beside its node, never around the neighbours in its row.
    loop_room: float = 0.0
    index: int = 0  # place in its row, once the rows are ordered

    @property
    def left(self) -> float:
        return self.x - self.width / 2

    @property
    def right(self) -> float:
        return self.x + self.width / 2

    @property
    def outer_right(self) -> float:
        return self.right + self.loop_room

    @property
    def top(self) -> float:
        return self.y - self.height / 2

    @property
    def bottom(self) -> float:
        return self.y + self.height / 2

    @property
    def solid(self) -> bool:
        """A box or a pill: something an edge must not be drawn through."""
        return self.role in ("node", "start", "end")


@dataclass
class _Chain:
    """A forward edge as laid out: its vertices from source to target, top to bottom."""

    edge: _Edge
    vertices: list[_Vertex]
    label: _Vertex | None


@dataclass
class _Back:
    """A back edge (it closes a cycle): a dashed detour up the side of the graph, or a
    self-loop beside its node."""

    edge: _Edge
    source: _Vertex
    target: _Vertex
    start: list[tuple[float, float]] = field(default_factory=list)  # up to the lane
    finish: list[tuple[float, float]] = field(default_factory=list)  # from the lane on
    lane: float = 0.0
    label_box: tuple[float, float, float, float] | None = None  # x, y, w, h


def _node_vertex(node_id: str, spec: Mapping[str, Any], row: int, hint: float) -> _Vertex:
    kind = _str(spec.get("kind"))
    sub, inner = _describe(kind, spec)
    sub = _shorten(sub, NODE_MAX_CHARS_SUB)
    inner = _shorten(inner, NODE_MAX_CHARS_SUB + 6)
    shown_id = _shorten(node_id, NODE_MAX_CHARS_ID)
    tag = f"≤{_str(spec['max_visits'])} visits" if spec.get("max_visits") is not None else ""
    first = _text_width(shown_id, ID_SIZE, bold=True)
    if tag:
        first += 12 + _text_width(tag, TAG_SIZE)
    text_w = max(first, _text_width(sub, SUB_SIZE), _text_width(inner, INNER_SIZE))
    width = max(NODE_MIN_W, ACCENT_W + 2 * PAD_X + text_w)
    height = 64.0 if inner else 50.0
    return _Vertex(
        key=_node_key(node_id),
        role="node",
        row=row,
        width=round(width),
        height=height,
        order_hint=hint,
        node_id=node_id,
        kind=kind,
        sub=sub,
        inner=inner,
        tag=tag,
        title=_node_title(node_id, kind, spec),
    )


def _isotonic(desired: list[float], weights: list[float], gaps: list[float]) -> list[float]:
    """Positions closest to `desired` (weighted least squares) that keep the row's order
    and at least `gaps[i]` between vertex i and i+1.

    Subtracting the cumulative gaps turns it into plain isotonic regression, which
    pool-adjacent-violators solves exactly in one pass.
    """
    offsets = [0.0]
    for gap in gaps:
        offsets.append(offsets[-1] + gap)
    # blocks of (weighted mean, weight, count)
    blocks: list[list[float]] = []
    for value, weight, offset in zip(desired, weights, offsets, strict=True):
        blocks.append([value - offset, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] >= blocks[-1][0]:
            mean2, weight2, count2 = blocks.pop()
            mean1, weight1, count1 = blocks[-1]
            total = weight1 + weight2
            blocks[-1] = [(mean1 * weight1 + mean2 * weight2) / total, total, count1 + count2]
    out: list[float] = []
    for mean, _weight, count in blocks:
        out.extend([mean] * int(count))
    return [value + offset for value, offset in zip(out, offsets, strict=True)]


class _Layout:
    """Positions of every box, pill, label and edge point; the drawing only reads them."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        nodes_raw = raw.get("nodes")
        nodes: dict[str, Mapping[str, Any]] = {}
        if isinstance(nodes_raw, Mapping):
            for node_id, spec in nodes_raw.items():
                nodes[_str(node_id)] = spec if isinstance(spec, Mapping) else {}
        self.edges: list[_Edge] = []
        for node_id, spec in nodes.items():
            self.edges.extend(_edges_of(node_id, spec, len(self.edges)))
        # A target nobody declared cannot come from validated config, but the admin must
        # still show *something* for a broken stored version rather than a server error.
        for edge in self.edges:
            if edge.target != END_KEY and edge.target_id not in nodes:
                nodes[edge.target_id] = {"kind": "missing"}
        self.nodes = nodes
        start = _str(raw.get("start"))
        self.start_edge: _Edge | None = None
        if start in nodes:
            self.start_edge = _Edge(-1, START_KEY, _node_key(start), "", "", "", start)

        self._keys = [START_KEY] + [_node_key(n) for n in nodes] + [END_KEY]
        all_edges = ([self.start_edge] if self.start_edge else []) + self.edges
        self.back_edges, forward = self._split_back_edges(all_edges)
        layer = self._layers(forward)
        # A cut edge the layering happens to point downwards closes no cycle there: forward.
        forward += [e for e in self.back_edges if layer[e.source] < layer[e.target]]
        self.back_edges = [e for e in self.back_edges if layer[e.source] >= layer[e.target]]
        self._build_vertices(layer, self._ends_nearby(layer, forward))
        self._place_x()
        self._place_y()
        self._route_back_edges()

    # 1. back edges -------------------------------------------------------------------------

    def _split_back_edges(self, edges: list[_Edge]) -> tuple[list[_Edge], list[_Edge]]:
        """The edges that close a cycle (a retry, a loop), by igraph's feedback arc set
        (Eades, Lin and Smyth: linear, few edges); the rest is a DAG to lay out in rows."""
        position = {key: i for i, key in enumerate(self._keys)}
        graph = igraph.Graph(
            n=len(self._keys),
            edges=[(position[e.source], position[e.target]) for e in edges],
            directed=True,
        )
        back = set(graph.feedback_arc_set(method="eades"))
        return (
            [e for i, e in enumerate(edges) if i in back],
            [e for i, e in enumerate(edges) if i not in back],
        )

    # 2. layers -----------------------------------------------------------------------------

    def _layers(self, forward: list[_Edge]) -> dict[str, int]:
        """Longest path from start: a node sits below everything that leads to it, and the
        end pill is the last row."""
        keys = [START_KEY] + [_node_key(n) for n in self.nodes]
        incoming: dict[str, int] = {k: 0 for k in keys}
        out: dict[str, list[str]] = {k: [] for k in keys}
        for edge in forward:
            if edge.target != END_KEY:
                out[edge.source].append(edge.target)
                incoming[edge.target] += 1
        layer = {k: (0 if k == START_KEY else 1) for k in keys}
        ready = deque(k for k in keys if incoming[k] == 0)
        while ready:
            vertex = ready.popleft()
            for target in out[vertex]:
                layer[target] = max(layer[target], layer[vertex] + 1)
                incoming[target] -= 1
                if incoming[target] == 0:
                    ready.append(target)
        layer[END_KEY] = max(layer.values()) + 1
        return layer

    def _ends_nearby(self, layer: dict[str, int], forward: list[_Edge]) -> list[_Edge]:
        """An edge that ends the run far above the last row gets an end pill of its own in
        the row below its source. Drawn down to the one pill, every such edge would cross
        every row below it: a ladder of 1,500 approvals that may each end the run needs
        over a million bends (minutes, gigabytes) for a picture nobody could follow."""
        kept = []
        for edge in forward:
            if edge.target == END_KEY and layer[END_KEY] - layer[edge.source] > END_REACH:
                key = f"e:{edge.index}"
                self._keys.append(key)
                layer[key] = layer[edge.source] + 1
                edge = replace(edge, target=key)
            kept.append(edge)
        return kept

    # 3. vertices, order within rows (igraph) -----------------------------------------------

    def _build_vertices(self, layer: dict[str, int], forward: list[_Edge]) -> None:
        """igraph's Sugiyama layout orders each layer (barycenters) and places it (unit gaps);
        we keep its order and its x as the wish for the row, sized in `_place_x`.

        Layer L is row 2L; the odd rows between carry labels and dummies only. Each edge's
        label is the vertex in the row right below its source (graphviz's trick): labels
        then take part in spacing, so they never sit on a box or on another label.
        """
        keys = self._keys
        position = {key: i for i, key in enumerate(keys)}
        graph = igraph.Graph(
            n=len(keys),
            edges=[(position[e.source], position[e.target]) for e in forward],
            directed=True,
        )
        # Crossing sweeps: few on a large graph, where each costs most and gains least.
        sweeps = 100 if len(forward) < 500 else 20
        placed = graph.layout_sugiyama(layers=[layer[k] for k in keys], maxiter=sweeps)
        xs = [x for x, _y in placed.coords[: len(keys)]]

        self.vertices: dict[str, _Vertex] = {
            START_KEY: _Vertex(START_KEY, "start", 0, PILL_W, PILL_H, xs[0])
        }
        for node_id, spec in self.nodes.items():
            key = _node_key(node_id)
            self.vertices[key] = _node_vertex(node_id, spec, 2 * layer[key], xs[position[key]])
        self.self_loops: dict[str, list[_Edge]] = {}
        for edge in self.back_edges:
            if edge.source == edge.target:
                self.self_loops.setdefault(edge.source, []).append(edge)
        for key, loops in self.self_loops.items():
            label_w = max(
                (_text_width(e.label, LABEL_SIZE) + 12 for e in loops if e.label), default=0
            )
            lanes = LOOP_OUT + LOOP_STEP * (len(loops) - 1)
            self.vertices[key].loop_room = lanes + (6 + label_w + 4 if label_w else 8)
        for i, key in enumerate(keys[len(self.nodes) + 1 :], start=len(self.nodes) + 1):
            self.vertices[key] = _Vertex(key, "end", 2 * layer[key], PILL_W, PILL_H, xs[i])

        self.chains: list[_Chain] = []
        for edge in forward:
            source = self.vertices[edge.source]
            target = self.vertices[edge.target]
            # The rows an edge crosses take their place on the straight line between its ends
            # (igraph's own bend points are not used: its routing is garbled on large graphs
            # in 1.0), nudged by declaration order so siblings that leave one box keep their
            # declared left-to-right order.
            slope = (target.order_hint - source.order_hint) / (target.row - source.row)
            nudge = (edge.index + 2) / 10_000
            chain = [source]
            label_vertex: _Vertex | None = None
            for row in range(source.row + 1, target.row):
                hint = source.order_hint + slope * (row - source.row)
                key = f"d:{edge.index}:{row}"
                if row == source.row + 1 and edge.label:
                    width = _text_width(edge.label, LABEL_SIZE) + 12
                    vertex = _Vertex(key, "label", row, width, LABEL_H, hint + nudge, edge=edge)
                    label_vertex = vertex
                else:
                    vertex = _Vertex(key, "dummy", row, DUMMY_W, 0.0, hint + nudge)
                self.vertices[key] = vertex
                chain.append(vertex)
            chain.append(target)
            self.chains.append(_Chain(edge, chain, label_vertex))
        self.rows: list[list[_Vertex]] = [
            [] for _ in range(max(v.row for v in self.vertices.values()) + 1)
        ]
        for vertex in self.vertices.values():
            self.rows[vertex.row].append(vertex)
        for members in self.rows:
            members.sort(key=lambda v: (v.order_hint, v.key))
            for i, vertex in enumerate(members):
                vertex.index = i

    # 4. x ----------------------------------------------------------------------------------

    @staticmethod
    def _gap(a: _Vertex, b: _Vertex) -> float:
        both_boxes = a.solid and b.solid
        return (a.width + b.width) / 2 + a.loop_room + (GAP_NODES if both_boxes else GAP_THIN)

    def _place_x(self) -> None:
        """igraph's x in units, each row then spread just enough for its widths: the closest
        positions (least squares) that keep the row's order and spacing."""
        for row in self.rows:
            if not row:  # a label row nobody crosses (a node with no edge below it)
                continue
            desired = [v.order_hint * UNIT_X for v in row]
            gaps = [self._gap(a, b) for a, b in zip(row, row[1:], strict=False)]
            for vertex, x in zip(row, _isotonic(desired, [1.0] * len(row), gaps), strict=True):
                vertex.x = x
        self._straighten()
        left = min(v.left for v in self.vertices.values())
        for vertex in self.vertices.values():
            vertex.x += MARGIN - left

    def room_for(self, vertex: _Vertex, x: float) -> bool:
        """Whether `vertex` may move to `x` and keep its spacing to its row's neighbours."""
        row, i = self.rows[vertex.row], vertex.index
        if i > 0 and x - row[i - 1].x < self._gap(row[i - 1], vertex) - 0.01:
            return False
        return not (i + 1 < len(row) and row[i + 1].x - x < self._gap(vertex, row[i + 1]) - 0.01)

    def _straighten(self) -> None:
        """Line up each run of dummies on one x where the rows allow it: rows spread apart
        one by one leave jogs of a few pixels on long edges, which read as sloppy bends."""
        for chain in self.chains:
            run: list[_Vertex] = []
            for vertex in chain.vertices[1:]:
                if vertex.role == "dummy":
                    run.append(vertex)
                    continue
                if len(run) > 1:
                    xs = sorted(v.x for v in run)
                    for x in (xs[len(xs) // 2], xs[0], xs[-1]):
                        if all(self.room_for(v, x) for v in run):
                            for v in run:
                                v.x = x
                            break
                run = []

    # 5. y ----------------------------------------------------------------------------------

    def _place_y(self) -> None:
        self.row_top: list[float] = []
        self.row_bottom: list[float] = []
        y = float(MARGIN)
        for r, row in enumerate(self.rows):
            height = max((v.height for v in row), default=0.0)
            if r % 2 == 1:
                height = LABEL_H if any(v.role == "label" for v in row) else 0.0
            self.row_top.append(y)
            self.row_bottom.append(y + height)
            for vertex in row:
                vertex.y = y + height / 2
                if vertex.role == "dummy":
                    vertex.height = height
            y += height + GAP_Y
        self.height = y - GAP_Y + MARGIN

    # 6. back edges -------------------------------------------------------------------------

    def _free(self, vertex: _Vertex, right: bool) -> bool:
        """No box or pill beside `vertex` on that side of its row: an edge can leave sideways."""
        return all(
            v is vertex or not v.solid or (v.x < vertex.x if right else v.x > vertex.x)
            for v in self.rows[vertex.row]
        )

    def _route_back_edges(self) -> None:
        """Self-loops are drawn in the room reserved right of their box. Any other back edge
        leaves its source's side and enters its target's side through a vertical lane
        beyond everything in the rows it spans: on the right, or on the left when that side
        is clear at both ends and the right is not.

        A node with a box beside it cannot go straight out sideways: its edge first drops
        into the gap below its row (or comes in from the gap above) and runs there.
        """
        self.backs: list[_Back] = []
        out_count: dict[str, int] = {}
        in_count: dict[str, int] = {}
        self._route_self_loops(out_count, in_count)
        others = [
            self._back_detour(edge, out_count, in_count)
            for edge in self.back_edges
            if edge.source != edge.target
        ]
        self.backs += [back for back, _ in others]
        self._place_lanes(others)
        self._fit_lanes()

    def _route_self_loops(self, out_count: dict[str, int], in_count: dict[str, int]) -> None:
        for key, loops in self.self_loops.items():
            vertex = self.vertices[key]
            label_x = vertex.right + LOOP_OUT + LOOP_STEP * (len(loops) - 1) + 6
            # Nested: the first loop is the innermost, the others go round it.
            for k, edge in enumerate(loops):
                back = _Back(edge, vertex, vertex)
                back.start = [(vertex.right, min(vertex.y + 9 + 9 * k, vertex.bottom - 4))]
                back.finish = [(vertex.right, max(vertex.y - 9 - 9 * k, vertex.top + 4))]
                back.lane = vertex.right + LOOP_OUT + LOOP_STEP * k
                if edge.label:
                    label_w = _text_width(edge.label, LABEL_SIZE) + 12
                    centre = vertex.y + (k - (len(loops) - 1) / 2) * (LABEL_H + 3)
                    back.label_box = (label_x, centre - LABEL_H / 2, label_w, LABEL_H)
                self.backs.append(back)
            out_count[key] = in_count[key] = len(loops)

    def _back_detour(
        self, edge: _Edge, out_count: dict[str, int], in_count: dict[str, int]
    ) -> tuple[_Back, bool]:
        """A back edge's way out of its source and into its target (its lane comes later),
        and whether it runs on the right."""
        source, target = self.vertices[edge.source], self.vertices[edge.target]
        blocked_right = (not self._free(source, True)) + (not self._free(target, True))
        blocked_left = (not self._free(source, False)) + (not self._free(target, False))
        right = blocked_right <= blocked_left
        sign = 1.0 if right else -1.0
        i_out = out_count.get(source.key, 0)
        i_in = in_count.get(target.key, 0)
        out_count[source.key] = i_out + 1
        in_count[target.key] = i_in + 1
        # Out below the middle, in above it: a node with both keeps them apart.
        y_out = min(source.y + 8 + 7 * i_out, source.bottom - 5)
        y_in = max(target.y - 8 - 7 * i_in, target.top + 5)
        out_x = source.outer_right if right else source.left
        in_x = target.right if right else target.left
        back = _Back(edge, source, target)
        back.start = [(out_x, y_out)]
        if not self._free(source, right):
            x_side = out_x + sign * (8 + 5 * i_out)
            y_gap = self.row_bottom[source.row] + 7 + 5 * i_out
            back.start += [(x_side, y_out), (x_side, y_gap)]
        back.finish = [(in_x, y_in)]
        if not self._free(target, right):
            x_side = (target.outer_right if right else in_x) + sign * (8 + 5 * i_in)
            y_gap = self.row_top[target.row] - 7 - 5 * i_in
            back.finish = [(x_side, y_gap), (x_side, y_in)] + back.finish
        return back, right

    def _place_lanes(self, others: list[tuple[_Back, bool]]) -> None:
        """Lanes: short detours hug the graph, longer ones go round them. A lane reserves its
        label's width on its outer side, over the rows it spans."""
        placed: list[tuple[float, float, float, float]] = []  # y0, y1, x_low, x_high
        row_left = [min((v.left for v in row), default=math.inf) for row in self.rows]
        row_right = [max((v.outer_right for v in row), default=-math.inf) for row in self.rows]
        for back, right in sorted(
            others, key=lambda item: (item[0].source.row - item[0].target.row, item[0].edge.index)
        ):
            ys = [p[1] for p in back.start + back.finish]
            xs = [p[0] for p in back.start + back.finish]
            y0, y1 = min(ys), max(ys)
            spanned = range(back.target.row, back.source.row + 1)
            if right:
                x = max(max(row_right[r] for r in spanned) + 18, max(xs) + 12)
            else:
                x = min(min(row_left[r] for r in spanned) - 18, min(xs) - 12)
            label_w = _text_width(back.edge.label, LABEL_SIZE) + 12 if back.edge.label else 0.0
            reserve = label_w + 8 if label_w else 0.0
            moved = True
            while moved:
                moved = False
                low, high = (x, x + reserve) if right else (x - reserve, x)
                for p_y0, p_y1, p_low, p_high in placed:
                    overlaps_y = p_y0 - 8 < y1 and y0 < p_y1 + 8
                    if overlaps_y and p_low - 10 < high and low < p_high + 10:
                        x = p_high + 12 if right else p_low - 12
                        moved = True
                        break
            placed.append((y0, y1, *((x, x + reserve) if right else (x - reserve, x))))
            back.lane = x
            if label_w:
                mid = (back.start[-1][1] + back.finish[0][1]) / 2
                label_x = x + 8 if right else x - 8 - label_w
                back.label_box = (label_x, mid - LABEL_H / 2, label_w, LABEL_H)

    def _fit_lanes(self) -> None:
        """Lanes on the left may reach past the margin: move the whole picture right; the
        width takes in the lanes on the right."""
        low = min(
            [v.left for v in self.vertices.values()]
            + [b.lane for b in self.backs]
            + [b.label_box[0] for b in self.backs if b.label_box]
        )
        shift = MARGIN - low
        if shift > 0:
            for vertex in self.vertices.values():
                vertex.x += shift
            for back in self.backs:
                back.start = [(x + shift, y) for x, y in back.start]
                back.finish = [(x + shift, y) for x, y in back.finish]
                back.lane += shift
                if back.label_box:
                    x, y, w, h = back.label_box
                    back.label_box = (x + shift, y, w, h)
        self.width = MARGIN + max(
            [v.outer_right for v in self.vertices.values()]
            + [b.lane for b in self.backs]
            + [b.label_box[0] + b.label_box[2] for b in self.backs if b.label_box]
        )


# --- drawing ---------------------------------------------------------------------------------


def _curve(points: list[tuple[float, float]]) -> str:
    """Straight where x does not change (inside rows), vertical-tangent S-curves between
    rows: the line never bends inside a row, where the boxes are, and every arrow comes in
    straight down."""
    cleaned: list[tuple[float, float]] = []
    for point in points:
        if not cleaned or abs(point[0] - cleaned[-1][0]) + abs(point[1] - cleaned[-1][1]) > 0.05:
            # A long edge runs straight down through many rows: one V for the whole run.
            if len(cleaned) > 1 and abs(point[0] - cleaned[-1][0]) < 0.5 > abs(
                cleaned[-1][0] - cleaned[-2][0]
            ):
                cleaned[-1] = point
            else:
                cleaned.append(point)
    x0, y0 = cleaned[0]
    parts = [f"M{_num(x0)} {_num(y0)}"]
    for x1, y1 in cleaned[1:]:
        if abs(x1 - x0) < 0.5:
            parts.append(f"V{_num(y1)}")
        else:
            mid = (y1 - y0) / 2
            parts.append(
                f"C{_num(x0)} {_num(y0 + mid)} {_num(x1)} {_num(y1 - mid)} {_num(x1)} {_num(y1)}"
            )
        x0, y0 = x1, y1
    return " ".join(parts)


def _rounded(points: list[tuple[float, float]], radius: float) -> str:
    """An orthogonal polyline with rounded corners (back edges)."""
    cleaned: list[tuple[float, float]] = []
    for point in points:
        if not cleaned or abs(point[0] - cleaned[-1][0]) + abs(point[1] - cleaned[-1][1]) > 0.05:
            cleaned.append(point)
    parts = [f"M{_num(cleaned[0][0])} {_num(cleaned[0][1])}"]
    for i in range(1, len(cleaned) - 1):
        (ax, ay), (bx, by), (cx, cy) = cleaned[i - 1], cleaned[i], cleaned[i + 1]
        len_in = abs(bx - ax) + abs(by - ay)
        len_out = abs(cx - bx) + abs(cy - by)
        r = min(radius, len_in / 2, len_out / 2)
        in_x, in_y = bx - r * _sign(bx - ax), by - r * _sign(by - ay)
        out_x, out_y = bx + r * _sign(cx - bx), by + r * _sign(cy - by)
        parts.append(f"L{_num(in_x)} {_num(in_y)}")
        parts.append(f"Q{_num(bx)} {_num(by)} {_num(out_x)} {_num(out_y)}")
    parts.append(f"L{_num(cleaned[-1][0])} {_num(cleaned[-1][1])}")
    return " ".join(parts)


def _sign(value: float) -> float:
    return 0.0 if abs(value) < 0.05 else (1.0 if value > 0 else -1.0)


def _ports(count: int, centre: float, width: float) -> list[float]:
    """Where `count` edges leave (or reach) a box side: spread over its middle, so parallel
    edges (two cases to the same node) stay two lines."""
    if count <= 1:
        return [centre]
    span = min(width * 0.6, (count - 1) * 22.0)
    return [centre - span / 2 + span * i / (count - 1) for i in range(count)]


def _style() -> str:
    return (
        "<style>"
        f".wf-graph text{{font-family:{FONT_STACK};fill:{TEXT_COLOUR}}}"
        f".wf-graph .wf-id{{font-size:{_num(ID_SIZE)}px;font-weight:600}}"
        f".wf-graph .wf-sub{{font-size:{_num(SUB_SIZE)}px;fill:{MUTED_COLOUR}}}"
        f".wf-graph .wf-inner{{font-size:{_num(INNER_SIZE)}px;fill:{MUTED_COLOUR};"
        "font-style:italic}"
        f".wf-graph .wf-tag{{font-size:{_num(TAG_SIZE)}px;fill:{MUTED_COLOUR}}}"
        f".wf-graph .wf-edge-label text{{font-size:{_num(LABEL_SIZE)}px;fill:#424a53}}"
        ".wf-graph .wf-terminal text{font-size:12px;font-weight:600;fill:#ffffff}"
        ".wf-graph .wf-badge text{font-size:10px;font-weight:700;fill:#ffffff}"
        ".wf-graph a .wf-node{cursor:pointer}"
        ".wf-graph a:hover .wf-outline{stroke-width:2.6px}"
        "</style>"
    )


class _Svg:
    """The static parts of the picture, drawn once per version: edges, pills, labels."""

    def __init__(self, layout: _Layout, raw: Mapping[str, Any]) -> None:
        self.layout = layout
        self.raw = raw
        # Marker ids are document-wide once the SVG is inline in a page: two graphs on one
        # page must not share (or shadow) each other's.
        slug = re.sub(r"[^A-Za-z0-9_-]", "_", _str(raw.get("slug")))[:40] or "workflow"
        self.arrow_id = f"wf-arrow-{slug}"
        self.parts: list[str] = []

    def _take(self) -> str:
        text, self.parts = "".join(self.parts), []
        return text

    def picture(self) -> Picture:
        layout = self.layout
        defs = (
            f'<defs><marker id="{self.arrow_id}" viewBox="0 0 10 10" refX="10" refY="5" '
            'markerWidth="9" markerHeight="9" markerUnits="userSpaceOnUse" '
            f'orient="auto"><path d="M0 0L10 5L0 10z" fill="{MUTED_COLOUR}"/></marker></defs>'
        )
        self.parts.append('<g class="wf-edges">')
        self._forward_edges()
        self._back_edges()
        self.parts.append("</g>")
        edges = self._take()
        boxes: list[NodeBox] = []
        for v in layout.vertices.values():
            if v.role in ("start", "end"):
                self._terminal(v)
            elif v.role == "node":
                boxes.append(
                    NodeBox(
                        v.node_id,
                        v.kind,
                        v.left,
                        v.top,
                        v.width,
                        v.height,
                        v.sub,
                        v.inner,
                        v.tag,
                        v.title,
                    )
                )
        terminals = self._take()
        self.parts.append('<g class="wf-labels">')
        self._labels()
        self.parts.append("</g>")
        return Picture(
            width=round(layout.width),
            height=round(layout.height),
            name=_str(self.raw.get("name")) or _str(self.raw.get("slug")) or "workflow",
            defs=defs,
            edges=edges,
            terminals=terminals,
            labels=self._take(),
            nodes=tuple(boxes),
        )

    def _edge_attrs(self, edge: _Edge) -> str:
        if edge.index < 0:
            return 'class="wf-start-edge"'
        return (
            f'class="wf-edge{{back}}" data-from="{_esc(edge.source_id)}" '
            f'data-to="{_esc(edge.target_id)}"'
        )

    def _edge_title(self, edge: _Edge) -> str:
        text = f"{edge.source_id} → {edge.target_id}"
        if edge.title:
            text += f": {edge.title}"
        return f"<title>{_esc(text)}</title>"

    def _forward_edges(self) -> None:
        layout = self.layout
        # Ports: the chains leaving a box are spread along its bottom in the order of where
        # they go next, those reaching it along its top in the order of where they come from;
        # so neighbouring edges never cross at the box.
        leaving: dict[str, list[_Chain]] = {}
        reaching: dict[str, list[_Chain]] = {}
        for chain in layout.chains:
            leaving.setdefault(chain.vertices[0].key, []).append(chain)
            reaching.setdefault(chain.vertices[-1].key, []).append(chain)
        out_port: dict[int, float] = {}
        in_port: dict[int, float] = {}
        for key, chains in leaving.items():
            vertex = layout.vertices[key]
            chains = sorted(chains, key=lambda c: (c.vertices[1].x, c.edge.index))
            for chain, x in zip(chains, _ports(len(chains), vertex.x, vertex.width), strict=True):
                out_port[id(chain)] = x
        for key, chains in reaching.items():
            vertex = layout.vertices[key]
            chains = sorted(chains, key=lambda c: (c.vertices[-2].x, c.edge.index))
            for chain, x in zip(chains, _ports(len(chains), vertex.x, vertex.width), strict=True):
                in_port[id(chain)] = x
        for chain in layout.chains:
            source, target = chain.vertices[0], chain.vertices[-1]
            # One edge from a box to the next one below it, nothing else at either end: a
            # straight line where the boxes overlap reads better than a small S-bend.
            if (
                len(chain.vertices) == 3
                and chain.label is None
                and len(leaving[source.key]) == 1
                and len(reaching[target.key]) == 1
            ):
                inset = min(source.width, target.width) * 0.2
                low = max(source.left, target.left) + inset
                high = min(source.right, target.right) - inset
                x = min(max((source.x + target.x) / 2, low), high)
                if low <= high and layout.room_for(chain.vertices[1], x):
                    out_port[id(chain)] = in_port[id(chain)] = chain.vertices[1].x = x
            points = [(out_port[id(chain)], source.bottom)]
            points.append((out_port[id(chain)], layout.row_bottom[source.row]))
            for vertex in chain.vertices[1:-1]:
                points.append((vertex.x, layout.row_top[vertex.row]))
                points.append((vertex.x, layout.row_bottom[vertex.row]))
            points.append((in_port[id(chain)], layout.row_top[target.row]))
            points.append((in_port[id(chain)], target.top))
            attrs = self._edge_attrs(chain.edge).replace("{back}", "")
            self.parts.append(
                f"<g {attrs}>{self._edge_title(chain.edge) if chain.edge.index >= 0 else ''}"
                f'<path d="{_curve(points)}" fill="none" stroke="{EDGE_COLOUR}" '
                f'stroke-width="1.4" marker-end="url(#{self.arrow_id})"/></g>'
            )

    def _back_edges(self) -> None:
        for back in self.layout.backs:
            points = (
                back.start
                + [(back.lane, back.start[-1][1]), (back.lane, back.finish[0][1])]
                + back.finish
            )
            attrs = self._edge_attrs(back.edge).replace("{back}", " wf-back")
            self.parts.append(
                f"<g {attrs}>{self._edge_title(back.edge)}"
                f'<path d="{_rounded(points, BACK_CORNER)}" fill="none" stroke="{EDGE_COLOUR}" '
                f'stroke-width="1.4" stroke-dasharray="5 4" '
                f'marker-end="url(#{self.arrow_id})"/></g>'
            )

    def _labels(self) -> None:
        boxes: list[tuple[_Edge, float, float, float, float]] = []
        for chain in self.layout.chains:
            if chain.label is not None:
                v = chain.label
                boxes.append((chain.edge, v.left, v.top, v.width, v.height))
        for back in self.layout.backs:
            if back.label_box is not None:
                x, y, w, h = back.label_box
                boxes.append((back.edge, x, y, w, h))
        for edge, x, y, w, h in boxes:
            self.parts.append(
                f'<g class="wf-edge-label" data-from="{_esc(edge.source_id)}" '
                f'data-to="{_esc(edge.target_id)}">{self._edge_title(edge)}'
                f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" '
                'rx="4" fill="#ffffff" stroke="#d0d7de" stroke-width="0.8"/>'
                f'<text x="{_num(x + w / 2)}" y="{_num(y + h / 2 + LABEL_SIZE * 0.35)}" '
                f'text-anchor="middle">{_esc(edge.label)}</text></g>'
            )

    def _terminal(self, vertex: _Vertex) -> None:
        name = "start" if vertex.role == "start" else "end"
        self.parts.append(
            f'<g class="wf-terminal wf-{name}"><title>{name}</title>'
            f'<rect x="{_num(vertex.left)}" y="{_num(vertex.top)}" width="{_num(vertex.width)}" '
            f'height="{_num(vertex.height)}" rx="{_num(vertex.height / 2)}" '
            f'fill="{MUTED_COLOUR}"/>'
            f'<text x="{_num(vertex.x)}" y="{_num(vertex.y + 4.5)}" '
            f'text-anchor="middle">{name}</text></g>'
        )


def _node(
    out: list[str],
    box: NodeBox,
    marks: Mapping[str, NodeMark] | None,
    link: Callable[[str], str] | None,
) -> None:
    """One node's box, coloured by what the run did there (cheap: drawn on every request)."""
    mark = marks.get(box.node_id) if marks is not None else None
    status = mark.status if mark is not None else ""
    fill, stroke, stroke_width = MARK_STYLES.get(status, MARK_STYLES[""])
    kind_class = re.sub(r"[^a-z0-9_-]", "", box.kind.lower()) or "unknown"
    classes = f"wf-node wf-{kind_class}"
    if status:
        classes += " wf-" + (re.sub(r"[^a-z0-9_-]", "", status.lower()) or "unknown")
    # On a run's page the nodes the run never reached step back.
    dim = ' opacity="0.55"' if marks is not None and status not in STATUSES else ""
    x, y, w, h = box.x, box.y, box.w, box.h
    r = ACCENT_W
    accent = KIND_COLOURS.get(box.kind, OTHER_KIND_COLOUR)
    text_x = x + ACCENT_W + PAD_X
    if link is not None:
        out.append(f'<a href="{_esc(link(box.node_id))}">')
    out.append(f'<g class="{classes}" data-node="{_esc(box.node_id)}"{dim}>')
    title = box.title
    if mark is not None and (mark.status or mark.visits):
        title += f"\nrun: {mark.status or 'not visited'}, {mark.visits} visit(s)"
        if mark.seconds is not None:
            title += f", the last took {mark.seconds:.3g} s"
    out.append(f"<title>{_esc(title)}</title>")
    out.append(
        f'<rect class="wf-box" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
        f'height="{_num(h)}" rx="{r}" fill="{fill}"/>'
    )
    out.append(
        f'<path class="wf-accent" d="M{_num(x + r)} {_num(y)}V{_num(y + h)}'
        f"A{r} {r} 0 0 1 {_num(x)} {_num(y + h - r)}V{_num(y + r)}"
        f'A{r} {r} 0 0 1 {_num(x + r)} {_num(y)}Z" fill="{accent}"/>'
    )
    out.append(
        f'<rect class="wf-outline" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
        f'height="{_num(h)}" rx="{r}" fill="none" stroke="{stroke}" '
        f'stroke-width="{_num(stroke_width)}"/>'
    )
    out.append(
        f'<text class="wf-id" x="{_num(text_x)}" y="{_num(y + 20)}">'
        f"{_esc(_shorten(box.node_id, NODE_MAX_CHARS_ID))}</text>"
    )
    if box.tag:
        out.append(
            f'<text class="wf-tag" x="{_num(x + w - 10)}" y="{_num(y + 19)}" '
            f'text-anchor="end">{_esc(box.tag)}</text>'
        )
    out.append(f'<text class="wf-sub" x="{_num(text_x)}" y="{_num(y + 38)}">{_esc(box.sub)}</text>')
    if box.inner:
        out.append(
            f'<text class="wf-inner" x="{_num(text_x)}" y="{_num(y + 54)}">{_esc(box.inner)}</text>'
        )
    if mark is not None and mark.visits > 1:
        text = f"×{mark.visits}"
        badge_w = _text_width(text, 10, bold=True) + 10
        colour = stroke if status in STATUSES else MUTED_COLOUR
        bx, by = x + w - badge_w / 2 - 2, y
        out.append(
            f'<g class="wf-badge"><rect x="{_num(bx - badge_w / 2)}" y="{_num(by - 8)}" '
            f'width="{_num(badge_w)}" height="16" rx="8" fill="{colour}"/>'
            f'<text x="{_num(bx)}" y="{_num(by + 3.5)}" text-anchor="middle">'
            f"{_esc(text)}</text></g>"
        )
    out.append("</g>")
    if link is not None:
        out.append("</a>")


def workflow_picture(raw: Mapping[str, Any]) -> Picture:
    """Lay out and draw a workflow mapping as declared in YAML (already validated): the
    costly part, done once per version."""
    return _Svg(_Layout(raw), raw).picture()


def picture_svg(
    picture: Picture,
    *,
    marks: Mapping[str, NodeMark] | None = None,
    link: Callable[[str], str] | None = None,
) -> str:
    """The picture as an inline SVG document (no XML declaration). `marks` colour the nodes
    a run visited (a run's page); `link(node_id)` makes each node a link."""
    classes = "wf-graph wf-run" if marks is not None else "wf-graph"
    width, height = picture.width, picture.height
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{classes}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{_esc("Workflow " + picture.name)}">',
        f"<title>{_esc(picture.name)}</title>",
        _style(),
        picture.defs,
        # Edges first, boxes over them, labels last: a label's white background sits on
        # top of whatever line runs under it.
        picture.edges,
        '<g class="wf-nodes">',
        picture.terminals,
    ]
    for box in picture.nodes:
        _node(out, box, marks, link)
    out += ["</g>", picture.labels, "</svg>"]
    return "".join(out)


def workflow_svg(
    raw: Mapping[str, Any],
    *,
    marks: Mapping[str, NodeMark] | None = None,
    link: Callable[[str], str] | None = None,
) -> str:
    """A workflow mapping drawn at once, without keeping its picture."""
    return picture_svg(workflow_picture(raw), marks=marks, link=link)

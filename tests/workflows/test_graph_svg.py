"""The workflow graph picture (workflows/graph_svg.py): pure functions, no database."""

import random
import re
import xml.etree.ElementTree as ET
from itertools import combinations
from typing import Any

import pytest

from workflows.graph_svg import NodeMark, workflow_svg

SVG = "{http://www.w3.org/2000/svg}"

# DESIGN.md "### Workflows", as the YAML loads.
REFUND: dict[str, Any] = {
    "slug": "refund",
    "name": "Refund with review",
    "role": "support",
    "start": "lookup",
    "result": "answer",
    "nodes": {
        "lookup": {
            "kind": "tool",
            "tool": "get_order",
            "args": {"number": "input.order_number"},
            "output": "order",
            "next": "check",
        },
        "check": {
            "kind": "condition",
            "cases": [{"when": "double(order.total) > 50.0", "next": "review"}],
            "default": "refund",
        },
        "review": {
            "kind": "human",
            "summary": "Refund {{ order.total }} on {{ input.order_number }}",
            "timeout_s": 600,
            "on_timeout": "reject",
            "next": "refund",
            "rejected": "tell_no",
        },
        "refund": {
            "kind": "tool",
            "tool": "issue_coupon",
            "args": {"customer_id": "order.customer_id", "amount": "double(order.total)"},
            "output": "coupon",
            "next": "tell",
        },
        "tell": {
            "kind": "llm",
            "prompt": "Tell the customer that coupon {{ coupon.code }} was issued.",
            "output": "answer",
            "next": "end",
        },
        "tell_no": {"kind": "llm", "prompt": "Declined.", "output": "answer", "next": "end"},
    },
}
REFUND_EDGES = 8  # lookup 1, check 2, review 2, refund 1, tell 1, tell_no 1

# Ten nodes with a cycle, a self-loop, a map, a parallel, a choice and a wait.
RESEARCH: dict[str, Any] = {
    "slug": "research",
    "name": "Research with retries",
    "start": "fetch",
    "result": "report",
    "nodes": {
        "fetch": {"kind": "tool", "tool": "search_web", "output": "hits", "next": "plan"},
        "plan": {
            "kind": "choice",
            "prompt": "What next?",
            "options": {
                "enrich": "the hits need more detail per item",
                "draft": "enough to write",
                "ask": "the question is ambiguous",
            },
            "default": "draft",
            "max_visits": 3,
        },
        "ask": {"kind": "human", "summary": "Clarify", "next": "plan", "rejected": "end"},
        "enrich": {
            "kind": "map",
            "over": "hits.items",
            "as": "item",
            "node": {"kind": "tool", "tool": "fetch_page"},
            "concurrency": 4,
            "output": "pages",
            "next": "both",
        },
        "both": {
            "kind": "parallel",
            "join": "any",
            "branches": {
                "summary": {"kind": "llm", "prompt": "x"},
                "facts": {"kind": "agent", "agent": "fact_checker", "task": "x"},
            },
            "output": "views",
            "next": "route",
        },
        "route": {
            "kind": "condition",
            "cases": [
                {"when": "size(views.facts.errors) > 0 && retries < 3", "next": "pause"},
                {"when": 'views.summary == ""', "next": "route"},
            ],
            "default": "draft",
            "max_visits": 5,
        },
        "pause": {"kind": "wait", "seconds": 30, "next": "fetch", "max_visits": 3},
        "draft": {"kind": "llm", "prompt": "Write", "output": "draft", "next": "review"},
        "review": {"kind": "agent", "agent": "editor", "task": "draft", "next": "publish"},
        "publish": {"kind": "tool", "tool": "post_report", "next": "end"},
    },
}
# plan 4 (3 options + default), ask 2, route 3, the other seven 1 each
RESEARCH_EDGES = 16


# A self-loop on a node with neighbours to its right, and a back edge from it.
CROWDED: dict[str, Any] = {
    "slug": "crowded",
    "start": "pick",
    "nodes": {
        "pick": {"kind": "choice", "options": {"left": "go left", "right": "go right", "mid": "m"}},
        "left": {
            "kind": "condition",
            "cases": [
                {"when": "retry < 2", "next": "left"},
                {"when": 'a < 5 && b > "x"', "next": "pick"},
            ],
            "default": "end",
            "max_visits": 3,
        },
        "mid": {"kind": "tool", "tool": "x", "next": "end"},
        "right": {"kind": "agent", "agent": "helper", "next": "end"},
    },
}


def chain(length: int) -> dict[str, Any]:
    ids = [f"step_{i}" for i in range(length)]
    return {
        "slug": "chain",
        "name": "Chain",
        "start": ids[0],
        "nodes": {
            node: {"kind": "tool", "tool": f"t{i}", "next": ids[i + 1] if i + 1 < length else "end"}
            for i, node in enumerate(ids)
        },
    }


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if cls in classes(g)]


def nodes_by_id(root: ET.Element) -> dict[str, ET.Element]:
    found: dict[str, ET.Element] = {}
    for g in groups(root, "wf-node"):
        node_id = g.get("data-node")
        assert node_id is not None and node_id not in found, node_id
        found[node_id] = g
    return found


def terminal(g: ET.Element) -> str:
    """ "wf-start" or "wf-end" for a pill."""
    (name,) = classes(g) - {"wf-terminal"}
    return name


Box = tuple[float, float, float, float]


def rect_of(element: ET.Element) -> Box:
    rect = element.find(f"{SVG}rect")
    assert rect is not None
    return (
        float(rect.get("x", "0")),
        float(rect.get("y", "0")),
        float(rect.get("width", "0")),
        float(rect.get("height", "0")),
    )


def all_boxes(root: ET.Element) -> list[tuple[str, Box]]:
    """Every box that carries text: nodes, start/end pills, edge labels."""
    boxes = [(f"node {g.get('data-node')}", rect_of(g)) for g in groups(root, "wf-node")]
    boxes += [(f"pill {terminal(g)}", rect_of(g)) for g in groups(root, "wf-terminal")]
    boxes += [
        (f"label {g.get('data-from')}->{g.get('data-to')}", rect_of(g))
        for g in groups(root, "wf-edge-label")
    ]
    return boxes


def overlapping(boxes: list[tuple[str, Box]]) -> list[tuple[str, str]]:
    clashes = []
    for (name_a, (ax, ay, aw, ah)), (name_b, (bx, by, bw, bh)) in combinations(boxes, 2):
        if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
            clashes.append((name_a, name_b))
    return clashes


def path_end(edge: ET.Element) -> tuple[float, float]:
    """Where an edge's path ends (its arrow tip), reading the M/L/V/C/Q commands we emit."""
    path = edge.find(f"{SVG}path")
    assert path is not None
    tokens = re.findall(r"[MLVCQ]|-?\d+(?:\.\d+)?", path.get("d", ""))
    arity = {"M": 2, "L": 2, "V": 1, "C": 6, "Q": 4}
    x = y = 0.0
    i = 0
    while i < len(tokens):
        command = tokens[i]
        args = [float(t) for t in tokens[i + 1 : i + 1 + arity[command]]]
        if command == "V":
            y = args[0]
        else:
            x, y = args[-2], args[-1]
        i += 1 + arity[command]
    return x, y


def test_output_is_well_formed_svg_sized_from_the_layout() -> None:
    root = parse(workflow_svg(REFUND))

    assert root.tag == f"{SVG}svg"
    _x, _y, width, height = (float(v) for v in root.get("viewBox", "").split())
    assert float(root.get("width", "0")) == width
    assert float(root.get("height", "0")) == height
    assert 200 < width < 1400
    assert root.find(f"{SVG}style") is not None
    assert "sans-serif" in (root.find(f"{SVG}style").text or "")  # type: ignore[union-attr]


@pytest.mark.parametrize(("raw", "edges"), [(REFUND, REFUND_EDGES), (RESEARCH, RESEARCH_EDGES)])
def test_every_node_once_with_its_kind_and_every_edge_drawn(
    raw: dict[str, Any], edges: int
) -> None:
    root = parse(workflow_svg(raw))

    found = nodes_by_id(root)
    assert list(found) == list(raw["nodes"])
    for node_id, g in found.items():
        assert classes(g) == {"wf-node", f"wf-{raw['nodes'][node_id]['kind']}"}
        assert g.find(f"{SVG}title") is not None
    assert len(groups(root, "wf-edge")) == edges
    assert len(groups(root, "wf-start-edge")) == 1
    assert {terminal(g) for g in groups(root, "wf-terminal")} == {"wf-start", "wf-end"}


def test_edge_labels_name_the_branch() -> None:
    root = parse(workflow_svg(REFUND))

    labels = {
        (g.get("data-from"), g.get("data-to")): "".join(g.find(f"{SVG}text").itertext())  # type: ignore[union-attr]
        for g in groups(root, "wf-edge-label")
    }
    assert labels == {
        ("check", "review"): "double(order.total) > 50.0",
        ("check", "refund"): "default",
        ("review", "refund"): "approved",
        ("review", "tell_no"): "rejected/expired",
    }


def test_long_labels_are_shortened_with_the_full_text_in_a_title() -> None:
    root = parse(workflow_svg(RESEARCH))

    label = next(
        g
        for g in groups(root, "wf-edge-label")
        if (g.get("data-from"), g.get("data-to")) == ("route", "pause")
    )
    text = "".join(label.find(f"{SVG}text").itertext())  # type: ignore[union-attr]
    assert text.endswith("…") and len(text) <= 28
    assert "size(views.facts.errors) > 0 && retries < 3" in (label.findtext(f"{SVG}title") or "")


def test_node_text_shows_kind_detail_inline_nodes_and_max_visits() -> None:
    root = parse(workflow_svg(RESEARCH))
    found = nodes_by_id(root)

    def text(node_id: str) -> str:
        return " | ".join("".join(t.itertext()) for t in found[node_id].iter(f"{SVG}text"))

    assert "tool · search_web" in text("fetch")
    assert "agent · editor" in text("review")
    assert "map ×4 over hits.items" in text("enrich")
    assert "↳ tool fetch_page" in text("enrich")
    assert "parallel (join any)" in text("both")
    assert "summary: llm" in text("both") and "facts: agent fact_checker" in text("both")
    assert "wait 30s" in text("pause")
    assert "≤5 visits" in text("route")
    assert "visits" not in text("draft")
    assert "human" in text("ask")


def test_marks_colour_nodes_and_count_visits() -> None:
    marks = {
        "lookup": NodeMark(visits=1, status="visited"),
        "check": NodeMark(visits=3, status="visited"),
        "review": NodeMark(visits=1, status="active"),
        "refund": NodeMark(visits=1, status="failed"),
    }
    root = parse(workflow_svg(REFUND, marks=marks))
    found = nodes_by_id(root)

    assert "wf-run" in classes(root)
    assert "wf-visited" in classes(found["lookup"])
    assert "wf-active" in classes(found["review"])
    assert "wf-failed" in classes(found["refund"])
    assert classes(found["tell"]) == {"wf-node", "wf-llm"}
    assert found["tell"].get("opacity") is not None  # not reached: dimmed
    # Visit badges only where a node ran more than once.
    badges = {
        node_id: "".join(b.itertext())
        for node_id, g in found.items()
        for b in g.iter(f"{SVG}g")
        if "wf-badge" in classes(b)
    }
    assert badges == {"check": "×3"}
    outline = {
        node_id: next(r for r in g.iter(f"{SVG}rect") if "wf-outline" in classes(r)).get("stroke")
        for node_id, g in found.items()
    }
    assert len({outline["lookup"], outline["review"], outline["refund"], outline["tell"]}) == 4


def test_links_wrap_each_node() -> None:
    root = parse(workflow_svg(REFUND, link=lambda node: f"?node={node}&tab=io#n-{node}"))

    anchors = list(root.iter(f"{SVG}a"))
    assert len(anchors) == len(REFUND["nodes"])
    for anchor in anchors:
        (g,) = list(anchor)
        assert anchor.get("href") == f"?node={g.get('data-node')}&tab=io#n-{g.get('data-node')}"
    assert not list(parse(workflow_svg(REFUND)).iter(f"{SVG}a"))


def test_every_text_is_escaped() -> None:
    nasty = 'a < 5 && b > "x"'
    raw = {
        "slug": "esc<&>",
        "name": 'Esc <"&">',
        "start": "<a&b>",
        "nodes": {
            "<a&b>": {
                "kind": "condition",
                "cases": [{"when": nasty, "next": 'q"uote'}],
                "default": "end",
            },
            'q"uote': {
                "kind": "llm",
                "prompt": "<script>&</script>",
                "output": "o&o",
                "next": "end",
            },
        },
    }
    svg = workflow_svg(raw, link=lambda node: f"/x?n={node}")
    root = parse(svg)

    assert "<script>" not in svg
    assert set(nodes_by_id(root)) == {"<a&b>", 'q"uote'}
    (label,) = [g for g in groups(root, "wf-edge-label") if g.get("data-to") == 'q"uote']
    assert "".join(label.find(f"{SVG}text").itertext()) == nasty  # type: ignore[union-attr]
    assert nasty in (label.findtext(f"{SVG}title") or "")
    assert {a.get("href") for a in root.iter(f"{SVG}a")} == {"/x?n=<a&b>", '/x?n=q"uote'}


def test_back_edges_are_dashed_and_forward_edges_are_not() -> None:
    root = parse(workflow_svg(RESEARCH))

    back = {(g.get("data-from"), g.get("data-to")) for g in groups(root, "wf-back")}
    assert back == {("ask", "plan"), ("route", "route"), ("pause", "fetch")}
    for g in groups(root, "wf-edge"):
        dashed = g.find(f"{SVG}path").get("stroke-dasharray")  # type: ignore[union-attr]
        assert (dashed is not None) == ("wf-back" in classes(g))


def test_self_loop_and_two_node_cycle() -> None:
    raw = {
        "slug": "loops",
        "start": "a",
        "nodes": {
            "a": {"kind": "llm", "next": "b", "max_visits": 3},
            "b": {
                "kind": "condition",
                "cases": [{"when": "again", "next": "a"}, {"when": "same", "next": "b"}],
                "default": "end",
                "max_visits": 3,
            },
        },
    }
    root = parse(workflow_svg(raw))
    found = nodes_by_id(root)

    assert len(groups(root, "wf-edge")) == 4
    back = {(g.get("data-from"), g.get("data-to")) for g in groups(root, "wf-back")}
    assert back == {("b", "a"), ("b", "b")}
    # a above b; back edges come into their target's right side, pointing left.
    ax, ay, aw, ah = rect_of(found["a"])
    bx, by, bw, bh = rect_of(found["b"])
    assert ay + ah < by
    assert_back_edges_arrive_sideways(root)
    assert not overlapping(all_boxes(root))


def assert_back_edges_arrive_sideways(root: ET.Element) -> None:
    """A back edge's arrow points into its target's left or right side, within its height."""
    found = nodes_by_id(root)
    for g in groups(root, "wf-back"):
        tx, ty, tw, th = rect_of(found[g.get("data-to", "")])
        end_x, end_y = path_end(g)
        assert end_x == pytest.approx(tx + tw, abs=0.2) or end_x == pytest.approx(tx, abs=0.2)
        assert ty < end_y < ty + th


def test_back_edges_arrive_sideways() -> None:
    for raw in (RESEARCH, CROWDED):
        assert_back_edges_arrive_sideways(parse(workflow_svg(raw)))


def test_self_loop_stays_beside_its_node() -> None:
    """The loop and its label sit between the node and its right neighbour, not round them."""
    root = parse(workflow_svg(CROWDED))
    found = nodes_by_id(root)
    (loop,) = [
        g for g in groups(root, "wf-back") if g.get("data-from") == g.get("data-to") == "left"
    ]
    lx, ly, lw, lh = rect_of(found["left"])
    path = loop.find(f"{SVG}path")
    assert path is not None
    # _rounded() writes only M, L and Q: every number pair is a point.
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    xs, ys = numbers[0::2], numbers[1::2]
    neighbours = [rect_of(g)[0] for node, g in found.items() if node in ("mid", "right")]
    assert lx + lw <= min(xs) and max(xs) < min(neighbours)
    assert ly < min(ys) and max(ys) < ly + lh


def test_forward_edges_arrive_on_top_of_their_target() -> None:
    root = parse(workflow_svg(RESEARCH))
    found = nodes_by_id(root)
    (end_pill,) = [g for g in groups(root, "wf-terminal") if "wf-end" in classes(g)]

    for g in groups(root, "wf-edge"):
        if "wf-back" in classes(g):
            continue
        target = found.get(g.get("data-to", ""), end_pill)
        tx, ty, tw, _th = rect_of(target)
        end_x, end_y = path_end(g)
        assert end_y == pytest.approx(ty, abs=0.2), g.get("data-to")
        assert tx < end_x < tx + tw


@pytest.mark.parametrize(
    "raw",
    [REFUND, RESEARCH, CROWDED, chain(10)],
    ids=["design example", "research", "crowded", "chain of 10"],
)
def test_layout_never_overlaps_boxes_or_labels(raw: dict[str, Any]) -> None:
    root = parse(workflow_svg(raw))

    boxes = all_boxes(root)
    assert len(boxes) >= len(raw["nodes"]) + 2
    assert overlapping(boxes) == []
    _x, _y, width, height = (float(v) for v in root.get("viewBox", "").split())
    for name, (x, y, w, h) in boxes:
        assert 0 <= x <= width - w and 0 <= y <= height - h, name


def test_flow_reads_top_to_bottom() -> None:
    root = parse(workflow_svg(chain(10)))
    found = nodes_by_id(root)

    tops = [rect_of(found[f"step_{i}"])[1] for i in range(10)]
    assert tops == sorted(tops) and len(set(tops)) == 10
    pills = {terminal(g): rect_of(g) for g in groups(root, "wf-terminal")}
    assert pills["wf-start"][1] < tops[0] and pills["wf-end"][1] > tops[-1]
    # A straight chain is drawn straight: one column.
    assert len({rect_of(g)[0] + rect_of(g)[2] / 2 for g in found.values()}) == 1


def test_design_example_has_no_crossings_left() -> None:
    """check's case goes to review, its default to refund on the outer side (left or right,
    the layout's choice): review's two edges then cross neither check's default nor each
    other."""
    root = parse(workflow_svg(REFUND))
    found = nodes_by_id(root)

    def centre(node_id: str) -> float:
        x, _y, w, _h = rect_of(found[node_id])
        return x + w / 2

    refund_left = centre("refund") < centre("review")
    assert refund_left == (centre("refund") < centre("tell_no"))


def test_same_input_same_svg() -> None:
    marks = {"fetch": NodeMark(2, "visited"), "plan": NodeMark(1, "active")}
    first = workflow_svg(RESEARCH, marks=marks, link=lambda n: f"#{n}")

    assert workflow_svg(RESEARCH, marks=marks, link=lambda n: f"#{n}") == first
    # A copy built in another order of construction is still the same mapping.
    copy = {key: RESEARCH[key] for key in reversed(list(RESEARCH))}
    assert workflow_svg(copy, marks=dict(marks), link=lambda n: f"#{n}") == first


def test_fifty_nodes_lay_out_quickly_without_overlaps() -> None:
    rng = random.Random(7)
    ids = [f"n{i:02d}" for i in range(50)]
    nodes: dict[str, Any] = {}
    for i, node in enumerate(ids):
        later = ids[i + 1 : i + 6] or ["end"]
        if i % 7 == 3:
            nodes[node] = {
                "kind": "condition",
                "cases": [
                    {"when": f"x > {k}", "next": rng.choice(later)}
                    for k in range(rng.randint(1, 3))
                ],
                "default": ids[max(0, i - 4)] if i % 14 == 3 else rng.choice(later),
                "max_visits": 2,
            }
        else:
            nodes[node] = {"kind": "tool", "tool": f"t{i}", "next": rng.choice(later)}
    raw = {"slug": "big", "start": ids[0], "nodes": nodes}

    # Its time is a figure of bench/workflow_graph.py, not a bound here (CI is loaded).
    root = parse(workflow_svg(raw))

    assert set(nodes_by_id(root)) == set(ids)
    assert overlapping(all_boxes(root)) == []


def test_missing_target_is_drawn_rather_than_crashing() -> None:
    raw = {"slug": "broken", "start": "a", "nodes": {"a": {"kind": "tool", "next": "ghost"}}}

    found = nodes_by_id(parse(workflow_svg(raw)))

    assert "wf-missing" in classes(found["ghost"])


def test_fifteen_hundred_nodes_are_drawn() -> None:
    """A large definition draws (in seconds: bench/workflow_graph.py measures it), every
    node once, every box inside the picture."""
    rng = random.Random(11)
    ids = [f"n{i:04d}" for i in range(1500)]
    nodes: dict[str, Any] = {}
    for i, node in enumerate(ids):
        later = ids[i + 1 : i + 6] or ["end"]
        if i % 7 == 3:
            nodes[node] = {
                "kind": "condition",
                "cases": [{"when": f"x > {k}", "next": rng.choice(later)} for k in range(2)],
                "default": ids[max(0, i - 4)] if i % 14 == 3 else "end",
                "max_visits": 2,
            }
        else:
            nodes[node] = {"kind": "tool", "tool": f"t{i}", "next": rng.choice(later)}

    root = parse(workflow_svg({"slug": "huge", "start": ids[0], "nodes": nodes}))

    assert list(nodes_by_id(root)) == ids
    _x, _y, width, height = (float(v) for v in root.get("viewBox", "").split())
    for name, (x, y, w, h) in all_boxes(root):
        assert 0 <= x <= width - w and 0 <= y <= height - h, name


def test_an_edge_that_ends_the_run_far_up_gets_an_end_pill_nearby() -> None:
    """A ladder of approvals that may each end the run: drawn down to the one end pill,
    every rejection would cross every row below it (1,500 of them took minutes)."""
    ids = [f"h{i:02d}" for i in range(30)]
    nodes = {
        node: {"kind": "human", "next": ids[i + 1] if i + 1 < 30 else "end", "rejected": "end"}
        for i, node in enumerate(ids)
    }
    root = parse(workflow_svg({"slug": "ladder", "start": ids[0], "nodes": nodes}))
    found = nodes_by_id(root)
    pills = [rect_of(g) for g in groups(root, "wf-terminal") if "wf-end" in classes(g)]

    assert len(pills) > 10
    for g in groups(root, "wf-edge"):
        if g.get("data-to") != "end":
            continue
        sx, sy, sw, sh = rect_of(found[g.get("data-from", "")])
        end_x, end_y = path_end(g)
        # Onto the top of a pill, at most a row below its source.
        assert any(
            x < end_x < x + w and end_y == pytest.approx(y, abs=0.2) for x, y, w, _h in pills
        )
        if int(g.get("data-from", "")[1:]) < 15:  # far above the last row
            assert sy + sh < end_y < sy + sh + 200
    assert overlapping(all_boxes(root)) == []

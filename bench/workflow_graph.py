"""`python -m bench.workflow_graph`: what drawing a workflow's graph costs, by size.

Not part of `make bench` (no targets, no database): the evidence behind docs/workflows.md
"The graph". For each size, in a child process of its own (so its peak memory is its own):
laying out and drawing a version's picture (once per version, when it is stored), reading
a stored picture back from its JSON (once per process), and drawing a run's marks onto it
(every request). `--old FILE` times another graph_svg.py side by side, e.g. the
hand-written layout before igraph: `git show 2a6342d:workflows/graph_svg.py > /tmp/old.py`.

The workflows are synthetic. `mesh`: chains whose nodes jump up to five ahead, every
seventh a condition with two cases and a default that goes back four nodes (a loop) or
ends the run. `ladder`: approvals one after the other, each of which may end the run.
"""

import argparse
import importlib.util
import json
import random
import resource
import subprocess
import sys
import time
from typing import Any

SIZES = (20, 200, 1500)


def synthetic(size: int, seed: int = 11) -> dict[str, Any]:
    rng = random.Random(seed)
    ids = [f"n{i:04d}" for i in range(size)]
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
    return {"slug": f"synthetic-{size}", "start": ids[0], "nodes": nodes}


def ladder(size: int) -> dict[str, Any]:
    ids = [f"h{i:04d}" for i in range(size)]
    nodes = {
        node: {"kind": "human", "next": ids[i + 1] if i + 1 < size else "end", "rejected": "end"}
        for i, node in enumerate(ids)
    }
    return {"slug": f"ladder-{size}", "start": ids[0], "nodes": nodes}


SHAPES = {"mesh": synthetic, "ladder": ladder}


def _best_ms(action: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - began)
    return best * 1000


def measure(shape: str, size: int, old: str | None) -> dict[str, Any]:
    """One size, in this process: its figures as a dict."""
    raw = SHAPES[shape](size)
    if old:
        spec = importlib.util.spec_from_file_location("old_graph_svg", old)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["old_graph_svg"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        began, cpu = time.perf_counter(), time.process_time()
        module.workflow_svg(raw)
        return {
            "shape": shape,
            "size": size,
            "draw_s": round(time.perf_counter() - began, 3),
            "draw_cpu_s": round(time.process_time() - cpu, 3),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        }
    from workflows.graph_svg import NodeMark, Picture, picture_svg, workflow_picture

    began, cpu = time.perf_counter(), time.process_time()
    picture = workflow_picture(raw)
    draw_s, draw_cpu_s = time.perf_counter() - began, time.process_time() - cpu
    stored = json.dumps(picture.to_json())
    marks = {
        node: NodeMark(visits=1 + i % 3, status="visited", seconds=0.25)
        for i, node in enumerate(raw["nodes"])
    }
    return {
        "shape": shape,
        "size": size,
        "draw_s": round(draw_s, 3),
        "draw_cpu_s": round(draw_cpu_s, 3),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "stored_kb": len(stored) // 1024,
        "read_stored_ms": round(_best_ms(lambda: Picture.from_json(json.loads(stored)), 5), 2),
        "run_overlay_ms": round(_best_ms(lambda: picture_svg(picture, marks=marks), 20), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="mesh")
    parser.add_argument("--old", help="another graph_svg.py to time instead of this one")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child's size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.shape, args.one, args.old)))
        return
    for size in args.sizes:
        command = [sys.executable, "-m", "bench.workflow_graph", "--one", str(size)]
        command += ["--shape", args.shape]
        if args.old:
            command += ["--old", args.old]
        print(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()

"""Summarise py-spy collapsed stacks: `python -m bench.stacks FILE [--top N] [--focus TEXT]`.

Prints the share of samples in which each function appears (inclusive) and
at the top of the stack (self). With `--focus`, only samples whose stack
contains TEXT count, and shares are of those.
"""

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match.group('func')} ({path})"


def load(path: Path, focus: str | None = None) -> tuple[int, Counter[str], Counter[str]]:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        if focus and focus not in stack:
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f]
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            leaf[frames[-1]] += count
    return total, inclusive, leaf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stacks", description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--focus")
    args = parser.parse_args(argv)
    total, inclusive, leaf = load(args.file, args.focus)
    if not total:
        print("no samples")
        return 1
    print(f"{total} samples{' containing ' + repr(args.focus) if args.focus else ''}\n\ninclusive:")
    for frame, count in inclusive.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    print("\nself:")
    for frame, count in leaf.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Fault injection for crash tests: kill this process at a named point.

Off unless FAULT_POINTS is set (tests and `make soak` set it for a worker
process they own). `FAULT_POINTS=before_model_call` kills the process with
SIGKILL the first time that point is reached; `FAULT_RANDOM=0.05` kills it at
any point with that probability. A marker file makes a named point fire once
per FAULT_MARKER_DIR, so the replacement worker runs through.
"""

import os
import random
import signal
import tempfile
from pathlib import Path

POINTS = (
    "before_model_call",
    "during_stream",
    "after_tool_sent",
    "after_commit_before_publish",
    "before_tool_results_commit",
)

# Reached only by a step that reserved credit points (tests/e2e/test_credit_crash.py):
# kept apart from POINTS, which the fault soak expects every run to reach.
CREDIT_POINTS = ("after_credits_reserved",)

_points = {p.strip() for p in os.environ.get("FAULT_POINTS", "").split(",") if p.strip()}
_random = float(os.environ.get("FAULT_RANDOM", "0") or 0)
_marker_dir = Path(os.environ.get("FAULT_MARKER_DIR") or tempfile.gettempdir())


def fault_point(name: str) -> None:
    if not _points and not _random:
        return
    if name in _points:
        marker = _marker_dir / f"fault-{name}.fired"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    if _random and random.random() < _random:  # noqa: S311  # nosec B311 - chaos, not cryptography
        os.kill(os.getpid(), signal.SIGKILL)

"""`Processes.stop_all(keep=...)`: what the CLI hands on survives, the rest stops."""

import sys

from bench.procs import Processes


def test_stop_all_keeps_the_named_live_processes() -> None:
    procs = Processes({})
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    kept = procs.start("kept", sleeper)
    other = procs.start("other", sleeper)
    try:
        procs.stop_all(keep={"kept", "absent"})
        assert other.poll() is not None
        assert procs.running("kept") and not procs.running("other")
    finally:
        procs.stop_all()
    assert kept.poll() is not None

"""`python -m agentplatform.web --processes N -b HOST -p PORT [daphne options]`: N daphnes, one port.

Binds the listening socket once, then starts N daphne processes that all
accept on it (`daphne --fd`, the socket inherited), as a pre-fork server does:
REST and websockets stay on one port (same-origin for the playground) and
scale with cores, where one daphne runs every request's Python under one GIL.
Any daphne may take any connection; websocket frames reach a socket on any
of them through the channel layer (Redis), as with several hosts.

SIGTERM / SIGINT stop every daphne; if one exits by itself the others are
stopped too and this process exits with its code, for the supervisor (honcho,
systemd, the platform) to restart the whole web process.
"""

import argparse
import os
import signal
import socket
import subprocess  # nosec B404 - starts daphne children from a fixed argv, no shell
import sys
import time
from pathlib import Path
from types import FrameType

DAPHNE = str(Path(sys.executable).parent / "daphne")


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m agentplatform.web", description=__doc__)
    parser.add_argument(
        "--processes",
        type=int,
        default=int(os.environ.get("WEB_PROCESSES") or 2),
        help="daphne processes sharing the port (default: WEB_PROCESSES, else 2)",
    )
    parser.add_argument("-b", "--bind", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=8000)
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, daphne_args = _parse(argv)
    listener = socket.socket(socket.AF_INET6 if ":" in args.bind else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(1024)
    listener.set_inheritable(True)
    fd = listener.fileno()
    print(
        f"web: {args.processes} daphne process(es) on {args.bind}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    children = [
        # The daphne binary of this venv and our own parsed arguments; no shell.
        subprocess.Popen([DAPHNE, "--fd", str(fd), *daphne_args], pass_fds=[fd])  # nosec B603
        for _ in range(max(args.processes, 1))
    ]
    listener.close()  # the daphnes hold it now
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    while True:
        exited = [c for c in children if c.poll() is not None]
        if exited and not stopping:
            code = exited[0].returncode or 1
            stop(signal.SIGTERM, None)
        if len(exited) == len(children):
            _forget_metrics(children)
            return code
        time.sleep(0.2)


def _forget_metrics(children: list[subprocess.Popen[bytes]]) -> None:
    """Drop the live gauges (open websockets) of daphnes that are gone (Prometheus multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        for child in children:
            multiprocess.mark_process_dead(child.pid)


if __name__ == "__main__":
    sys.exit(main())

"""The real processes a benchmark needs: daphne, a Celery worker, beat.

Each runs in a process group of its own (start_new_session), so stopping it
stops its children too; `stop_all` runs on normal exit, on an exception and
on SIGINT / SIGTERM (turned into exceptions by the CLI), so no benchmark
leaves a worker behind.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .environment import DATA, ROOT

BIN = Path(sys.executable).parent
LOGS = DATA / "bench-logs"
# Set on SIGINT / SIGTERM. The handler raises KeyboardInterrupt, but Python drops an
# exception raised while a finalizer runs, so the loops that wait also check this.
STOP = threading.Event()
_RUNNING: list["Processes"] = []


def stop_everything() -> None:
    """From the signal handler: kill every process group started here, at once."""
    STOP.set()
    for procs in list(_RUNNING):
        for proc in list(procs.procs.values()):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)


def procfile() -> dict[str, str]:
    """The Procfile's process types and their command lines."""
    entries: dict[str, str] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and ":" in line:
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.port: int | None = None
        # Ports of helper servers (e.g. "model"), for a benchmark that finds them running.
        self.ports: dict[str, int] = {}
        # Set by `--pyspy`: where py-spy writes collapsed stacks of the measured windows.
        self.pyspy_prefix: str | None = None
        _RUNNING.append(self)

    # ------------------------------------------------------------------ start
    def start(
        self, name: str, argv: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        if name in self.procs:
            raise RuntimeError(f"{name} is already running")
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / f"{name}-{os.getpid()}.log"
        self.logs[name] = log
        with log.open("wb") as handle:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **self.env, **(extra_env or {})},
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def worker_node(self, name: str) -> str:
        return f"{name}-{os.getpid()}@{socket.gethostname()}"

    def start_worker(
        self, name: str = "worker", concurrency: int = 100, extra_env: dict[str, str] | None = None
    ) -> str:
        """A threads-pool worker on the bench queue, as the Procfile runs it; returns its node name."""
        node = self.worker_node(name)
        self.start(
            name,
            [
                str(BIN / "celery"),
                "-A",
                "agentplatform",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(concurrency),
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "-n",
                node,
            ],
            extra_env,
        )
        return node

    def start_beat(self) -> None:
        schedule = DATA / f"bench-beat-{os.getpid()}"
        self.start(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "agentplatform",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(schedule),
            ],
        )

    def start_web(self) -> int:
        self.port = free_port()
        self.start(
            "web",
            [
                str(BIN / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "--ping-interval",
                "20",
                "--ping-timeout",
                "30",
                "agentplatform.asgi:application",
            ],
        )
        return self.port

    def web_and_worker(self, concurrency: int) -> tuple[int, str, float, float]:
        """daphne and a threads-pool `worker`, those not already running (the benchmark
        before may hand them on); returns web's port, the worker's node name and the
        seconds until each answered."""
        if not self.running("web"):
            self.start_web()
        if not self.running("worker"):
            self.start_worker("worker", concurrency=concurrency)
        node = self.worker_node("worker")
        assert self.port is not None
        return self.port, node, self.wait_web(), self.wait_worker("worker", node)

    def start_procfile(
        self, entry: str, name: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start the Procfile's `entry` line exactly as written (through `sh -c`, as honcho does)."""
        command = procfile()[entry]
        self.start(name or entry, ["/bin/sh", "-c", f"exec {command}"], env)

    def wait_log(self, name: str, text: str, timeout: float = 60.0) -> float:
        """Wait until the log of `name` contains `text` (e.g. a worker's " ready.")."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self._check_alive()
            log = self.logs.get(name)
            if log is not None and log.exists() and text in log.read_text(errors="replace"):
                return time.monotonic() - started
            time.sleep(0.1)
        raise RuntimeError(f"{name}: no {text!r} within {timeout} s:\n{self.log_tail(name)}")

    def spy(self, pid: int, label: str) -> Callable[[], str | None]:
        """Sample `pid` with py-spy (GIL holders only) until the returned function is called.

        A no-op unless `--pyspy` was given; returns the path of the collapsed stacks.
        """
        if not self.pyspy_prefix:
            return lambda: None
        exe = str(BIN / "py-spy") if (BIN / "py-spy").exists() else shutil.which("py-spy")
        if not exe:
            print("bench: --pyspy needs py-spy (.venv/bin/pip install py-spy)", file=sys.stderr)
            return lambda: None
        out = f"{self.pyspy_prefix}-{label}.txt"
        proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--gil",
                "--nonblocking",
                # A web master's daphnes are its children.
                "--subprocesses",
                "-F",
                "--output",
                out,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def stop() -> str | None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            return out if Path(out).exists() else None

        return stop

    # ------------------------------------------------------------------ readiness
    def _check_alive(self) -> None:
        if STOP.is_set():
            raise KeyboardInterrupt("stopping")
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def wait_worker(self, name: str, node: str, timeout: float = 60.0) -> float:
        """Wait until this worker (by node name, not any worker on the broker) answers a ping."""
        from celery import current_app

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self._check_alive()
            try:
                if current_app.control.ping(destination=[node], timeout=0.5):
                    return time.monotonic() - started
            except Exception:  # noqa: BLE001 - the broker may still be connecting
                time.sleep(0.2)
        raise RuntimeError(
            f"worker {node} did not answer within {timeout} s:\n{self.log_tail(name)}"
        )

    def wait_web(self, timeout: float = 60.0) -> float:
        """Wait until the web process on `self.port` answers /healthz."""
        started = time.monotonic()
        last = ""
        while time.monotonic() - started < timeout:
            self._check_alive()
            try:
                response = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                if response.status_code == 200:
                    return time.monotonic() - started
                last = response.text[:200]
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise RuntimeError(f"daphne not ready after {timeout} s: {last}\n{self.log_tail('web')}")

    # ------------------------------------------------------------------ stop
    def stop(self, name: str, timeout: float = 15.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if name == "beat":
            for path in DATA.glob(f"bench-beat-{os.getpid()}*"):
                path.unlink(missing_ok=True)

    def running(self, name: str) -> bool:
        """Whether `name` was started and is still alive (handed on by the previous benchmark)."""
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def stop_all(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Stop every process but the live ones named in `keep` (the next benchmark's)."""
        for name in list(self.procs):
            if name in keep and self.running(name):
                continue
            try:
                self.stop(name)
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                print(f"bench: could not stop {name}: {exc}", file=sys.stderr)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs.get(name)
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

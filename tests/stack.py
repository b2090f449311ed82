"""Real processes for end-to-end tests: the web (daphnes), a Celery worker and beat, on the test database."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_database_url() -> str:
    """The DATABASE_URL of the test database pytest-django created."""
    from django.db import connection

    base = os.environ.get("DATABASE_URL") or _stack_env().get("DATABASE_URL", "")
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def _stack_env() -> dict[str, str]:
    path = ROOT / ".data" / "stack.env"
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
    return values


@dataclass
class Stack:
    port: int
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    # How each process was started, so `restart(name)` can start it again.
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    # Where the processes run (a copy of the checkout, for the deployment test).
    cwd: Path = ROOT

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(
        self, name: str, argv: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process of the stack; `extra_env` is added to the stack's environment for it alone."""
        # Per stack (port) as well as per run: a test's own `running_stack()` must
        # not truncate the log files the session's `live_stack` is writing to.
        log = ROOT / ".data" / "test-logs" / f"{name}-{os.getpid()}-{self.port}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs[name] = log
        env = {**self.env, **(extra_env or {})}
        self.commands[name] = (list(argv), dict(extra_env or {}))
        handle = log.open("wb")
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_worker(
        self, name: str = "worker", concurrency: int = 50, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A Celery worker (threads pool); `extra_env` (e.g. FAULT_POINTS) applies to it alone."""
        return self.start(
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
                f"{name}-{os.getpid()}@%h",
            ],
            extra_env,
        )

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start a stopped (or dead) process again, as it was started before."""
        argv, extra_env = self.commands[name]
        self.stop(name)
        return self.start(name, argv, extra_env)

    def wait_worker_ready(self, name: str, timeout: float = 60.0) -> None:
        """Wait until the worker `name` says it is ready to take tasks."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                raise RuntimeError(f"{name} is not running:\n{self.log_tail(name)}")
            log = self.logs.get(name)
            if log is not None and log.exists() and " ready." in log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready after {timeout} s:\n{self.log_tail(name)}")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs.get(name)
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float | None = None) -> None:
        # A loaded machine (several test runs on 2 cores) starts the daphnes slower: with
        # both lanes running, a crash test's fresh stack missed 30 s in CI (ready in ~5 s
        # idle); waiting longer costs nothing when it is up sooner.
        timeout = timeout or float(os.environ.get("STACK_READY_TIMEOUT_S") or 90.0)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                response = httpx.get(f"{self.http}/readyz", timeout=3)
                if response.status_code == 200:
                    return
                last = response.text
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
        raise RuntimeError(f"stack not ready after {timeout} s: {last}")


# The run's shared live stack (tests/conftest.py `live_stack`), once it is up.
LIVE_STACKS: list[Stack] = []
# The processes of a stack that take work from the database and the queue.
WORKING = ("worker", "beat")


@contextmanager
def live_stacks_paused() -> Iterator[None]:
    """The shared live stack's worker and beat stop (SIGSTOP) while another stack runs.

    Both stacks work on the same test database. A test with a stack of its own kills and
    starts workers and waits for its sessions' leases to run out; the live stack's
    sweeper would requeue those sessions on its own queue and its worker would finish
    them, so the test would watch the wrong worker (on a busy machine, a freshly started
    worker is slower than the live one). Paused, they hold their connections and do
    nothing; they go on where they were once the other stack has stopped.
    """
    paused = [
        proc
        for stack in LIVE_STACKS
        for name, proc in stack.procs.items()
        if name in WORKING and proc.poll() is None
    ]
    for proc in paused:
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in paused:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)


@contextmanager
def running_stack(
    extra_env: dict[str, str] | None = None, ready_timeout: float | None = None
) -> Iterator[Stack]:
    """A web, a worker and beat on the test database; the shared live stack pauses meanwhile."""
    with live_stacks_paused(), _started_stack(extra_env, ready_timeout) as stack:
        yield stack


@contextmanager
def _started_stack(
    extra_env: dict[str, str] | None = None, ready_timeout: float | None = None
) -> Iterator[Stack]:
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    port = free_port()
    env["WS_ALLOWED_ORIGINS"] = f"http://127.0.0.1:{port},http://localhost:{port}"
    stack = Stack(port=port, env=env)
    schedule = ROOT / ".data" / f"test-beat-{os.getpid()}-{port}"
    try:
        # As the Procfile's `web`: several daphnes sharing the port (agentplatform/web.py).
        stack.start(
            "web",
            [
                sys.executable,
                "-m",
                "agentplatform.web",
                "--processes",
                env.get("WEB_PROCESSES") or "2",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                # The Procfile pings every 20 s; the test stack every 2 s, so that a few
                # seconds of silence already span several keepalive rounds (the idle test).
                "--ping-interval",
                "2",
                "--ping-timeout",
                "30",
                "agentplatform.asgi:application",
            ],
        )
        stack.start_worker()
        stack.start(
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
        stack.wait_ready(ready_timeout)
        yield stack
    finally:
        for name in list(stack.procs):
            stack.stop(name)
        for path in schedule.parent.glob(schedule.name + "*"):
            path.unlink(missing_ok=True)


def broker_queue_lists() -> tuple[redis.Redis, list[str]]:
    """The broker's client and the worker queue's lists, one per priority, for the tests that
    read or empty it (kombu's Redis layout: `<queue>`, `<queue>\x06\x16<n>`; the product
    counts the queue through kombu and knows no layout)."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    steps = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("priority_steps", [0])
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2)
    return client, [queue if p == 0 else f"{queue}\x06\x16{p}" for p in steps]

"""`make run` smoke test: the documented entry point starts everything, serves the demo, and stops on Ctrl-C.

It runs on the embedded development stack (the `agentplatform` database, the
default Celery queue), exactly as a developer would; the test database is not
involved.
"""

import contextlib
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.demo_setup import DEMO_REQUEST
from tests.stack import ROOT, free_port

pytestmark = [pytest.mark.e2e]

READY_TIMEOUT_S = 180  # generous: CI runs this beside the in-process lane on 2 cores
TURN_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


def _descendants(root: int) -> set[int]:
    """Live (non-zombie) processes under `root`, found through /proc."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        pid = int(entry.name)
        children.setdefault(int(ppid), []).append(pid)
        if state != "Z":
            alive.add(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found & alive


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def _kill_leftovers(pids: set[int]) -> None:
    """SIGKILL what this test started and left behind (never anything else)."""
    for pid in _alive(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if ".venv/" in cmdline or cmdline.startswith("make "):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _env(port: int) -> dict[str, str]:
    env = dict(os.environ)
    # The test run's own settings must not leak in: `make run` uses the
    # embedded stack's URLs (.data/stack.env) and the default queue.
    # EGRESS_ALLOW too: `make run` allows its demo API's address itself.
    for name in (
        "CELERY_QUEUE",
        "DATABASE_URL",
        "REDIS_URL",
        "SESSION_PICKUP_GRACE_S",
        "EGRESS_ALLOW",
    ):
        env.pop(name, None)
    env["PORT"] = str(port)
    # The demo business API (Procfile `demoapi`) on a free port too: a port
    # already taken (another `make run`) would stop the whole `make run`.
    env["DEMO_API_PORT"] = str(free_port())
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _demo_turn(base: str, key: str) -> None:
    """Open a session on the demo agent, send the demo request, wait for its answer."""
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=15
    ) as client:
        session = client.post("/api/v1/sessions/", json={"agent": "order-support"})
        assert session.status_code == 201, session.text
        session_id = session.json()["id"]
        posted = client.post(
            f"/api/v1/sessions/{session_id}/messages/", json={"content": DEMO_REQUEST}
        )
        assert posted.status_code == 202, posted.text
        deadline = time.monotonic() + TURN_TIMEOUT_S
        finished = []
        while time.monotonic() < deadline and not finished:
            events = client.get(f"/api/v1/sessions/{session_id}/events/", params={"after": 0})
            assert events.status_code == 200, events.text
            finished = [e for e in events.json() if e["type"] == "turn.finished"]
            time.sleep(0.2)
        assert finished, f"no turn.finished after {TURN_TIMEOUT_S} s"
        assert finished[0]["data"]["stop_reason"] == "answer", finished
        messages = client.get(
            f"/api/v1/sessions/{session_id}/messages/", params={"limit": 100}
        ).json()
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"], messages[-1]

        # An HTTP tool: the demo API on 127.0.0.1, which the egress policy lets `make run` reach.
        posted = client.post(
            f"/api/v1/sessions/{session_id}/messages/", json={"content": "order SO-1001"}
        )
        assert posted.status_code == 202, posted.text
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while time.monotonic() < deadline and len(finished) < 2:
            events = client.get(f"/api/v1/sessions/{session_id}/events/", params={"after": 0})
            finished = [e for e in events.json() if e["type"] == "turn.finished"]
            time.sleep(0.2)
        assert len(finished) == 2, f"no second turn.finished after {TURN_TIMEOUT_S} s"
        messages = client.get(
            f"/api/v1/sessions/{session_id}/messages/", params={"limit": 100}
        ).json()
        assert messages[-1]["content"].startswith("Order SO-1001 of "), messages[-2:]


def test_make_run_serves_the_demo_and_stops_on_ctrl_c():
    port = free_port()
    env = _env(port)
    base = f"http://127.0.0.1:{port}"
    log_path = ROOT / ".data" / "test-logs" / f"make-run-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def tail(lines: int = 60) -> str:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["make", "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    running: set[int] = set()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"make run exited with {proc.returncode}:\n{tail()}"
            try:
                ready = httpx.get(f"{base}/readyz", timeout=3)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert ready is not None and ready.status_code == 200, f"not ready:\n{tail()}"

        created = subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "python"),
                "manage.py",
                "create_api_key",
                "--user",
                "smoke",
                "--roles",
                "support",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip().splitlines()[-1]

        try:
            _demo_turn(base, key)
        except (httpx.HTTPError, AssertionError) as exc:
            pytest.fail(f"{exc!r}\n--- make run output:\n{tail()}")

        output = log_path.read_text(errors="replace")
        _check_banner(output, base)
        # One process migrated, applied the demo's config and bootstrapped it, and the
        # demo's own tools pass the description check: a clean start warns of nothing.
        assert "agent order-support:" in output, output[:3000]
        assert "warning: tool" not in output, [
            line for line in output.splitlines() if "warning: tool" in line
        ]

        # Ctrl-C: SIGINT to the whole foreground process group, as a terminal does.
        running = _descendants(proc.pid) | {proc.pid}
        assert len(running) >= 5, f"expected make, honcho, web, worker, beat; got {running}"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make run still running {STOP_TIMEOUT_S} s after SIGINT:\n{tail()}")
        deadline = time.monotonic() + 10
        while _alive(running) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(running), f"left running after Ctrl-C: {_alive(running)}\n{tail()}"
    finally:
        # On failure: honcho's children run in sessions of their own, so find
        # them before make and honcho go, or they would be orphaned.
        leftovers = running | (_descendants(proc.pid) if proc.poll() is None else set())
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        _kill_leftovers(leftovers)


def _check_banner(output: str, base: str) -> None:
    """The URLs and credentials come after the processes' start-up, and the secrets only there."""
    lines = output.splitlines()
    playground = [i for i, line in enumerate(lines) if f"playground  {base}/playground/" in line]
    assert len(playground) == 1, output[-3000:]
    worker_ready = [i for i, line in enumerate(lines) if re.search(r"worker\.\d.* ready\.", line)]
    assert worker_ready and worker_ready[0] < playground[0], output[-3000:]
    assert any(line.startswith("  operator    ") for line in lines[playground[0] :]), output[-3000:]
    credentials = ROOT / ".data" / "credentials"
    if credentials.exists():  # the embedded default: kept beside the data, private
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
        values = dict(
            line.split("=", 1) for line in credentials.read_text().splitlines() if "=" in line
        )
        for secret in filter(None, (values.get("OPERATOR_PASSWORD"), values.get("DEMO_API_KEY"))):
            where = [i for i, line in enumerate(lines) if secret in line]
            assert where and min(where) > playground[0] - 5, (
                "a secret was printed before the banner"
            )


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("variable", ["PORT", "DEMO_API_PORT"])
def test_make_run_refuses_a_taken_port_with_one_line_before_starting_anything(variable):
    stack_env = ROOT / ".data" / "stack.env"
    before = stack_env.stat().st_mtime_ns if stack_env.exists() else None
    with _listening_socket() as taken:
        port = taken.getsockname()[1]
        env = _env(free_port())
        env[variable] = str(port)
        started = time.monotonic()
        result = subprocess.run(
            ["make", "run"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(output) == 1, output
    assert f"port {port} is in use (set {variable} to another port)" in output[0], output
    assert "Traceback" not in result.stderr
    # Nothing started: devstack did not run (stack.env untouched), and it was quick.
    after = stack_env.stat().st_mtime_ns if stack_env.exists() else None
    assert after == before
    assert time.monotonic() - started < 60

"""The Procfile as a deployment runs it: a clean checkout, no `.data/`, only the two URLs set.

web, worker and beat are started from the Procfile's own lines. /readyz stays
503 (naming the sweeper) until beat runs; a worker SIGKILLed mid-turn is taken
over by the sweeper and the turn finishes; the sweeper's chatter stays out of
the INFO logs, and the one takeover is logged once.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis
from django.conf import settings

from demo.models import Notification, Report
from record.models import Session
from record.states import RUNNABLE
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.e2e.support import (
    api,
    create_session,
    post_message,
    set_model_options,
    turns_finished,
    wait_events,
)
from tests.factories import api_key_for
from tests.stack import ROOT, Stack, free_port
from tests.stack import test_database_url as database_url_of_this_run

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _procfile(root: Path) -> dict[str, str]:
    commands = {}
    for line in (root / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            commands[name.strip()] = command.strip()
    return commands


@pytest.fixture
def clean_checkout() -> Iterator[Path]:
    """The repository's files (as in the working tree) in a temporary directory, without `.data/`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    with tempfile.TemporaryDirectory(prefix="agentplatform-deploy-") as tmp:
        copy = Path(tmp) / "checkout"
        for name in filter(None, (entry.decode() for entry in listed)):
            source = ROOT / name
            if source.is_file() and not source.is_symlink():
                target = copy / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        (copy / ".venv").symlink_to((ROOT / ".venv").resolve())
        yield copy


@pytest.fixture
def own_redis_db() -> Iterator[str]:
    """REDIS_URL on a Redis database of its own: the default queue and key prefix are then private."""
    parts = urlsplit(settings.REDIS_URL)
    url = urlunsplit(parts._replace(path=f"/{random.randint(1, 15)}"))
    client = redis.Redis.from_url(url)
    # The defaults a deployment gets: queue `agentplatform`, key prefix `agentplatform`.
    stale = ["agentplatform", "agentplatform:sweeper:last_completed"]
    client.delete(*stale)
    try:
        yield url
    finally:
        client.delete(*stale)
        client.close()


def _readyz(stack: Stack) -> httpx.Response | None:
    try:
        return httpx.get(f"{stack.http}/readyz", timeout=5)
    except httpx.HTTPError:
        return None


def test_procfile_runs_from_a_clean_checkout_and_survives_a_killed_worker(
    clean_checkout: Path, own_redis_db: str
):
    demo_install()
    # query_orders runs at once; each model call then takes a second, so the
    # worker is certainly mid-turn when it is killed.
    set_model_options("rules", latency_s=1.0)
    key = api_key_for("alice")
    procfile = _procfile(clean_checkout)
    assert ".data/" not in (clean_checkout / "Procfile").read_text()
    assert not (clean_checkout / ".data").exists() and not (clean_checkout / ".env").exists()

    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONUNBUFFERED": "1",
        "PORT": str(port),
        "DATABASE_URL": database_url_of_this_run(),
        "REDIS_URL": own_redis_db,
    }
    stack = Stack(port=port, env=env, cwd=clean_checkout)

    def logs() -> str:
        return "\n".join(
            f"--- {name}\n{stack.log_tail(name, 30)}" for name in ("web", "worker", "beat")
        )

    try:
        stack.start("web", ["bash", "-c", procfile["web"]])
        stack.start("worker", ["bash", "-c", procfile["worker"]])

        # Up, with a worker, but no beat: unready, and the body says why.
        deadline = time.monotonic() + 60
        response = None
        while time.monotonic() < deadline:
            for name, proc in stack.procs.items():
                assert proc.poll() is None, f"{name} exited:\n{logs()}"
            response = _readyz(stack)
            if response is not None and response.json()["checks"]["worker"] == "ok":
                break
            time.sleep(0.3)
        assert response is not None, f"web never answered:\n{logs()}"
        body = response.json()
        assert response.status_code == 503, body
        assert body["checks"]["database"] == "ok" and body["checks"]["worker"] == "ok", body
        assert "no sweep has completed" in body["checks"]["sweeper"], body

        stack.start("beat", ["bash", "-c", procfile["beat"]])
        stack.wait_ready(timeout=60)
        assert _readyz(stack).json()["checks"]["sweeper"] == "ok"

        with api(stack, key) as client:
            session_id = create_session(client, "order-support")
            post_message(client, session_id, DEMO_REQUEST)
            wait_events(
                client,
                session_id,
                lambda events: any(e["type"] == "tool.finished" for e in events),
                30,
                logs,
            )
            victim = stack.procs["worker"]
            row = Session.objects.get(pk=session_id)
            assert row.state in RUNNABLE, row.state
            stack.stop("worker", signal.SIGKILL)
            assert victim.poll() is not None
            stack.start("worker2", ["bash", "-c", procfile["worker"]])
            events = wait_events(client, session_id, turns_finished(1), 60, logs)

        finished = [e for e in events if e["type"] == "turn.finished"]
        assert len(finished) == 1 and finished[0]["data"]["stop_reason"] == "answer", finished
        assert Notification.objects.count() == 3
        assert Report.objects.count() == 1
        row = Session.objects.get(pk=session_id)
        assert row.state == "finished" and row.lease_owner is None, (row.state, row.lease_owner)

        # Nothing wrote a `.data/` (or a beat schedule file) into the checkout.
        assert not (clean_checkout / ".data").exists()
        assert not list(clean_checkout.glob("celerybeat-schedule*"))

        # Readable logs at INFO: no per-sweep lines from beat or the workers,
        # and exactly the one takeover logged, once.
        texts = {name: stack.logs[name].read_text(errors="replace") for name in stack.logs}
        for name, text in texts.items():
            chatter = [
                line
                for line in text.splitlines()
                # The worker's start-up banner lists its tasks (". sessions.tasks...").
                if ("sweep_sessions" in line or "sweep-sessions" in line)
                and not line.strip().startswith(".")
            ]
            assert not chatter, (name, chatter[:5])
        takeovers = [
            line
            for text in texts.values()
            for line in text.splitlines()
            if "sweeper: requeued" in line
        ]
        # One line per sweep that acted (a slow worker2 may need a second requeue). The
        # broker may also hand the dead worker's unacknowledged run straight to worker2,
        # which then takes the expired lease with no requeue: no line is owed then.
        # Logs are JSON by default (LOG_FORMAT=json); plain text says " INFO ".
        assert all(_logged_at_info(line) and session_id in line for line in takeovers), takeovers
    finally:
        for name in list(stack.procs):
            stack.stop(name)


def _logged_at_info(line: str) -> bool:
    """Whether a log line (a JSON record or a plain one) was logged at INFO."""
    if line.lstrip().startswith("{"):
        try:
            return json.loads(line).get("level") == "info"
        except ValueError:
            return False
    return " INFO " in line

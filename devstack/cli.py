"""Command line: up, down, status, env."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess  # nosec B404 - runs the bundled server binaries, no shell
import sys
import tempfile
import time
from pathlib import Path

from devstack import banner, paths, ports, postgres, valkey

SERVICES = {"DATABASE_URL": postgres, "REDIS_URL": valkey}
LABELS = {"DATABASE_URL": "postgres", "REDIS_URL": "valkey"}


def cmd_up(_args: argparse.Namespace) -> int:
    started = time.monotonic()
    urls: dict[str, str] = {}
    with paths.locked():
        for var, service in SERVICES.items():
            external = paths.external_url(var)
            if external is not None:
                value, source = external
                print(f"{LABELS[var]:9} {var} from {source}: {paths.redact(value)} (not embedded)")
                continue
            urls[var] = service.up()
        paths.write_stack_env(urls)
    for var, url in urls.items():
        print(f"{LABELS[var]:9} {var}={paths.redact(url)}")
    if urls:
        print(f"wrote {paths.STACK_ENV} ({time.monotonic() - started:.2f}s)")
    return 0


def cmd_down(_args: argparse.Namespace) -> int:
    with paths.locked():
        stopped = []
        if valkey.down():
            stopped.append("valkey")
        if postgres.down():
            stopped.append("postgres")
        paths.STACK_ENV.unlink(missing_ok=True)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def cmd_status(_args: argparse.Namespace) -> int:
    print(f"data dir  {paths.DATA_DIR}")
    print(f"postgres  {postgres.status()}")
    print(f"valkey    {valkey.status()}")
    embedded = paths.read_env_file(paths.STACK_ENV)
    for var in SERVICES:
        external = paths.external_url(var)
        if external is not None:
            print(f"{var} from {external[1]}: {paths.redact(external[0])}")
        elif var in embedded:
            print(f"{var} from {paths.STACK_ENV.name}: {paths.redact(embedded[var])}")
        else:
            print(f"{var} not set (run: python -m devstack up)")
    return 0


def cmd_env(_args: argparse.Namespace) -> int:
    embedded = paths.read_env_file(paths.STACK_ENV)
    for var in SERVICES:
        external = paths.external_url(var)
        value = external[0] if external is not None else embedded.get(var)
        if value:
            print(f"export {var}={shlex.quote(value)}")
        else:
            print(f"# {var} is not set; run: python -m devstack up", file=sys.stderr)
    return 0


def cmd_ports(args: argparse.Namespace) -> int:
    """Print one line naming a taken port (and exit 1), or nothing."""
    wanted: dict[str, int] = {}
    for item in args.ports:
        variable, _, value = item.partition("=")
        if not value.isdigit():
            print(f"make run: {variable} must be a port number, got {value!r}")
            return 1
        wanted[variable] = int(value)
    problem = ports.first_taken(args.host, wanted)
    if problem:
        print(problem)
        return 1
    return 0


def cmd_credentials_path(_args: argparse.Namespace) -> int:
    """Where bootstrap_demo leaves new credentials for the banner.

    The embedded database's credentials are kept in .data/credentials (mode 600)
    beside its data; for an external database they are a one-time hand-over in
    a private temporary file the banner deletes.
    """
    if paths.external_url("DATABASE_URL") is None:
        paths.ensure_data_dir()
        print(paths.DATA_DIR / "credentials")
    else:
        fd, name = tempfile.mkstemp(prefix="agentplatform-credentials-")
        os.close(fd)
        print(name)
    return 0


def cmd_banner(args: argparse.Namespace) -> int:
    credentials = Path(args.credentials) if args.credentials else None
    return banner.wait_and_print(args.url.rstrip("/"), credentials, args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="Embedded PostgreSQL+pgvector and Valkey for development, under .data/.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start (or reuse) the services and write .data/stack.env")
    sub.add_parser("down", help="stop the embedded services and remove .data/stack.env")
    sub.add_parser("status", help="show what is running")
    sub.add_parser("env", help="print export lines with the effective URLs")
    ports_cmd = sub.add_parser("ports", help="exit 1 with one line if a VAR=PORT is taken")
    ports_cmd.add_argument("ports", nargs="+", metavar="VAR=PORT")
    ports_cmd.add_argument("--host", default="127.0.0.1")
    sub.add_parser("credentials-path", help="where `make run` keeps the demo credentials")
    banner_cmd = sub.add_parser("banner", help="wait for /readyz, then print URLs and credentials")
    banner_cmd.add_argument(
        "--url", required=True, help="the web process, e.g. http://127.0.0.1:8000"
    )
    banner_cmd.add_argument("--credentials", default="", help="file written by bootstrap_demo")
    banner_cmd.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    handler = {
        "up": cmd_up,
        "down": cmd_down,
        "status": cmd_status,
        "env": cmd_env,
        "ports": cmd_ports,
        "credentials-path": cmd_credentials_path,
        "banner": cmd_banner,
    }
    try:
        return handler[args.command](args)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"devstack {args.command}: {exc}", file=sys.stderr)
        return 1

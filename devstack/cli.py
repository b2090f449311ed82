"""Command line: up, down, status, env."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

from devstack import paths, postgres, valkey

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
    args = parser.parse_args(argv)
    handler = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "env": cmd_env}
    try:
        return handler[args.command](args)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"devstack {args.command}: {exc}", file=sys.stderr)
        return 1

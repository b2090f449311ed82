"""The benchmark's own database and queue, set up before Django is imported.

The base URL comes from the environment, `.env` or `.data/stack.env` (the same
order the settings use); the benchmark swaps its database name for
`agentplatform_bench`, drops and recreates that database on the same server,
and points this process (and every subprocess it starts) at it.
"""

import fcntl
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data"
# Several checkouts may bench against one server: give each its own database.
BENCH_DB = os.environ.get("BENCH_DATABASE_NAME") or "agentplatform_bench"
TEMPLATE_DB = f"{BENCH_DB}_migrated"
# Set by `prepare`: the bench database is a copy of the migrated template.
_from_template = False


def _env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                key = key.removeprefix("export ").strip()
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                values[key] = value
    return values


def setting(name: str, default: str = "") -> str:
    """A URL as the settings would see it: environment, then .env, then .data/stack.env."""
    return (
        os.environ.get(name)
        or _env_file(ROOT / ".env").get(name)
        or _env_file(DATA / "stack.env").get(name)
        or default
    )


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def migrations_fingerprint() -> str:
    """What the migrated schema depends on: this checkout's migration files and the
    installed distributions (Django's and other apps' migrations come with them)."""
    from importlib import metadata

    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    versions = sorted(
        f"{dist.metadata['Name']}=={dist.version}" for dist in metadata.distributions()
    )
    digest.update("\n".join(versions).encode())
    return digest.hexdigest()[:32]


def database_recreate(base_url: str, fingerprint: str) -> tuple[str, bool]:
    """Drop and create the bench database; return its URL and whether it came migrated.

    A copy of the migrated template (`<bench db>_migrated`, kept on the server with the
    fingerprint it was migrated at as its comment) takes a fraction of a second; a full
    `migrate` takes 3-8 s on 2 cores. A stale or missing template means an empty database.
    """
    import psycopg

    admin = with_database(base_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [TEMPLATE_DB],
        ).fetchone()
        if row is not None and row[0] == fingerprint:
            try:
                conn.execute(f'CREATE DATABASE "{BENCH_DB}" TEMPLATE "{TEMPLATE_DB}"')
                return with_database(base_url, BENCH_DB), True
            except psycopg.errors.ObjectInUse:
                pass  # another checkout is copying or refreshing it: migrate instead
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return with_database(base_url, BENCH_DB), False


def template_save(fingerprint: str) -> None:
    """Keep the freshly migrated bench database as the template of the next runs."""
    import psycopg

    admin = with_database(os.environ["DATABASE_URL"], "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        try:
            conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}" TEMPLATE "{BENCH_DB}"')
            conn.execute(
                f"COMMENT ON DATABASE \"{TEMPLATE_DB}\" IS '{fingerprint}'"  # hex digits only
            )
        except psycopg.errors.ObjectInUse:
            # Another checkout uses it; the next run migrates again.
            print(f"bench: {TEMPLATE_DB} in use; not refreshed", file=sys.stderr)


@contextmanager
def exclusive() -> Iterator[None]:
    """One benchmark run at a time on this checkout (they share the bench database)."""
    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / "bench.lock", "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                "another `python -m bench` is running on this checkout (.data/bench.lock)"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def prepare(queue: str) -> tuple[dict[str, str], float]:
    """Create the database, export the environment this process and its children use.

    Returns the exported variables and the seconds the drop + create took.
    """
    global _from_template
    base = setting("DATABASE_URL")
    redis_url = setting("REDIS_URL")
    if not base or not redis_url:
        raise SystemExit(
            "DATABASE_URL / REDIS_URL not set; run `.venv/bin/python -m devstack up` (make bench does)"
        )
    started = time.perf_counter()
    url, _from_template = database_recreate(base, migrations_fingerprint())
    values = {
        "DATABASE_URL": url,
        "REDIS_URL": redis_url,
        "CELERY_QUEUE": queue,
        # Limits, breakers and socket slots of its own: other runs on this Redis
        # (another checkout's bench, the tests) count against theirs, not ours.
        "REDIS_KEY_PREFIX": queue,
        "CHANNEL_LAYER_PREFIX": queue,
        "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(values)
    return values, time.perf_counter() - started


def copied_from_template() -> bool:
    """Whether `prepare` made the bench database as a copy of the migrated template."""
    return _from_template


def django_setup() -> float:
    """django.setup() against the bench database, then migrate it; returns seconds.

    1. `migrate` runs even on a copy of the template: with nothing to apply it only
       checks, and it catches a template the fingerprint missed.
    2. A database `prepare` created empty becomes, migrated, the next runs' template.
    """
    import django
    from django.core.management import call_command

    started = time.perf_counter()
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    from django.db import connection

    connection.close()
    if not _from_template:
        # A copy needs the source without sessions: the pool's idle ones too.
        connection.close_pool()
        template_save(migrations_fingerprint())
    return time.perf_counter() - started

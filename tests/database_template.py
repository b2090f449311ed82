"""The test database, cloned from a migrated template instead of migrated again.

Migrating an empty database takes 6-15 s of CPU; `make test` needs one database per
xdist worker of each lane (five at once), and a contributor's next run needs them all
again. The first run to need it migrates a template named after a fingerprint of every
app's migration files; each test database is then `CREATE DATABASE ... TEMPLATE` of it
(a file copy, ~0.3 s). An edited or added migration changes the fingerprint, so the next
run builds a new template and drops the old ones. The template is built under a
PostgreSQL advisory lock (two runs at once build it once) under a temporary name, renamed
only once migrate has finished, so a run killed mid-migrate leaves no half-built template.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import django
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

PREFIX = "test_agentplatform_tpl_"
# pg_advisory_lock's key: the same for every checkout on one server (they share templates).
LOCK_KEY = 0x7465_7374_7470_6C00


def fingerprint() -> str:
    """Changes whenever a migration, an installed app or Django's version does."""
    digest = hashlib.sha256(django.get_version().encode())
    for app in apps.get_app_configs():
        digest.update(app.label.encode())
        for path in sorted((Path(app.path) / "migrations").glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _close(connection: BaseDatabaseWrapper) -> None:
    connection.close()
    connection.close_pool()


def _migrate_into(connection: BaseDatabaseWrapper, name: str) -> None:
    """Run every migration on the database `name` through `connection`, then let it go."""
    original = connection.settings_dict["NAME"]
    _close(connection)
    connection.settings_dict["NAME"] = name
    try:
        call_command(
            "migrate",
            verbosity=0,
            interactive=False,
            database=connection.alias,
            run_syncdb=True,
        )
    finally:
        _close(connection)
        connection.settings_dict["NAME"] = original


def create(alias: str = "default") -> str:
    """Create this run's test database for `alias` from the template; return its name.

    1. Under the advisory lock, build the template if no database has its name yet:
       create `<template>_building`, migrate it, rename it.
    2. Drop the templates of other fingerprints that nobody is using.
    3. Create the test database from the template, dropping a leftover of the same name.
    4. Point the settings and the connection at it, as Django's `create_test_db` does.
    """
    connection = connections[alias]
    test_name = connection.creation._get_test_db_name()
    template = PREFIX + fingerprint()
    quote = connection.ops.quote_name
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        try:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"])
            existing = {row[0] for row in cursor.fetchall()}
            if template not in existing:
                building = template + "_building"
                cursor.execute(f"DROP DATABASE IF EXISTS {quote(building)}")
                cursor.execute(f"CREATE DATABASE {quote(building)}")
                _migrate_into(connection, building)
                cursor.execute(f"ALTER DATABASE {quote(building)} RENAME TO {quote(template)}")
            for stale in existing - {template}:
                # One in use by a run of another checkout is dropped by a later run.
                with contextlib.suppress(DatabaseError):
                    cursor.execute(f"DROP DATABASE IF EXISTS {quote(stale)}")
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(test_name)} WITH (FORCE)")
            cursor.execute(f"CREATE DATABASE {quote(test_name)} TEMPLATE {quote(template)}")
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
    _close(connection)
    settings.DATABASES[alias]["NAME"] = test_name
    connection.settings_dict["NAME"] = test_name
    return test_name


def drop(name: str, alias: str = "default") -> None:
    """Drop the test database, closing what still holds it (a thread's forgotten connection)."""
    connection = connections[alias]
    _close(connection)
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)} WITH (FORCE)")

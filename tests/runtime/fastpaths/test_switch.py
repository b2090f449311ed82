"""runtime.fastpaths: one switch turns every fast path off; a library version a fast path
was not written for turns that one off, with a warning in the log and in `manage.py check`."""

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler

from runtime import fastpaths
from runtime.fastpaths import asgi_threads


@pytest.fixture(autouse=True)
def _fresh_version_checks() -> Iterator[None]:
    fastpaths.version_mismatch.cache_clear()
    yield
    fastpaths.version_mismatch.cache_clear()


def test_every_fast_path_is_on_with_the_installed_libraries() -> None:
    """An upgrade past a fast path's versions fails here first: check its module, then widen."""
    assert {name: fastpaths.version_mismatch(name) for name in fastpaths.FAST_PATHS} == {
        name: None for name in fastpaths.FAST_PATHS
    }
    assert all(fastpaths.enabled(name) for name in fastpaths.FAST_PATHS)
    assert fastpaths.check() == []


def test_the_setting_turns_every_fast_path_off(settings: Any) -> None:
    settings.FAST_PATHS = False
    assert not any(fastpaths.enabled(name) for name in fastpaths.FAST_PATHS)


def test_a_version_it_was_not_written_for_turns_only_that_fast_path_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    installed = fastpaths.metadata.version

    def version(distribution: str) -> str:
        return "9.0" if distribution == "djangorestframework" else installed(distribution)

    monkeypatch.setattr(fastpaths.metadata, "version", version)
    with caplog.at_level(logging.WARNING, logger="runtime.fastpaths"):
        assert not fastpaths.enabled("drf_fields")
        assert not fastpaths.enabled("drf_fields")
    assert all(fastpaths.enabled(name) for name in fastpaths.FAST_PATHS if name != "drf_fields")
    # Said once, with what is installed and what it was written for.
    assert [r.getMessage() for r in caplog.records] == [
        "fast path drf_fields is off: djangorestframework 9.0 is installed; it was written for "
        ">=3.15,<3.19"
    ]
    [warning] = fastpaths.check()
    assert warning.id == "runtime.W001" and "'drf_fields' is off" in warning.msg


def test_a_library_not_installed_turns_its_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(distribution: str) -> str:
        raise fastpaths.metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(fastpaths.metadata, "version", version)
    assert "daphne not installed" in (fastpaths.version_mismatch("daphne_frames") or "")
    assert not fastpaths.enabled("daphne_frames")


def test_off_daphne_serves_djangos_own_asgi_handler(settings: Any) -> None:
    assert type(asgi_threads.http_application()) is asgi_threads.SyncChainASGIHandler
    settings.FAST_PATHS = False
    # Django's own: a deferred response settles in the first middleware (public API).
    off = asgi_threads.http_application()
    assert type(off) is ASGIHandler

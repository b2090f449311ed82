"""/readyz reports the sweeper: unready, with the reason, when no sweep completed recently."""

import time

import pytest
from django.test import Client

from sessions.api import health
from sessions.sweep_status import _client, _key, sweep_mark_completed


@pytest.fixture
def no_sweep_recorded(settings):
    _client(settings.REDIS_URL).delete(_key())
    yield
    _client(settings.REDIS_URL).delete(_key())


def test_sweeper_check_fails_when_no_sweep_ever_completed(no_sweep_recorded):
    reason = health._check_sweeper()
    assert reason is not None and "no sweep has completed" in reason


def test_sweeper_check_fails_when_the_last_sweep_is_too_old(no_sweep_recorded, settings):
    settings.SWEEPER_STALE_S = 5.0
    sweep_mark_completed(at=time.time() - 42)
    reason = health._check_sweeper()
    assert reason is not None and "42 s ago" in reason and "limit 5 s" in reason


def test_sweeper_check_passes_after_a_recent_sweep(no_sweep_recorded, settings):
    settings.SWEEPER_STALE_S = 5.0
    sweep_mark_completed(at=time.time() - 1)
    assert health._check_sweeper() is None


@pytest.mark.django_db
def test_readyz_is_503_and_names_the_sweeper_when_it_is_stale(no_sweep_recorded):
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert "no sweep has completed" in body["checks"]["sweeper"]
    assert body["checks"]["database"] == "ok" and body["checks"]["redis"] == "ok"


def test_healthz_does_not_depend_on_the_sweeper(no_sweep_recorded):
    assert Client().get("/healthz").status_code == 200

"""The sweep's records in Redis: the slot that lets several beats share one sweep per interval."""

import pytest
import redis
from django.conf import settings

from sessions import sweep_status


@pytest.fixture
def no_slot() -> None:
    sweep_status._client(settings.REDIS_URL).delete(sweep_status._slot_key())


def test_the_first_sweep_of_an_interval_takes_the_slot_for_most_of_it(no_slot) -> None:
    assert sweep_status.sweep_slot_take(interval_s=10.0) is True
    assert sweep_status.sweep_slot_take(interval_s=10.0) is False
    ttl_ms = sweep_status._client(settings.REDIS_URL).pttl(sweep_status._slot_key())
    assert 7_000 < ttl_ms <= 8_000


def test_without_redis_every_sweep_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    class Down:
        def set(self, *args: object, **kwargs: object) -> None:
            raise redis.ConnectionError("down")

    monkeypatch.setattr(sweep_status, "_client", lambda url: Down())
    assert sweep_status.sweep_slot_take(interval_s=0.5) is True
    assert sweep_status.sweep_slot_take(interval_s=0.5) is True

import uuid

import pytest


@pytest.fixture
def own_redis_prefix(settings):  # type: ignore[no-untyped-def]
    """Counters of this test alone: every test calls from 127.0.0.1."""
    settings.REDIS_KEY_PREFIX = f"test-accounts-{uuid.uuid4().hex}"
    return settings

"""sessions.services.idempotency: a key's first request runs once; a retry racing with it
waits for its commit and gets its response; a refused request keeps nothing; old records
are pruned."""

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from record.errors import Conflict, InvalidInput
from record.models import RequestKey
from sessions.services import (
    KeyedRequest,
    request_fingerprint,
    request_key_parse,
    request_keyed_respond,
    request_keys_prune,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

KEY = KeyedRequest(key="k-1", fingerprint=request_fingerprint("POST", "/x/", {"a": 1}))


@pytest.fixture
def owner() -> User:
    user: User = UserFactory(username="ada")  # type: ignore[assignment]
    return user


def test_the_fingerprint_is_the_request_whatever_its_keys_order() -> None:
    assert request_fingerprint("POST", "/x/", {"a": 1, "b": [1, 2]}) == request_fingerprint(
        "POST", "/x/", {"b": [1, 2], "a": 1}
    )
    assert request_fingerprint("POST", "/x/", {"a": 1}) != request_fingerprint(
        "POST", "/y/", {"a": 1}
    )


def test_a_key_is_the_header_or_the_body_field_and_never_two() -> None:
    assert request_key_parse(" h ", None) == "h"
    assert request_key_parse(None, "b") == "b"
    assert request_key_parse("same", "same") == "same"
    assert request_key_parse(None, None) is None
    for raw, body in (("h", "b"), ("has space", None), ("é", None), ("x" * 201, None)):
        with pytest.raises(InvalidInput):
            request_key_parse(raw, body)


def test_a_retry_racing_with_the_first_request_waits_for_it_and_gets_its_response(
    owner: User,
) -> None:
    runs: list[int] = []
    inside = threading.Event()
    release = threading.Event()
    answers: dict[str, Any] = {}

    def first() -> tuple[int, Any]:
        runs.append(1)
        inside.set()
        release.wait(10)
        return 202, {"id": "m-1"}

    def call(name: str) -> None:
        try:
            answers[name] = request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=first)
        finally:
            connection.close()

    a = threading.Thread(target=call, args=("a",))
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=call, args=("b",))
    b.start()
    b.join(1.0)
    assert b.is_alive()  # waits on the key while the first request runs
    release.set()
    a.join(10)
    b.join(10)
    assert runs == [1]
    assert (answers["a"].replayed, answers["b"].replayed) == (False, True)
    assert answers["b"].body == {"id": "m-1"} and answers["b"].status == 202


def test_a_refused_request_keeps_nothing_and_another_body_is_409(owner: User) -> None:
    def refuse() -> tuple[int, Any]:
        raise InvalidInput("no")

    with pytest.raises(InvalidInput):
        request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=refuse)
    assert not RequestKey.objects.exists()
    request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=lambda: (201, {"id": 1}))
    other = KeyedRequest(key="k-1", fingerprint="0" * 64)
    with pytest.raises(Conflict) as reused:
        request_keyed_respond(owner_id=owner.pk, keyed=other, run=lambda: (201, {"id": 2}))
    assert reused.value.code == "idempotency_key_reused"


def test_a_key_is_kept_its_ttl_then_free_and_pruned(owner: User, settings) -> None:  # type: ignore[no-untyped-def]
    settings.IDEMPOTENCY_KEY_TTL_S = 60
    request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=lambda: (201, {"id": 1}))
    kept = request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=lambda: (201, {"id": 2}))
    assert (kept.replayed, kept.body) == (True, {"id": 1})
    RequestKey.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    other = KeyedRequest(key="k-2", fingerprint="0" * 64)
    request_keyed_respond(owner_id=owner.pk, keyed=other, run=lambda: (201, {"id": 3}))
    # A key derived for a client library's retries serves an hour at most.
    derived = KeyedRequest(key="retry:abc", fingerprint="1" * 64, window_s=10**6)
    request_keyed_respond(owner_id=owner.pk, keyed=derived, run=lambda: (200, {}))
    RequestKey.objects.filter(key="retry:abc").update(
        created_at=timezone.now() - timedelta(seconds=3601)
    )
    assert request_keys_prune(older_than_s=86400) == 1  # the derived one; k-1 is 61 s old
    assert request_keys_prune() == 1
    assert list(RequestKey.objects.values_list("key", flat=True)) == ["k-2"]
    fresh = request_keyed_respond(owner_id=owner.pk, keyed=KEY, run=lambda: (201, {"id": 4}))
    assert (fresh.replayed, fresh.body) == (False, {"id": 4})

"""Credit pools: billing_pool_grant, billing_pool_dispatch and the release, on PostgreSQL."""

import threading
import uuid

import pytest
from django.db import connection, transaction

from billing.models import CreditPool, PoolRequest, PoolRequestStatus
from billing.selectors import pools_waiting
from billing.services import (
    PoolGrant,
    pool_dispatch,
    pool_grant_of,
    pool_grant_statement,
    pool_release_statement,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def grant(owner, key, *, value=1.0, cost=10, session=None) -> PoolGrant:
    with connection.cursor() as cursor:
        cursor.execute(
            *pool_grant_statement(
                owner_id=owner.pk,
                key=key,
                session_id=session or uuid.uuid4(),
                action="issue_coupon",
                value=value,
                cost=cost,
            )
        )
        return pool_grant_of(cursor.fetchone())


def release(session) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*pool_release_statement(session_id=session))


def in_use(pool: CreditPool) -> int:
    pool.refresh_from_db()
    return pool.in_use


def test_no_pool_leaves_a_call_unpooled_and_writes_nothing():
    assert grant(UserFactory(), "k").outcome == "unpooled"
    assert not PoolRequest.objects.exists()


def test_requests_are_granted_while_they_fit_then_wait_and_a_release_lets_the_best_in():
    owner = UserFactory()
    pool = CreditPool.objects.create(name="global", size=100)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert grant(owner, "a", cost=60, value=60, session=first).outcome == "granted"
    assert grant(owner, "b", cost=30, value=36, session=second).outcome == "granted"
    assert in_use(pool) == 90
    low, high, tie = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert grant(owner, "low", cost=50, value=40, session=low).outcome == "wait"  # ROI 0.8
    assert grant(owner, "high", cost=50, value=60, session=high).outcome == "wait"  # ROI 1.2
    assert grant(owner, "tie", cost=50, value=60, session=tie).outcome == "wait"  # 1.2, later
    # A small request that would fit still waits behind the better ones queued.
    assert grant(owner, "small", cost=5, value=1).outcome == "wait"

    release(first)  # 60 back: 30 in use
    assert pool_dispatch(pool_id=pool.pk) == [str(high)]  # 1.2 first; the tie arrived later
    assert in_use(pool) == 80
    release(second)  # 50 in use: the tie's 50 fit, and nothing after it
    assert pool_dispatch(pool_id=pool.pk) == [str(tie)]
    release(high)
    assert pool_dispatch(pool_id=pool.pk) == [str(low)]  # the small one still queues behind it
    assert in_use(pool) == 100
    release(tie)
    assert pool_dispatch(pool_id=pool.pk) == [str(PoolRequest.objects.get(key="small").session_id)]
    assert in_use(pool) == 55
    # A step run again finds its grant by key and takes nothing more.
    assert grant(owner, "low", cost=50, value=40, session=low).outcome == "granted"
    assert in_use(pool) == 55
    assert pools_waiting() == []


def test_a_tenants_own_pool_is_used_before_the_global_one():
    tenant, other = UserFactory(), UserFactory()
    own = CreditPool.objects.create(name="acme", owner=tenant, size=10)
    shared = CreditPool.objects.create(name="global", size=10)
    assert grant(tenant, "t").pool_id == own.pk
    assert grant(other, "o").pool_id == shared.pk


def test_a_request_larger_than_the_pool_is_refused_not_queued_forever():
    owner = UserFactory()
    CreditPool.objects.create(name="global", size=10)
    assert grant(owner, "big", cost=11).outcome == "too_big"
    assert grant(owner, "ok", cost=10).outcome == "granted"


def test_a_smaller_size_refuses_the_waiters_it_can_never_fit_and_a_disabled_pool_lets_go():
    owner = UserFactory()
    pool = CreditPool.objects.create(name="global", size=100)
    grant(owner, "holder", cost=100)
    grant(owner, "big", cost=80)
    grant(owner, "small", cost=20)
    pool.size = 50
    pool.save()
    assert pool_dispatch(pool_id=pool.pk) == []
    assert PoolRequest.objects.get(key="big").status == PoolRequestStatus.REFUSED
    pool.enabled = False
    pool.save()
    assert len(pool_dispatch(pool_id=pool.pk)) == 1
    assert PoolRequest.objects.get(key="small").status == PoolRequestStatus.GRANTED


def test_an_edit_of_the_pool_never_writes_its_level_back():
    owner = UserFactory()
    pool = CreditPool.objects.create(name="global", size=100)
    stale = CreditPool.objects.get(pk=pool.pk)
    grant(owner, "a", cost=40)
    stale.size = 120
    stale.save()  # an admin's form loaded before the grant
    assert in_use(pool) == 40


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_never_grant_past_the_size():
    """Twelve connections ask at once for 10 points of a 50-point pool: five are granted,
    seven wait, and the pool's level is exactly what was granted."""
    owner = UserFactory()
    pool = CreditPool.objects.create(name="global", size=50)
    start = threading.Barrier(12)
    outcomes: list[str] = []

    def one(n: int) -> None:
        try:
            start.wait()
            outcomes.append(grant(owner, f"k{n}", cost=10, value=float(n)).outcome)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["granted"] * 5 + ["wait"] * 7
    assert in_use(pool) == 50
    granted = PoolRequest.objects.filter(status=PoolRequestStatus.GRANTED)
    assert sum(granted.values_list("cost", flat=True)) == 50
    # Released all at once, concurrently dispatched: the waiters go in ROI order, 50 at most.
    for request in granted:
        release(request.session_id)
    waiting = list(
        PoolRequest.objects.filter(status=PoolRequestStatus.WAITING)
        .order_by("-roi", "id")
        .values_list("session_id", flat=True)
    )
    woken: list[str] = []
    start = threading.Barrier(4)

    def dispatch() -> None:
        try:
            start.wait()
            woken.extend(pool_dispatch(pool_id=pool.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(woken) == sorted(str(s) for s in waiting[:5])
    assert in_use(pool) == 50

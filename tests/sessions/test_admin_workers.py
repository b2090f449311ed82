"""The admin's Workers page: live workers' heartbeats, why a paused one is paused, the
thresholds and the step pacing; read-only, for staff with the view permission."""

import time

import pytest
from django.contrib.auth import get_user_model

from runtime import health

pytestmark = pytest.mark.django_db

PAGE = "/admin/agent_sessions/workerhealth/"


@pytest.fixture(autouse=True)
def _clean():  # type: ignore[no-untyped-def]
    yield
    client = health._redis()
    for key in client.scan_iter(f"{health._prefix()}:*"):
        client.delete(key)


def _report(name: str, **fields):  # type: ignore[no-untyped-def]
    base = {
        "name": name, "pid": 4242, "at": time.time(), "inflight": 7, "steps": 120,
        "step_p50_s": 0.2, "step_p95_s": 1.5, "error_rate": 0.05, "model_p95_s": 1.2,
        "cpu_percent": 88.0, "rss_mb": 300.0, "accepting": True, "reasons": [],
    }  # fmt: skip
    return health.Report(**{**base, **fields})


def test_the_page_lists_workers_their_health_and_the_pacing(client):  # type: ignore[no-untyped-def]
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    health.report_publish(_report("fine@host"), ttl_s=30)
    health.report_publish(
        _report("sick@host", accepting=False, reasons=["step p95 9.00 s > 5 s"]), ttl_s=30
    )
    health.pacing_publish(
        health.Pacing(0.5, 350.0, 1.2, ["database round trip 350 ms > 200 ms"]), 30
    )

    html = client.get(PAGE).content.decode()

    assert "2 live workers, 1 taking no new runs" in html
    assert "fine@host" in html and "sick@host" in html
    assert "step p95 9.00 s &gt; 5 s" in html
    assert "0.5 s between steps" in html and "database round trip 350 ms" in html
    assert "88%" in html and "300 MB" in html and "0.200 / 1.500" in html
    # Read-only: no add link, no change form behind a row.
    assert "/add/" not in html.split('id="workers"')[1]


def test_no_worker_and_no_pacing_are_said_plainly(client):  # type: ignore[no-untyped-def]
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    html = client.get(PAGE).content.decode()
    assert "No worker has reported" in html
    assert "not published (is the sweeper running?)" in html


def test_staff_without_the_view_permission_cannot_see_it(client):  # type: ignore[no-untyped-def]
    client.force_login(get_user_model().objects.create_user("bob", password="pw", is_staff=True))
    assert client.get(PAGE).status_code == 403

"""`python -m bench.admin_home`: the admin home ("what is wrong") rendered with 100,000
sessions (target ≤ 300 ms, issue 46), as a superuser (the whole platform) and as a tenant's
staff user (their own sessions).

Not part of `make bench`'s full run (it has no place in its table yet): a figure, not a
timed test. On the bench database (recreated, so do not run it while `make bench` runs):
N sessions (default 100,000) of 200 owners, copied from one real session by one INSERT ...
SELECT, mostly ended well, 1 % running, 0.5 % waiting for approval, 6 % of the last turns
not ok, updated over the last 3 days (a third in the home's 24 h window); 300 pending
approvals; today's spend for 200 owners with day budgets.
Each page is fetched through Django's test client (the whole request: middleware, the
home's queries, the template), warmed up, then timed `-n` times: p50 / p95 / max wall ms;
and the home's reads alone (`sessions.selectors.home_figures`).
"""

import argparse
import json
import statistics
import time
from typing import Any

from . import environment, fixtures

# A day as an operator meets it: most sessions ended well long ago; 1 % running, 0.5 %
# waiting for approval, 1 % in error; 6 % of the ended turns not ok.
STATE_SQL = (
    "CASE WHEN mod(g, 100) = 0 THEN 'processing' WHEN mod(g, 200) = 1 THEN 'awaiting_approval' "
    "WHEN mod(g, 100) = 2 THEN 'error' WHEN mod(g, 10) = 3 THEN 'idle' ELSE 'finished' END"
)
OUTCOME_SQL = (
    "CASE WHEN mod(g, 50) = 0 THEN 'error' WHEN mod(g, 50) = 1 THEN 'stopped' "
    "WHEN mod(g, 50) = 2 THEN 'tool_failures' ELSE 'ok' END"
)
OWNERS = 200


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admin_home", description=__doc__)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("-n", type=int, default=30, help="timed renders per user (default 30)")
    args = parser.parse_args(argv)
    with environment.exclusive():
        environment.prepare(f"bench-home-{time.time_ns()}")
        environment.django_setup()
        fixtures.install()
        result = _run(args.sessions, args.n)
        out = environment.ROOT / "bench" / "results" / "admin-home-latest.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"wrote {out}")
    return 0


def _seed(count: int) -> Any:
    """`count` sessions of OWNERS owners, pending approvals, today's spend and budgets."""
    from datetime import timedelta
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from approvals.models import Approval
    from billing.models import OwnerBudget, SpendDaily
    from billing.notices import billing_today
    from record.models import Session

    users = get_user_model()
    # No password to hash (200 hashes would take a minute): the bench logs in by session.
    owners = users.objects.bulk_create(
        users(username=f"tenant{i}", password="!", is_staff=True) for i in range(OWNERS)
    )
    template = fixtures.sessions_create("bench-demo", 1)[0]
    table = Session._meta.db_table
    varied = {
        "id": "gen_random_uuid()",
        "owner_id": f"(ARRAY[{','.join(str(o.pk) for o in owners)}])[1 + mod(g, {OWNERS})]",
        "state": STATE_SQL,
        "last_turn_outcome": OUTCOME_SQL,
        "last_turn_number": "1",
        "turn": "1",
        "updated_at": "now() - make_interval(secs => mod(g, 259200))",
        "created_at": "now() - make_interval(secs => mod(g, 259200) + 60)",
        "lease_owner": "NULL",
        "lease_expires_at": "NULL",
    }
    columns = [f.column for f in Session._meta.concrete_fields]
    select = ", ".join(varied.get(c, f'"{c}"') for c in columns)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" ({", ".join(f"{chr(34)}{c}{chr(34)}" for c in columns)}) '  # nosec B608
            f'SELECT {select} FROM "{table}" t, generate_series(1, %s) g WHERE t.id = %s',
            [count - 1, template.pk],
        )
    with connection.cursor() as cursor:
        # As autovacuum leaves a table that has settled: statistics and the visibility map.
        cursor.execute(f'VACUUM ANALYZE "{table}"')  # nosec B608
    seeded_s = time.perf_counter() - started
    sessions = list(Session.objects.order_by("-updated_at").values_list("pk", flat=True)[:300])
    now = timezone.now()
    Approval.objects.bulk_create(
        Approval(
            session_id=pk,
            tool_name="refund",
            arguments={},
            deadline=now + timedelta(hours=1),
        )
        for pk in sessions
    )
    today = billing_today()
    SpendDaily.objects.bulk_create(
        SpendDaily(owner=o, day=today, agent_id=template.agent_id, endpoint="rules",
                   cost=Decimal(i % 10))
        for i, o in enumerate(owners)
    )  # fmt: skip
    OwnerBudget.objects.bulk_create(OwnerBudget(owner=o, day_cost=Decimal(10)) for o in owners)
    return owners[0], seeded_s


def _run(count: int, n: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from record.models import Session

    tenant, seeded_s = _seed(count)
    tenant.user_permissions.add(*_view_permissions())
    root = get_user_model().objects.create_user("root", is_staff=True, is_superuser=True)
    figures: dict[str, Any] = {
        "sessions": Session.objects.count(),
        "seeded_s": round(seeded_s, 2),
    }
    from sessions.selectors import home_figures

    # The home's reads alone (no middleware, no template): what the data costs.
    for name, owner_id in (("reads, superuser", None), ("reads, tenant staff", tenant.pk)):
        times = []
        for _ in range(n):
            started = time.perf_counter()
            home_figures(owner_id=owner_id)
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        figures[name] = {
            "p50_ms": round(statistics.median(times), 1),
            "max_ms": round(times[-1], 1),
        }
    for name, user in (("superuser", root), ("tenant staff", tenant)):
        client = Client(HTTP_HOST="127.0.0.1")  # a host ALLOWED_HOSTS lets in
        client.force_login(user)
        for _ in range(3):
            assert client.get("/admin/").status_code == 200
        times = []
        for _ in range(n):
            started = time.perf_counter()
            response = client.get("/admin/")
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        times.sort()
        figures[name] = {
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
            "max_ms": round(times[-1], 1),
            "target_ms": 300,
        }
    return figures


def _view_permissions() -> list[Any]:
    from django.contrib.auth.models import Permission

    return list(
        Permission.objects.filter(
            codename__in=["view_session", "view_approval", "view_ownerbudget", "view_workerhealth"]
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost rankings equal a brute-force SQL sum over the raw model calls; the admin pages
(table, chart, CSV, grant and adjust) work through the services."""

import csv
import io
import time
from collections.abc import Sequence
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from billing.models import CreditAccount, CreditLedger, SpendDaily, UsageDaily
from billing.rankings import METRICS, SPEND_METRICS, cost_rankings
from engine import session_run
from record.models import ModelCall, ModelEndpoint, Session
from sessions.services import message_post
from tests.factories import AgentFactory, SessionFactory, UserFactory, api_key_for

pytestmark = pytest.mark.django_db(transaction=True)


def _brute_force(key: str) -> dict[str, Decimal]:
    """Sum every model call's cost straight from the raw rows."""
    expr = {
        "user": "s.owner_id::text",
        "agent": "s.agent_id::text",
        "day": "((m.created_at AT TIME ZONE %s)::date)::text",
        "model": "m.endpoint_name",
        "key": "coalesce(s.api_key_id, 0)::text",
    }[key]
    params = [str(settings.BILLING_TIME_ZONE)] if key == "day" else []
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT {expr}, sum(m.cost) FROM "{ModelCall._meta.db_table}" m '
            f'JOIN "{Session._meta.db_table}" s ON s.id = m.session_id GROUP BY 1',
            params,
        )
        return {k: Decimal(v) for k, v in cursor.fetchall()}


@pytest.fixture
def usage() -> list[Session]:
    """Real turns for three owners on two priced agents (the engine keeps the rollups)."""
    endpoints = [
        ModelEndpoint.objects.create(
            name=f"priced-rules-{i}",
            api="rules",
            options={},
            price_input_per_1k=Decimal("0.5") * (i + 1),
            price_output_per_1k=Decimal("1.5"),
        )
        for i in range(2)
    ]
    agents = [
        AgentFactory(
            slug=f"rank-{i}", model=endpoints[i], rules=[{"answer": "word " * (5 + 20 * i)}]
        )
        for i in range(2)
    ]
    sessions = []
    for n, name in enumerate(["ann", "bob", "cy"]):
        owner = UserFactory(username=name)
        # ann's and cy's sessions are opened with a key of theirs, bob's with none.
        key_id = None
        if name != "bob":
            api_key_for(name)
            key_id = owner.api_keys.get().pk
        for agent in agents[: 1 + n % 2]:
            session = SessionFactory(owner=owner, agent=agent, api_key_id=key_id)
            for turn in range(n + 1):
                message_post(session=session, content=f"question {turn} " * (n + 1))
            started = time.monotonic()
            assert session_run(session_id=session.pk).stopped == "idle"
            assert time.monotonic() - started < 20
            sessions.append(session)
    return sessions


@pytest.mark.parametrize("group", ["user", "agent", "day", "model", "key"])
def test_rankings_equal_a_brute_force_sum_over_the_raw_calls(usage, group) -> None:  # type: ignore[no-untyped-def]
    today = timezone.localdate()
    rows = cost_rankings(group=group, start=today.replace(day=1), end=today, order="-cost")
    expected = _brute_force(group)
    assert {r.key: r.cost for r in rows} == expected
    assert [r.cost for r in rows] == sorted(expected.values(), reverse=True)
    assert sum(r.model_calls for r in rows) == ModelCall.objects.count()


def test_session_rankings_follow_the_sessions_totals(usage) -> None:  # type: ignore[no-untyped-def]
    today = timezone.localdate()
    rows = cost_rankings(group="session", start=today, end=today, order="input_tokens")
    totals = {str(s.pk): s.input_tokens for s in Session.objects.all()}
    assert [r.input_tokens for r in rows] == sorted(totals.values())
    assert {r.key for r in rows} == set(totals)


def test_the_rankings_page_has_a_sortable_table_a_chart_and_csv(usage, admin_client) -> None:  # type: ignore[no-untyped-def]
    Session.objects.filter(owner__username="bob").update(degradation_level=2)
    page = admin_client.get("/admin/billing/usagedaily/", {"group": "user", "o": "-cost"})
    assert page.status_code == 200
    html = page.content.decode()
    # The ranking's own chart (the page also draws the spend per day above it).
    chart = html[html.index('id="rankings-chart"') : html.index('id="rankings"')]
    assert "<svg" in chart and chart.count("<rect") == 3
    assert 'id="rankings"' in html and "o=-input_tokens" in html
    # Headings read as words, the sort keys stay field names.
    assert ">input tokens</a>" in html and ">input_tokens<" not in html
    # The current degradation level per owner: bob's sessions run at level 2.
    bob = html.index(">bob</a></td>")
    assert html.index('class="degradation-level">2<', bob) < html.index("</tr>", bob)
    # The top row is the owner the brute force says spent most.
    top = max(_brute_force("user").items(), key=lambda kv: kv[1])[0]
    name = Session.objects.filter(owner_id=int(top)).first().owner.username
    assert html.index(f">{name}</a></td>") < min(
        html.index(f">{n}</a></td>") for n in {"ann", "bob", "cy"} - {name}
    )

    exported = admin_client.get("/admin/billing/usagedaily/", {"group": "agent", "format": "csv"})
    assert exported["Content-Type"] == "text/csv"
    lines = list(csv.reader(io.StringIO(exported.content.decode())))
    assert lines[0][:3] == ["agent", "key", "cost"]
    assert {(line[1], Decimal(line[2])) for line in lines[1:]} == set(_brute_force("agent").items())


def test_grant_and_adjust_from_the_admin_go_through_the_ledger(admin_client) -> None:  # type: ignore[no-untyped-def]
    owner = UserFactory(username="dora")
    account = CreditAccount.objects.create(owner=owner)
    url = f"/admin/billing/creditaccount/{account.pk}/"
    assert (
        admin_client.post(url + "points/grant/", {"points": 100, "daily_cap": 30}).status_code
        == 302
    )
    assert (
        admin_client.post(url + "points/adjust/", {"points": -40, "note": "refund"}).status_code
        == 302
    )
    # An adjustment below zero is refused with the reason, and changes nothing.
    refused = admin_client.post(url + "points/adjust/", {"points": -500})
    assert refused.status_code == 200 and b"errorlist" in refused.content
    account.refresh_from_db()
    assert (account.balance, account.daily_cap) == (60, 30)
    ledger = list(CreditLedger.objects.filter(account=account).order_by("id"))
    assert [(e.kind, e.delta) for e in ledger] == [("grant", 100), ("adjust", -40)]
    assert all(e.actor == "admin:admin" for e in ledger)
    assert sum(e.delta for e in ledger) == account.balance
    page = admin_client.get(url + "change/")
    assert page.status_code == 200 and b"refund" in page.content
    # Titled by whose credits they are (not "credits of <id>: <balance>"), dates in one format.
    html = page.content.decode()
    assert "<h1>Credits of dora</h1>" in html
    assert "<title>Credits of dora |" in html and f"credits of {owner.pk}" not in html
    stamp = timezone.localtime(ledger[0].created_at).strftime("%Y-%m-%d %H:%M:%S")
    assert stamp in html  # the ledger's times, as every admin page writes them
    listing = admin_client.get("/admin/billing/creditaccount/").content.decode()
    assert "dora" in listing and "a.m." not in listing and "p.m." not in listing


@pytest.mark.parametrize("group", ["user", "agent", "day"])
def test_the_top_rows_are_those_of_a_full_sum_for_any_period_metric_and_direction(group) -> None:  # type: ignore[no-untyped-def]
    """Rollups with ties: the two-pass query (top keys by one sum, then all sums of those)
    picks and orders exactly the rows a sort of the full sums would, ties by key."""
    owners = [UserFactory() for _ in range(6)]
    agents = [AgentFactory(slug=f"tie-{i}") for i in range(3)]
    today = timezone.localdate()
    rows = []
    for i, owner in enumerate(owners):
        for j, agent in enumerate(agents):
            for d in range(0, 40, 1 + (i + j) % 3):
                n = (i * 7 + j * 3 + d) % 4  # small values: many equal sums
                rows.append(
                    UsageDaily(
                        owner=owner, agent=agent, day=today - timedelta(days=d),
                        input_tokens=n * 10, output_tokens=(n % 2) * 5,
                        cost=Decimal(n) / 1000, model_calls=n, tool_calls=n % 3,
                        credits_spent=n * 2,
                    )
                )  # fmt: skip
    UsageDaily.objects.bulk_create(rows)
    key = {"user": "owner_id", "agent": "agent_id", "day": "day"}[group]
    _assert_rankings_are_full_sorts(rows, group=group, key=key, metrics=METRICS, today=today)


def test_the_top_keys_are_those_of_a_full_sum_for_any_period_metric_and_direction() -> None:
    """Spend rollups with ties: the key ranking's two passes pick and order exactly the rows a sort of the full sums would."""
    owners = [UserFactory() for _ in range(3)]
    today = timezone.localdate()
    rows = []
    for key in range(8):
        for d in range(0, 40, 1 + key % 3):
            for endpoint in ("large", "small"):
                n = (key * 7 + d + len(endpoint)) % 4  # small values: many equal sums
                rows.append(
                    SpendDaily(
                        owner=owners[key % 3], day=today - timedelta(days=d), agent_id=1,
                        endpoint=endpoint, api_key_id=key, input_tokens=n * 10,
                        output_tokens=(n % 2) * 5, cost=Decimal(n) / 1000, model_calls=n,
                    )
                )  # fmt: skip
    SpendDaily.objects.bulk_create(rows)
    _assert_rankings_are_full_sorts(
        rows, group="key", key="api_key_id", metrics=SPEND_METRICS, today=today
    )


def _assert_rankings_are_full_sorts(
    rows: Sequence[UsageDaily | SpendDaily],
    *,
    group: str,
    key: str,
    metrics: Sequence[str],
    today: date,
) -> None:
    """For two periods, every metric and both directions: the top 4 of `cost_rankings`
    are those of a sort of the rows' full sums by `key` (ties by key), with those sums."""
    for start, end in [(today - timedelta(days=33), today - timedelta(days=3)), (today, today)]:
        sums: dict[object, dict[str, Decimal]] = {}
        for row in rows:
            if start <= row.day <= end:
                bucket = sums.setdefault(getattr(row, key), dict.fromkeys(metrics, Decimal(0)))
                for metric in metrics:
                    bucket[metric] += getattr(row, metric)
        for metric in metrics:
            for descending in (True, False):
                order = f"-{metric}" if descending else metric
                got = cost_rankings(group=group, start=start, end=end, order=order, limit=4)
                ranked = sorted(
                    sums,
                    key=lambda k: (-sums[k][metric] if descending else sums[k][metric], k),  # noqa: B023
                )[:4]
                assert [r.key for r in got] == [str(k) for k in ranked], (start, end, order)
                assert [r.value(metric) for r in got] == [sums[k][metric] for k in ranked]


def test_the_csv_export_writes_formula_like_names_as_text(admin_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = ModelEndpoint.objects.create(
        name="priced-csv", api="rules", options={}, price_input_per_1k=Decimal("0.5")
    )
    agent = AgentFactory(slug="csv-agent", model=endpoint, rules=[{"answer": "some words"}])
    names = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2", "@SUM(A1)", "plain"]
    for name in names:
        session = SessionFactory(owner=UserFactory(username=name), agent=agent)
        message_post(session=session, content="hello")
        session_run(session_id=session.pk)
    exported = admin_client.get("/admin/billing/usagedaily/", {"group": "user", "format": "csv"})
    cells = {line[0] for line in csv.reader(io.StringIO(exported.content.decode()))}
    assert {"'" + n for n in names[:4]} | {"plain"} <= cells, cells
    assert not any(cell[:1] in "=+-@" for cell in cells if cell), cells

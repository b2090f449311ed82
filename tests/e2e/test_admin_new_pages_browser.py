"""The last round's admin pages in Chromium at 1400 px, as each role, on busy data of another
tenant: an evaluation's report (long JSON, long answers) fits the screen and links to its
sessions; session ↔ evaluation and schedule ↔ run ↔ webhook delivery link both ways; the
deliveries' list keeps the status on screen; a tenant's staff sees no other tenant's
evaluation and cannot replay its sessions; the rollout override shows to superusers only.

Set ADMIN_SHOTS_DIR (e.g. /tmp/new-pages) to keep the screenshots.
"""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from accounts.services import approver_grant
from billing.models import CreditPool, PoolRequest
from evaluations.models import Evaluation, EvaluationTurn
from hooks.models import Schedule, ScheduleFire, WebhookDelivery
from record.models import ModelEndpoint
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import AgentFactory, EvaluationFactory, ModelEndpointFactory, SessionFactory

PASSWORD = "new-pages-pw"
VIEWS = ("view_evaluation", "view_schedule", "view_webhookdelivery", "view_creditpool",
         "view_poolrequest", "view_session", "view_agent", "view_approval")  # fmt: skip

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not HAVE_BROWSER,
        reason=f"needs the playwright package and Chromium at {CHROMIUM} "
        "(apt-get install chromium; `playwright install` is not used)",
    ),
]

LONG_ARGS = {
    "order_number": "SO-1004",
    "reason": "the parcel arrived crushed and the customer wants " * 6,
    "items": [{"sku": f"SKU-{i:05d}-LONG-PRODUCT-CODE", "qty": i} for i in range(12)],
}


def _busy_tenant() -> dict[str, Any]:
    """Alice's tenant: sessions, an evaluation with long turns, a schedule whose fires
    started runs with webhook deliveries (long URLs, long errors), a credit pool's queue."""
    users = get_user_model()
    alice = users.objects.create_user("alice-of-a-tenant-with-a-rather-long-username")
    rules = ModelEndpointFactory(name="rules", api="rules", options={})
    candidate = ModelEndpoint.objects.create(name="candidate-endpoint", api="rules", options={})
    agent = AgentFactory(
        slug="order-support-agent-with-a-very-long-slug-for-layout-checks", model=rules,
        candidate_model=candidate, candidate_percent=10,
        rollout_gate={"trajectory_match": ">= 0.9", "outcome_match": ">= 0.95"},
    )  # fmt: skip
    sessions = [SessionFactory(owner=alice, agent=agent) for _ in range(12)]
    evaluation = EvaluationFactory(owner=alice, agent=agent, candidate={"model": candidate.name})
    evaluation.sessions.set(sessions[:6])
    calls = [
        {"tool": "query_orders", "arguments": LONG_ARGS},
        {"tool": "notify_customer", "arguments": {"message": "x" * 400}},
    ]
    for n, session in enumerate(sessions[:6]):
        same = n % 2 == 1
        EvaluationTurn.objects.create(
            evaluation=evaluation, session=session, turn=1, trajectory_match=same,
            outcome_match=same, answer_similarity=1.0 if same else 0.3,
            baseline={"calls": calls, "outcome": "ok", "answer": "Refund issued. " * 60},
            candidate={"calls": calls if same else calls[:1], "outcome": "ok" if same else "tool_failures",
                       "answer": "Refund issued. " * 60 if same else "Which order? " * 80,
                       "would_have_called": [] if same else [{"tool": "refund", "arguments": LONG_ARGS}]},
        )  # fmt: skip
    now = timezone.now()
    schedule = Schedule.objects.create(
        name="nightly-report-for-the-logistics-team-eu-west", cron="15 2 * * 1-5",
        agent=agent.slug, message="write the report", owner=alice,
        webhook_url="https://hooks.example.com/services/" + "y" * 150, next_due_at=now,
    )  # fmt: skip
    for n, session in enumerate(sessions):
        ScheduleFire.objects.create(
            schedule=schedule, due=now - timedelta(days=n), status="started", session=session
        )
        WebhookDelivery.objects.create(
            session=session, turn=1, url="https://hooks.example.com/services/" + "y" * 150,
            finished={"outcome": "ok", "result": LONG_ARGS}, status="failing", attempts=3,
            last_error=("HTTP 503 from https://hooks.example.com/services: unavailable; " * 5)[:300],
        )  # fmt: skip
    pool = CreditPool.objects.create(
        name="shared-paid-tools-pool-for-the-logistics-department", owner=alice, size=1000
    )
    for n, session in enumerate(sessions):
        PoolRequest.objects.create(
            key=f"k{n}", pool=pool, owner=alice, session_id=session.pk, action="query_orders+notify_customer+write_report+send_long_named_tool_for_the_report",
            value=10 + n, cost=50, roi=(10 + n) / 50, status="waiting", note="waiting for room " * 5,
        )  # fmt: skip
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    viewer = users.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=VIEWS))
    tenant = users.objects.create_user("tenant", password=PASSWORD, is_staff=True)
    tenant.user_permissions.set(Permission.objects.all())
    users.objects.create_user("approver", password=PASSWORD, is_staff=True)
    approver_grant(username="approver")
    return {
        "evaluation": evaluation.pk,
        "agent": agent.pk,
        "schedule": schedule.pk,
        "differing": str(sessions[0].pk),
        "session": str(sessions[0].pk),
    }


def _login(page: Any, base: str, username: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_load_state()


def _fits(page: Any) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], (page.url, width)


def test_the_new_pages_fit_link_both_ways_and_show_each_role_only_its_own(live_stack: Any) -> None:
    data = _busy_tenant()
    base = live_stack.http
    found: dict[str, Any] = {}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})

        # The operator: the evaluations' list gives the scores room beside a long slug.
        _login(page, base, "operator")
        page.goto(f"{base}/admin/evaluations/evaluation/")
        _fits(page)
        scores = page.locator("#result_list td.field-scores").first.bounding_box()
        assert scores is not None and scores["width"] >= 200, scores
        _shot(page, "evaluations")
        # The report fits the screen, the differing turns first, linked.
        page.goto(f"{base}/admin/evaluations/evaluation/{data['evaluation']}/change/")
        _fits(page)
        report = page.locator(".eval-turns")
        box = report.bounding_box()
        assert box is not None and box["x"] + box["width"] <= WIDTH, box
        # No cell's content runs past its column (long JSON and answers wrap).
        spill = page.evaluate(
            "Array.from(document.querySelectorAll('.eval-turns td'))"
            ".filter(td => td.scrollWidth > td.clientWidth + 1).length"
        )
        assert spill == 0
        marks = page.locator(".eval-turns tr.eval-turn .eval-mark").all_inner_texts()
        assert marks == ["differs"] * 3 + ["same"] * 3
        assert page.locator(".eval-turn.differs .eval-call.only-here").count() == 3
        _shot(page, "evaluation-report")
        page.locator(".eval-turns a.eval-session").first.click()
        page.wait_for_url("**/agent_sessions/session/*/change/")
        found["first_turn_session"] = page.url
        # The session links back to the evaluation, and on to its webhook's delivery.
        related = page.locator("#ap-related")
        assert f"evaluation {data['evaluation']}" in related.inner_text()
        assert "schedule nightly-report" in related.inner_text()
        page.locator("#ap-related .ap-related-webhook a").click()
        page.wait_for_url("**/hooks/webhookdelivery/*/change/")
        _fits(page)
        url_box = page.locator(".field-url .readonly").bounding_box()
        assert url_box is not None and url_box["x"] + url_box["width"] <= WIDTH, url_box
        assert page.locator("pre.ap-json").is_visible()
        _shot(page, "delivery")
        page.locator(".field-schedule a").click()
        page.wait_for_url(f"**/hooks/schedule/{data['schedule']}/change/")
        # Each fire links to its run and that run's delivery.
        assert page.locator(".field-delivery a").count() == 12
        _shot(page, "schedule")

        # The deliveries' list: the status and attempts stay on screen beside long URLs.
        page.goto(f"{base}/admin/hooks/webhookdelivery/")
        _fits(page)
        for column in ("status", "attempts", "error_short"):
            cell = page.locator(f"#result_list td.field-{column}").first.bounding_box()
            assert cell is not None and cell["x"] + cell["width"] <= WIDTH, (column, cell)
        _shot(page, "deliveries")
        page.goto(f"{base}/admin/hooks/schedule/")
        assert page.locator("#result_list td.field-last_fire a").count() == 1
        _fits(page)

        # The credit pools' queue: every column on screen beside long actions and names.
        page.goto(f"{base}/admin/billing/poolrequest/?status=all")
        _fits(page)
        for cell in ("td.field-status", "td.field-session_link", "tr > :last-child"):
            box = page.locator(f"#result_list tbody {cell}").first.bounding_box()
            assert box is not None and box["x"] + box["width"] <= WIDTH, (cell, box)
        # Long names wrap to a line or two, not into a narrow column many lines tall.
        row = page.locator("#result_list tbody tr").first.bounding_box()
        assert row is not None and row["height"] <= 100, row
        _shot(page, "pool-queue")

        # The operator may override the rollout gate: the field is there.
        page.goto(f"{base}/admin/agent_sessions/agent/{data['agent']}/change/")
        assert page.locator("#id_override_rollout_gate").count() == 1

        # A view-only staff user: every list reads (no 403), no override shown as "None".
        _login(page, base, "viewer")
        for path in ("evaluations/evaluation", "hooks/schedule", "hooks/webhookdelivery",
                     "billing/creditpool", "billing/poolrequest"):  # fmt: skip
            response = page.goto(f"{base}/admin/{path}/")
            assert response is not None and response.status == 200, path
            _fits(page)
        # The home's approvals line leads to a page it may read, not the approvers' queue.
        page.goto(f"{base}/admin/")
        with page.expect_navigation() as went:
            page.click("text=Approvals pending")
        assert went.value is not None and went.value.status == 200, page.url
        page.goto(f"{base}/admin/agent_sessions/agent/{data['agent']}/change/")
        assert "Override rollout gate" not in page.inner_text("#content")
        _shot(page, "agent-viewer")

        # A tenant's staff user who owns nothing: no row of Alice's anywhere, and her
        # evaluation's page is "does not exist".
        _login(page, base, "tenant")
        page.goto(f"{base}/admin/evaluations/evaluation/")
        found["tenant_evaluations"] = page.inner_text("#changelist")
        page.goto(f"{base}/admin/evaluations/evaluation/{data['evaluation']}/change/")
        found["tenant_evaluation_url"] = page.url
        page.goto(f"{base}/admin/hooks/webhookdelivery/")
        found["tenant_deliveries"] = page.inner_text("#changelist")
        page.goto(f"{base}/admin/agent_sessions/agent/{data['agent']}/change/")
        assert page.locator("#id_override_rollout_gate").count() == 0
        # Nor can it replay her sessions in an evaluation of its own.
        page.goto(f"{base}/admin/evaluations/evaluation/add/")
        page.fill("#id_session_ids", data["differing"])
        page.fill("#id_candidate_system_prompt", "Be brief.")
        page.click("input[name=_save]")
        page.wait_for_load_state()
        found["tenant_add_errors"] = page.inner_text("#content")
        _shot(page, "evaluation-add-tenant")

        # An approver lands on the queue, which reads.
        _login(page, base, "approver")
        assert page.url.endswith("/admin/approvals/approval/queue/")
        _fits(page)

    assert data["session"] in found["first_turn_session"]
    assert "0 evaluations" in found["tenant_evaluations"]
    assert found["tenant_evaluation_url"] == f"{base}/admin/"
    assert "0 webhook deliveries" in found["tenant_deliveries"]
    assert "not found" in found["tenant_add_errors"] or "not exist" in found["tenant_add_errors"]
    assert (
        not Evaluation.objects.exclude(pk=data["evaluation"])
        .exclude(owner__username__startswith="alice")
        .exists()
    )

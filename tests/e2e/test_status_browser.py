"""One vocabulary of status in Chromium at 1400 px: the session list and a session's page
say each outcome in the same words and colours, for an operator and for a viewer (staff
with view-only permissions), empty and busy; a stopped turn is never a green "finished"."""

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from record.models import Session, ToolCall
from sessions.status import STATES, session_status
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium
from tests.factories import SessionFactory

PASSWORD = "status-pw-for-tests"
OUTCOMES = {
    "ok": [("success", "")],
    "tool_failures": [("success", ""), ("rejected", "expired")],
    "stopped": [("rejected", "unpaid")],
    "error": [("failed", "")],
}

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not HAVE_BROWSER, reason=f"needs playwright and Chromium at {CHROMIUM}"),
]


def _sessions(owner: Any) -> dict[str, str]:
    made = {}
    for outcome, calls in OUTCOMES.items():
        # The viewer's own (a staff user sees their tenant's sessions only).
        session = SessionFactory(state="finished", turn=1, owner=owner)
        counts: dict[str, int] = {}
        for i, (status, refusal) in enumerate(calls):
            ToolCall.objects.create(
                session=session, turn=1, step=1, position=i, call_id=f"c{i}", tool_name="refund",
                idempotency_key=f"{session.pk}-{i}", input={}, status=status, refusal=refusal,
            )  # fmt: skip
            key = {"success": "ok", "failed": "failed"}.get(status, refusal or "rejected")
            counts[key] = counts.get(key, 0) + 1
        Session.objects.filter(pk=session.pk).update(
            last_turn_number=1, last_turn_outcome=outcome, last_turn_calls=counts
        )
        made[outcome] = str(session.pk)
    return made


def _login(page: Any, live_stack: Any, username: str) -> None:
    page.goto(f"{live_stack.http}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_stack.http}/admin/")


def _badges(page: Any) -> list[tuple[str, str]]:
    return page.locator("#result_list .ap-state").evaluate_all(
        "els => els.map(e => [e.innerText, getComputedStyle(e).backgroundColor])"
    )


def test_the_session_list_and_pages_say_each_outcome_alike_for_operator_and_viewer(
    live_stack: Any,
) -> None:
    users = get_user_model()
    users.objects.create_superuser("status-operator", "op@example.com", PASSWORD)
    viewer = users.objects.create_user("status-viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_session", "view_toolcall"])
    )
    url = f"{live_stack.http}/admin/agent_sessions/session/"
    seen: dict[str, Any] = {}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack, "status-operator")
        page.goto(url)
        seen["empty"] = page.locator("#result_list .ap-state").count()
        _shot(page, "status-sessions-empty")
    made = _sessions(viewer)
    with chromium() as browser:
        for who in ("status-operator", "status-viewer"):
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            _login(page, live_stack, who)
            page.goto(url)
            seen[who] = sorted(_badges(page))
            _shot(page, f"status-sessions-{who}")
            stopped = f"{live_stack.http}/admin/agent_sessions/session/{made['stopped']}/change/"
            page.goto(stopped)
            seen[f"{who}-page"] = (
                page.inner_text("#ap-summary-state"),
                page.inner_text("#ap-summary-tool-calls"),
            )
            _shot(page, f"status-session-stopped-{who}")
            page.close()

    assert seen["empty"] == 0
    green = "rgb(21, 128, 61)"  # STATES["finished"].colour, #15803d
    assert STATES["finished"].colour == "#15803d"
    expected = sorted(
        (session_status("finished", outcome).label, session_status("finished", outcome).colour)
        for outcome in OUTCOMES
    )
    for who in ("status-operator", "status-viewer"):
        labels = [label for label, _ in seen[who]]
        assert sorted(labels) == [label for label, _ in expected], seen[who]
        greens = [label for label, colour in seen[who] if colour == green]
        assert greens == ["finished"], seen[who]  # only the turn that went well
        assert seen[f"{who}-page"] == ("stopped", "1 unpaid")

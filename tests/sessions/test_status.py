"""One vocabulary of status (sessions/status.py): every admin list, page, filter and badge
says a session of each outcome the same way, with the same counts; no template has labels
or colours of its own."""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval
from record.models import Session, ToolCall
from sessions.status import CALLS, OUTCOMES, STATES, call_key, calls_line, session_status
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client.force_login(user)
    return user


def _call(session: Session, position: int, status: str, refusal: str = "") -> ToolCall:
    return ToolCall.objects.create(
        session=session, turn=1, step=1, position=position, call_id=f"c{position}",
        tool_name="refund", idempotency_key=f"{session.pk}-{position}", input={},
        status=status, refusal=refusal,
    )  # fmt: skip


def _ended(outcome: str, calls: list[tuple[str, str]]) -> Session:
    session = SessionFactory(state="finished", turn=1)
    made = [_call(session, i, status, refusal) for i, (status, refusal) in enumerate(calls)]
    counts: dict[str, int] = {}
    for c in made:
        key = call_key(c.status, c.refusal)
        counts[key] = counts.get(key, 0) + 1
    Session.objects.filter(pk=session.pk).update(
        last_turn_number=1, last_turn_outcome=outcome, last_turn_calls=counts
    )
    return Session.objects.get(pk=session.pk)


# (outcome, its calls, the badge a session of it wears, the calls line of its turn)
CASES = [
    ("ok", [("success", ""), ("success", "")], "finished", "2 ok"),
    ("tool_failures", [("success", ""), ("rejected", "expired")], "finished with tool failures",
     "1 ok · 1 expired"),
    ("stopped", [("rejected", "unpaid")], "stopped", "1 unpaid"),
    ("error", [("failed", "")], "error", "1 failed"),
]  # fmt: skip


@pytest.mark.parametrize(("outcome", "calls", "badge", "line"), CASES)
def test_every_admin_page_says_a_sessions_outcome_the_same_way(
    client, operator, outcome, calls, badge, line
):
    session = _ended(outcome, calls)
    expected = session_status("finished", outcome)
    assert expected.label == badge

    listing = client.get(reverse("admin:agent_sessions_session_changelist")).content.decode()
    assert f">{badge}<" in listing and f">{OUTCOMES[outcome].label}<" in listing
    assert expected.colour in listing

    page = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    summary = page.context["summary"]
    assert summary.state_badge.count(f">{badge}<") == 1
    # The last turn's calls and the session's calls: the same words, the same counts.
    assert summary.last_turn_calls == line == summary.tool_calls_line
    body = page.content.decode()
    assert f'id="ap-summary-tool-calls">{line}<' in body

    calls_page = client.get(
        reverse("admin:agent_sessions_toolcall_changelist"), {"session__id__exact": session.pk}
    ).content.decode()
    for status, refusal in calls:
        assert f">{CALLS[call_key(status, refusal)].label}<" in calls_page
    if outcome != "ok":
        assert session_status("finished", outcome).colour != STATES["finished"].colour


def test_a_stopped_turn_is_never_a_green_finished():
    for outcome in ("stopped", "error", "tool_failures"):
        status = session_status("finished", outcome)
        assert status.label != "finished" and status.colour != STATES["finished"].colour


def test_an_open_call_waits_for_approval_or_runs_in_every_list_and_filter(client, operator):
    session = SessionFactory(state="awaiting_approval", turn=1)
    waiting = _call(session, 0, "executing")
    running = _call(session, 1, "executing")
    Approval.objects.create(
        session=session, turn=1, step=1, tool_call=waiting, tool_name="refund", arguments={},
        deadline=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    url = reverse("admin:agent_sessions_toolcall_changelist")

    page = client.get(url).content.decode()
    assert ">waiting for approval<" in page and ">running<" in page and "executing" not in page

    def listed(key: str) -> list[str]:
        return [c.call_id for c in client.get(url, {"call_status": key}).context["cl"].result_list]

    assert listed("waiting") == [waiting.call_id] and listed("running") == [running.call_id]
    timeline = client.get(
        reverse("admin:agent_sessions_session_change", args=[session.pk])
    ).content.decode()
    assert "refund({}) waiting for approval" in timeline and "refund({}) running" in timeline
    assert calls_line({"waiting": 1, "running": 1}) == "1 waiting for approval · 1 running"


def test_the_filters_offer_the_vocabularys_words(client, operator):
    page = client.get(reverse("admin:agent_sessions_session_changelist")).content.decode()
    for status in (*OUTCOMES.values(), STATES["awaiting_approval"]):
        assert f">{status.label}</a>" in page
    calls = client.get(reverse("admin:agent_sessions_toolcall_changelist")).content.decode()
    for status in CALLS.values():
        assert f">{status.label}</a>" in calls


# Raw stored values that are not the vocabulary's words, and colour maps of status words.
# (A wire value shown as such, in <code>, is the protocol, not a label.)
RAW_WORDS = re.compile(r"(?<!<code)>\s*(executing|success|timeout|tool_failures|tool failures)\s*<")
COLOUR_MAP = re.compile(
    r"""\b(finished|error|cancelled|ok|failed|rejected|expired|unpaid|running|idle|stopped)"""
    r"""["']?\s*:\s*["']#[0-9a-fA-F]{3,6}"""
)


def test_no_template_has_status_labels_or_colours_of_its_own():
    """Every status word and colour comes from sessions/status.py (as context, or as JSON
    for the playground's script); a template that hard-codes them drifts from the rest."""
    offenders = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        text = path.read_text()
        for pattern in (RAW_WORDS, COLOUR_MAP):
            offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert offenders == []


def test_no_admin_module_has_a_colour_map_of_status_words():
    """The admin's badges are drawn from the vocabulary too: no palette of its own."""
    offenders = []
    for path in sorted((ROOT / "sessions" / "admin").rglob("*.py")):
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in COLOUR_MAP.finditer(text)]
    assert offenders == []


def test_a_turn_known_by_its_stop_reason_only_wears_the_vocabularys_badge():
    """A turn that ended before outcomes were recorded: its stop reason gives the outcome
    (a cancel is an amber "stopped", as in every other list), the error is the title."""
    from sessions.admin.display import outcome_badge

    cancelled = outcome_badge("cancelled")
    stopped = OUTCOMES["stopped"]
    assert f">{stopped.label}<" in cancelled and stopped.colour in cancelled
    assert ">cancelled<" in cancelled  # the stop reason beside it
    failed = outcome_badge("error", "the model endpoint refused the key")
    assert OUTCOMES["error"].colour in failed
    assert 'title="the model endpoint refused the key"' in failed
    assert f">{OUTCOMES['ok'].label}<" in outcome_badge("answer")
    assert outcome_badge(None) == "—"


def test_the_grep_test_would_catch_one():
    assert COLOUR_MAP.search('var C = {finished: "#15803d"};')
    assert RAW_WORDS.search("<td>executing</td>")

"""What an operator reads before a fork or a hand run (sessions/previews.py)."""

import pytest

from billing.services import credits_grant
from engine import session_run
from record.errors import NotFound
from record.models import Checkpoint, Session
from sessions import services
from sessions.previews import checkpoints_described, fork_preview, tool_run_preview
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import SessionFactory, UserFactory
from tools.models import Tool

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo_run() -> Session:
    demo_install()
    session = SessionFactory(agent__slug="order-support", owner=UserFactory(username="alice"))
    services.message_post(session=session, content=DEMO_REQUEST)
    assert session_run(session_id=session.pk).stopped == "idle"
    return Session.objects.get(pk=session.pk)


def _checkpoint(session: Session, phase: str) -> Checkpoint:
    found = Checkpoint.objects.filter(session=session, context__phase=phase).order_by("step")
    return found.first()  # type: ignore[return-value]


def test_a_fork_before_the_notifications_lists_them_as_repeatable(demo_run):
    before = _checkpoint(demo_run, "tool_results")  # the orders were queried, nothing sent
    preview = fork_preview(session=demo_run, step=before.step)
    effects = [(r.call.tool_name, r.took_effect) for r in preview.side_effects]
    assert effects == [("send_notification", True)] * 3 + [("generate_report", True)]
    assert preview.decides and not preview.dropped_request
    last, line = preview.copied[-1]
    assert last.role == "tool" and line.startswith("count: 3")
    assert preview.copied[1][1] == "asks for query_orders"  # the assistant's request
    assert preview.copied_count == before.message_seq
    assert preview.side_effects[0].arguments.startswith('{"')  # JSON, shortened
    assert preview.story.what == "tool results: query_orders=success"


def test_a_fork_at_a_tool_request_drops_it_and_its_calls_may_run_again(demo_run):
    intent = Checkpoint.objects.filter(session=demo_run, context__phase="tool_intent").order_by(
        "step"
    )[1]  # the notifications were asked for, not yet sent
    preview = fork_preview(session=demo_run, step=intent.step)
    assert preview.dropped_request
    assert [r.call.tool_name for r in preview.side_effects][:3] == ["send_notification"] * 3
    assert preview.copied_count == intent.message_seq - 1


def test_a_fork_at_the_end_repeats_nothing(demo_run):
    preview = fork_preview(session=demo_run, step=demo_run.step)
    assert preview.calls_after == [] and not preview.decides  # it waits for the user
    with pytest.raises(NotFound):
        fork_preview(session=demo_run, step=999)


def test_checkpoint_stories_name_the_calls_and_the_last_message(demo_run):
    rows = list(Checkpoint.objects.filter(session=demo_run).order_by("step"))
    stories = checkpoints_described(rows)
    assert [stories[c.pk].what for c in rows[:3]] == [
        "turn start",
        "tool intent: query_orders",
        "tool results: query_orders=success",
    ]
    first = stories[rows[0].pk]
    assert (first.message_role, first.message_text[:9]) == ("user", "find last")
    assert stories[rows[1].pk].message_text == "asks for query_orders"


def test_a_hand_runs_preview_names_its_risk_approval_and_cost(demo_run):
    Tool.objects.filter(name="issue_coupon").update(
        credit_cost=40, approval_when={"field": "amount", "op": "gt", "value": 50}
    )
    credits_grant(owner_id=demo_run.owner_id, points=30, actor="test")
    coupon = tool_run_preview(
        session=demo_run, tool_name="issue_coupon", arguments={"customer_id": 1, "amount": 80}
    )
    assert coupon.tool.side_effects and coupon.risk_level >= 2
    assert coupon.approval == "issue_coupon: the approval condition holds for these arguments"
    assert coupon.credits is not None and coupon.credits.outcome == "insufficient"
    bad = tool_run_preview(session=demo_run, tool_name="issue_coupon", arguments={"amount": "x"})
    assert bad.errors and bad.approval is None
    with pytest.raises(NotFound):
        tool_run_preview(session=demo_run, tool_name="no_such_tool", arguments={})

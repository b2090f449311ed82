"""Named reads for the console: a session's timeline and how its last turn went."""

from datetime import UTC, datetime

import pytest

from engine.runner.loop import session_run
from record.models import Checkpoint, Event, Message, ModelCall, ToolCall, Transition
from sessions import selectors, services
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import SessionFactory, UserFactory

# session_run closes its database connection between steps, so a turn needs real transactions.
pytestmark = pytest.mark.django_db(transaction=True)

TABLES = {
    "transition": Transition,
    "message": Message,
    "toolcall": ToolCall,
    "event": Event,
    "checkpoint": Checkpoint,
}


@pytest.fixture
def demo_session():
    demo_install()
    session = SessionFactory(agent__slug="order-support", owner=UserFactory(username="alice"))
    services.message_post(session=session, content=DEMO_REQUEST)
    assert session_run(session_id=session.pk).stopped == "idle"
    session.refresh_from_db()
    return session


def test_the_timeline_holds_every_row_of_every_table_oldest_first(demo_session):
    timeline = selectors.session_timeline(session_id=demo_session.pk, limit=10_000)

    assert not timeline.truncated
    for kind, model in TABLES.items():
        pks = {e.pk for e in timeline.entries if e.kind == kind}
        assert pks == set(model.objects.filter(session=demo_session).values_list("pk", flat=True))
    assert [e.at for e in timeline.entries] == sorted(e.at for e in timeline.entries)
    transition = next(e for e in timeline.entries if e.kind == "transition")
    assert transition.state == transition.row["to_state"] and transition.seq is None
    event = next(e for e in timeline.entries if e.kind == "event")
    assert event.seq == event.order == event.row["seq"] and isinstance(event.row["type"], str)


def test_a_bounded_timeline_is_the_newest_part_and_says_older_ones_exist(demo_session):
    everything = selectors.session_timeline(session_id=demo_session.pk, limit=10_000).entries

    last_five = selectors.session_timeline(session_id=demo_session.pk, limit=5)

    assert last_five.truncated
    assert last_five.entries == everything[-5:]


def test_rows_of_one_instant_keep_the_order_a_step_writes_them_in(demo_session):
    instant = datetime(2030, 1, 1, tzinfo=UTC)
    for kind, model in TABLES.items():
        column = "at" if kind == "transition" else "created_at"
        model.objects.filter(session=demo_session).update(**{column: instant})

    entries = selectors.session_timeline(session_id=demo_session.pk, limit=10_000).entries

    kinds = [e.kind for e in entries]
    assert kinds == sorted(kinds, key=selectors.TIMELINE_KINDS.index)
    for kind in TABLES:
        orders = [e.order for e in entries if e.kind == kind]
        assert orders == sorted(orders), kind


def test_the_activity_tells_how_the_last_turn_ended_and_counts_the_calls(demo_session):
    activity = selectors.session_activity(session=demo_session)

    assert (activity.stop_reason, activity.stop_turn) == ("answer", 1)
    assert activity.finished_at is not None
    assert activity.model_calls == ModelCall.objects.filter(session=demo_session).count() > 0
    assert activity.tool_calls == ToolCall.objects.filter(session=demo_session).count() > 0
    assert (activity.model_failures, activity.models) == (0, "rules")
    assert activity.tool_counts == {"ok": activity.tool_calls}


def test_a_session_without_a_finished_turn_has_no_stop_reason():
    demo_install()
    session = SessionFactory(agent__slug="order-support")

    activity = selectors.session_activity(session=session)

    assert activity == selectors.SessionActivity(
        stop_reason=None,
        stop_turn=None,
        finished_at=None,
        model_calls=0,
        model_failures=0,
        models="",
        tool_calls=0,
        tool_counts={},
    )


# --- Search by what was said ----------------------------------------------------------


def test_sessions_are_found_by_words_names_and_codes_their_messages_say():
    coupon, order, quiet = SessionFactory(), SessionFactory(), SessionFactory()
    Message.objects.create(session=coupon, seq=1, role="user", content="A coupon for Ada, please")
    Message.objects.create(session=coupon, seq=2, role="assistant", content="Coupon C-17 issued.")
    Message.objects.create(session=order, seq=1, role="user", content="Where is SO-1001?")

    def saying(text: str) -> set:
        return set(selectors.sessions_saying(text=text).values_list("session_id", flat=True))

    assert saying("coupon") == {coupon.pk}  # any case, either message
    assert saying("ada") == {coupon.pk}
    assert saying("SO-1001") == {order.pk}
    assert saying('"coupon for ada"') == {coupon.pk}  # web-search syntax: a phrase
    assert saying('"ada for coupon"') == set()
    assert saying("SO-1001 -where") == set()  # and a word left out
    assert saying("coupon or SO-1001") == {coupon.pk, order.pk}
    assert saying("refund") == set() and quiet.pk not in saying("a")


def test_the_search_reads_the_messages_gin_index():
    from django.db import connection, transaction

    sql, params = selectors.sessions_saying(text="coupon").query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        # The planner takes a sequential scan of a small table: forbid it, as a large
        # table's statistics would.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "message_content_search" in plan, plan

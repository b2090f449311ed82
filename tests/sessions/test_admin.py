"""The operators' console: pages render, history is read-only, the cancel action works."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from engine import session_run
from record.models import Event, Message, ModelCall, Session, ToolCall
from sessions import services
from sessions.admin.timeline import session_timeline
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import SessionFactory, ToolFactory, UserFactory
from tools.models import Tool

pytestmark = pytest.mark.django_db
# session_run closes its database connection between steps (it never holds one
# across a model call), so tests that run a turn need real transactions.
runs_a_turn = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser(
        "operator", "operator@example.com", "pw-not-used"
    )
    client.force_login(user)
    return user


@pytest.fixture
def demo_session():
    """A session on the offline demo agent with one whole turn run in-process."""
    demo_install()
    session = SessionFactory(agent__slug="order-support", owner=UserFactory(username="alice"))
    services.message_post(session=session, content=DEMO_REQUEST)
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle"
    session.refresh_from_db()
    assert session.state == "finished"
    return session


@runs_a_turn
def test_session_changelist_renders_with_filters_and_search(client, operator, demo_session):
    url = reverse("admin:agent_sessions_session_changelist")
    response = client.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    assert str(demo_session.pk)[:8] in page and "order-support" in page and "finished" in page
    # Search by owner, by agent, by a part of the id and by the full id; filter by state.
    for term in ("alice", "order-support", str(demo_session.pk)[:8], str(demo_session.pk)):
        assert str(demo_session.pk)[:8] in client.get(url, {"q": term}).content.decode(), term
    assert (
        str(demo_session.pk)[:8] not in client.get(url, {"q": "nobody-like-this"}).content.decode()
    )
    assert client.get(url, {"state__exact": "finished"}).status_code == 200


@runs_a_turn
def test_session_change_page_shows_the_merged_timeline(client, operator, demo_session):
    response = client.get(reverse("admin:agent_sessions_session_change", args=[demo_session.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="ap-timeline"' in page
    timeline = response.context["timeline"]
    kinds = {item.kind for item in timeline}
    assert kinds == {"transition", "message", "toolcall", "event", "checkpoint"}
    # Oldest first, by time.
    assert [i.at for i in timeline] == sorted(i.at for i in timeline)
    # Entries from every table are on the page, escaped summaries included.
    assert "idle → processing (user_message)" in page
    assert "query_orders" in page and "generate_report" in page and "turn.finished" in page
    assert not response.context["timeline_truncated"]
    # A finished session offers no cancel button; its engine fields are not inputs.
    assert "ap-cancel-form" in page and 'class="ap-cancel"' not in page
    assert 'name="state"' not in page and 'name="version"' not in page and 'name="cost"' not in page


@runs_a_turn
def test_timeline_is_bounded_and_says_so(demo_session):
    items, truncated = session_timeline(demo_session.pk, limit=5)
    assert len(items) == 5 and truncated
    everything, _ = session_timeline(demo_session.pk)
    assert [(i.kind, i.order) for i in items] == [(i.kind, i.order) for i in everything[-5:]]


@runs_a_turn
def test_timeline_uses_one_query_per_table(demo_session, django_assert_num_queries):
    # Transitions, messages, tool calls, events, checkpoints, and approvals.
    with django_assert_num_queries(6):
        session_timeline(demo_session.pk)


@runs_a_turn
def test_session_page_opens_with_the_summary_and_offers_no_save_or_delete(
    client, operator, demo_session
):
    Session.objects.filter(pk=demo_session.pk).update(last_error="model 'main' timed out <b>")
    response = client.get(reverse("admin:agent_sessions_session_change", args=[demo_session.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    summary = response.context["summary"]
    assert summary.stop_reason == "answer" and summary.stop_turn == 1
    assert summary.tool_calls == 5 and summary.tool_counts == {"ok": 5}
    assert summary.tool_calls_line == "5 ok"
    assert summary.model_calls == 4 and summary.models == "rules"
    # The summary comes first, then the timeline, then the raw fields.
    assert page.index('id="ap-summary"') < page.index('id="ap-timeline"') < page.index("Details")
    for label in ("State", "Turn", "Last turn", "Cost", "Usage (tokens)", "Last error"):
        assert f">{label}<" in page, label
    assert "model &#x27;main&#x27; timed out &lt;b&gt;" in page
    # A record, not a form: no Save, no Delete, no inputs for metadata.
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert "deletelink" not in page and 'name="metadata"' not in page


@runs_a_turn
def test_sessions_cannot_be_changed_or_deleted_even_on_post(client, operator, demo_session):
    from django.contrib import admin as django_admin

    url = reverse("admin:agent_sessions_session_change", args=[demo_session.pk])
    response = client.post(
        url, {"state": "idle", "version": 0, "cost": "0", "metadata": '{"note": "x"}', "_save": "1"}
    )
    assert response.status_code == 403
    delete = client.post(
        reverse("admin:agent_sessions_session_delete", args=[demo_session.pk]), {"post": "yes"}
    )
    assert delete.status_code == 403
    bulk = client.post(
        reverse("admin:agent_sessions_session_changelist"),
        {"action": "delete_selected", "_selected_action": [str(demo_session.pk)], "post": "yes"},
    )
    assert bulk.status_code in (200, 302)
    row = Session.objects.get(pk=demo_session.pk)
    assert row.state == "finished" and row.version == demo_session.version
    assert row.metadata == demo_session.metadata
    model_admin = django_admin.site._registry[Session]
    request = response.wsgi_request
    assert not model_admin.has_change_permission(request, row)
    assert not model_admin.has_delete_permission(request, row)
    assert model_admin.has_view_permission(request, row)


def test_sessions_cannot_be_added_by_hand(client, operator):
    assert client.get(reverse("admin:agent_sessions_session_add")).status_code == 403


@runs_a_turn
@pytest.mark.parametrize("model", ["message", "toolcall", "transition", "checkpoint", "event"])
def test_history_models_are_view_only(client, operator, demo_session, model):
    changelist = client.get(reverse(f"admin:agent_sessions_{model}_changelist"))
    assert changelist.status_code == 200
    assert client.get(reverse(f"admin:agent_sessions_{model}_add")).status_code == 403
    by_session = client.get(
        reverse(f"admin:agent_sessions_{model}_changelist"), {"session": str(demo_session.pk)}
    )
    assert by_session.status_code == 200
    assert (
        client.get(
            reverse(f"admin:agent_sessions_{model}_changelist"), {"q": str(demo_session.pk)}
        ).status_code
        == 200
    )


@runs_a_turn
def test_an_event_page_is_read_only_and_cannot_be_changed_or_deleted(
    client, operator, demo_session
):
    event = Event.objects.filter(session=demo_session).order_by("seq").first()
    change_url = reverse("admin:agent_sessions_event_change", args=[event.pk])
    view = client.get(change_url)
    assert view.status_code == 200
    assert b'name="type"' not in view.content and b'name="_save"' not in view.content
    assert client.post(change_url, {"type": "forged", "seq": 999}).status_code == 403
    assert (
        client.post(
            reverse("admin:agent_sessions_event_delete", args=[event.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    event.refresh_from_db()
    assert event.type != "forged"


def test_cancel_action_requests_a_cancel_of_a_running_turn(client, operator):
    running = SessionFactory()
    ended = SessionFactory()
    Session.objects.filter(pk=running.pk).update(state="processing")
    response = client.post(
        reverse("admin:agent_sessions_session_changelist"),
        {"action": "cancel_running_turn", "_selected_action": [str(running.pk), str(ended.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert Session.objects.get(pk=running.pk).cancel_requested is True
    assert Session.objects.get(pk=ended.pk).cancel_requested is False
    texts = [str(m) for m in response.context["messages"]]
    assert "Cancel requested for 1 session(s)." in texts
    assert "1 session(s) had no running turn to cancel." in texts


def test_cancel_button_on_the_change_page(client, operator):
    running = SessionFactory()
    Session.objects.filter(pk=running.pk).update(state="tool_wait")
    change_url = reverse("admin:agent_sessions_session_change", args=[running.pk])
    assert 'class="ap-cancel"' in client.get(change_url).content.decode()
    cancel_url = reverse("admin:agent_sessions_session_cancel", args=[running.pk])
    assert client.get(cancel_url).status_code == 405
    response = client.post(cancel_url)
    assert response.status_code == 302 and response["Location"] == change_url
    assert Session.objects.get(pk=running.pk).cancel_requested is True


def test_cancel_is_refused_without_login(client):
    running = SessionFactory()
    Session.objects.filter(pk=running.pk).update(state="processing")
    response = client.post(reverse("admin:agent_sessions_session_cancel", args=[running.pk]))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert Session.objects.get(pk=running.pk).cancel_requested is False


@runs_a_turn
def test_agent_and_model_admin_pages(client, operator, demo_session):
    agents = client.get(reverse("admin:agent_sessions_agent_changelist"))
    assert agents.status_code == 200
    row = next(a for a in agents.context["cl"].result_list if a.slug == "order-support")
    assert row._session_count == 1
    assert (
        client.get(reverse("admin:agent_sessions_agent_change", args=[row.pk])).status_code == 200
    )
    assert client.get(reverse("admin:agent_sessions_modelendpoint_changelist")).status_code == 200


@runs_a_turn
def test_agent_form_rejects_unknown_tools_and_bad_rules(client, operator, demo_session):
    agent = demo_session.agent
    url = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    page = client.get(url)
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update(
        slug=agent.slug,
        model=agent.model_id,
        fallback_model="",
        tools=["query_orders", "no_such_tool"],
        rules='[{"when": {}}]',
        enabled="on",
    )
    response = client.post(url, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "no_such_tool is not one of the available choices" in errors["tools"][0]
    assert errors["rules"] and "Invalid rules" in errors["rules"][0]


@runs_a_turn
def test_agent_form_checks_the_context_budget(client, operator, demo_session):
    agent = demo_session.agent
    url = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    page = client.get(url)
    assert "Context budget and summaries" in page.content.decode()
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update(
        slug=agent.slug,
        model=agent.model_id,
        fallback_model="",
        summary_model=agent.model_id,
        tools=list(agent.tools),
        rules=json.dumps(agent.rules),
        context_budget='{"histroy": 5, "trim_at": 3}',
        dialogue="{}",
        enabled="on",
    )
    response = client.post(url, data)
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["context_budget"]
    assert "unknown key 'histroy'" in errors["context_budget"][0]
    assert "'trim_at' must be a share between 0 and 1" in errors["context_budget"][0]

    data["context_budget"] = '{"history": 12000, "memory": 0.05}'
    assert client.post(url, data).status_code == 302
    agent.refresh_from_db()
    assert agent.context_budget == {"history": 12000, "memory": 0.05}
    assert agent.summary_model_id == agent.model_id


def _tool_post(**overrides):
    data = {
        "name": "lookup",
        "description": "Look something up.",
        "result_description": "",
        "parameters": '{"type": "object", "properties": {"q": {"type": "string"}}}',
        "kind": "python",
        "handler": "builtin.current_time",
        "url": "",
        "method": "POST",
        "headers": "{}",
        "timeout_s": "10",
        "risk_level": "0",
        "approval_timeout_s": "1800",
        "approval_on_timeout": "reject",
        "roles": "support",
        "credit_cost": "0",
        "enabled": "on",
    }
    data.update(overrides)
    return data


def test_tool_form_rejects_an_invalid_json_schema(client, operator):
    url = reverse("admin:tools_tool_add")
    response = client.post(
        url, _tool_post(parameters='{"type": "object", "properties": {"q": {"type": 12}}}')
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["parameters"]
    assert errors["parameters"][0].startswith("Not a valid JSON Schema (Draft 2020-12)")

    not_object = client.post(url, _tool_post(parameters='{"type": "string"}'))
    assert "top level must be" in not_object.context["adminform"].form.errors["parameters"][0]

    bad_handler = client.post(url, _tool_post(handler="nope.nothing"))
    assert (
        "No registered handler 'nope.nothing'"
        in bad_handler.context["adminform"].form.errors["handler"][0]
    )

    created = client.post(url, _tool_post())
    assert created.status_code == 302


def test_tool_changelist_toggles_enabled_in_place(client, operator):
    tool = ToolFactory(name="toggle_me")
    url = reverse("admin:tools_tool_changelist")
    page = client.get(url)
    assert page.status_code == 200 and "toggle_me" in page.content.decode()
    response = client.post(
        url,
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-MIN_NUM_FORMS": "0",
            "form-MAX_NUM_FORMS": "1000",
            "form-0-id": str(tool.pk),
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    tool.refresh_from_db()
    assert tool.enabled is False


def test_demo_and_other_apps_are_registered(client, operator):
    for name in (
        "demo_customer",
        "demo_order",
        "demo_notification",
        "demo_report",
        "accounts_apikey",
    ):
        assert client.get(reverse(f"admin:{name}_changelist")).status_code == 200, name
    index = client.get(reverse("admin:index")).content.decode()
    assert "Agent platform" in index


def test_admin_static_files_are_served(client):
    # daphne serves no static files; WhiteNoise does, straight from the app finders.
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"--body-bg" in body


def test_session_page_shows_the_dialogue_state(client, operator):
    session = SessionFactory(
        dialogue_state={
            "intent": "refund",
            "intent_turn": 2,
            "slots": {"order": "SO-7", "note": "<b>x</b>"},
            "slot_turns": {"order": 1, "note": 2},
            "turn": 2,
            "seq": 3,
        }
    )
    page = client.get(
        reverse("admin:agent_sessions_session_change", args=[session.pk])
    ).content.decode()
    line = page.split('id="ap-summary-dialogue">', 1)[1].split("</dd>", 1)[0]
    assert line == (
        "intent refund (turn 2); note = &quot;&lt;b&gt;x&lt;/b&gt;&quot; (turn 2); "
        "order = &quot;SO-7&quot; (turn 1)"
    )
    assert "Dialogue state" in page  # the raw JSON, in its own (collapsed) fieldset


def test_session_page_without_a_dialogue_state_has_no_dialogue_line(client, operator):
    session = SessionFactory()
    page = client.get(
        reverse("admin:agent_sessions_session_change", args=[session.pk])
    ).content.decode()
    assert 'id="ap-summary-dialogue"' not in page


@runs_a_turn
def test_a_traced_turn_links_its_trace_from_the_summary_and_the_timeline(
    client, operator, monkeypatch, settings
):
    from observability import tracing
    from tests.observability.otlp_receiver import OtlpReceiver

    settings.TRACE_URL_TEMPLATE = "http://jaeger.example:16686/trace/{trace_id}"
    demo_install()
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        tracing.configure()
        try:
            session = SessionFactory(agent__slug="order-support", owner=UserFactory(username="al"))
            services.message_post(session=session, content=DEMO_REQUEST)
            assert session_run(session_id=session.pk).stopped == "idle"
            tracing.flush()
            session.refresh_from_db()
            trace_id = tracing.trace_id_of(session.trace_parent)
            assert len(trace_id) == 32
            receiver.wait_for(lambda spans: any(s.trace_id == trace_id for s in spans))
        finally:
            tracing.shutdown()
    types = Event.objects.filter(session=session, data__trace_id=trace_id).values_list(
        "type", flat=True
    )
    assert "state.changed" in types and "turn.finished" in types
    page = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    link = f'href="http://jaeger.example:16686/trace/{trace_id}"'
    # Once in the summary's facts, and on each traced event of the timeline.
    assert page.content.decode().count(link) >= 1 + len(types)


# --- The truth about a turn: its outcome, what ran, what was said ------------------------


def _finished(outcome: str, calls: dict[str, int], **fields: object) -> Session:
    session = SessionFactory(state="finished", turn=1, **fields)
    Session.objects.filter(pk=session.pk).update(
        last_turn_number=1, last_turn_outcome=outcome, last_turn_calls=calls
    )
    return session


def test_the_session_list_colours_and_filters_by_the_last_turns_outcome(client, operator):
    ok = _finished("ok", {"ok": 2})
    refused = _finished("tool_failures", {"ok": 0, "rejected": 3})
    stopped = _finished("stopped", {"unpaid": 2})
    url = reverse("admin:agent_sessions_session_changelist")

    page = client.get(url).content.decode()
    assert "ap-turn-tool_failures" in page and "3 rejected" in page
    assert "ap-turn-ok" in page and "ap-turn-stopped" in page
    assert "last turn" in page  # the filter's title

    def listed(**query: str) -> set[str]:
        return {s.pk for s in client.get(url, query).context["cl"].result_list}

    assert listed(last_turn="tool_failures") == {refused.pk}
    assert listed(last_turn="ok") == {ok.pk}
    assert listed(last_turn="not_ok") == {refused.pk, stopped.pk}
    assert listed(last_turn="anything-else") == {ok.pk, refused.pk, stopped.pk}


def _said(session: Session, *texts: str) -> None:
    for seq, text in enumerate(texts, start=1):
        Message.objects.create(session=session, seq=seq, role="user", content=text)


def test_the_session_list_finds_sessions_by_what_their_messages_say(client, operator):
    coupon = SessionFactory()
    _said(coupon, "Please issue a coupon of 20 for customer 17", "Thanks, Ada Lovelace here")
    order = SessionFactory()
    _said(order, "Where is order SO-1001?")
    SessionFactory()  # says nothing
    url = reverse("admin:agent_sessions_session_changelist")

    def found(term: str) -> set[str]:
        return {s.pk for s in client.get(url, {"q": term}).context["cl"].result_list}

    assert found("coupon") == {coupon.pk}
    assert found("Lovelace") == {coupon.pk}  # names match as written ('simple')
    assert found('"Ada Lovelace"') == {coupon.pk}
    assert found("SO-1001") == {order.pk}
    assert found("refund") == set()
    # The old searches still work alongside it.
    assert found(coupon.owner.username) == {coupon.pk}


def test_searching_what_was_said_takes_the_content_permission(client):
    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_session", content_type__app_label="agent_sessions")
    )
    said = SessionFactory(owner=viewer)  # the viewer's own tenant's session
    _said(said, "a coupon please")
    client.force_login(viewer)
    url = reverse("admin:agent_sessions_session_changelist")

    def found(term: str) -> set[str]:
        return {s.pk for s in client.get(url, {"q": term}).context["cl"].result_list}

    # Finding the session would tell what it says: without the permission, words find nothing.
    assert found("coupon") == set()
    listing = client.get(url).content.decode()
    assert str(said.pk)[:8] in listing
    assert "a coupon please" not in listing and "ap-first-message" not in listing
    viewer.user_permissions.add(
        Permission.objects.get(
            codename="view_message_content", content_type__app_label="agent_sessions"
        )
    )
    assert found("coupon") == {said.pk}
    assert "a coupon please" in client.get(url).content.decode()


def test_the_session_list_shows_each_first_message_in_one_query(
    client, operator, django_assert_max_num_queries
):
    for n in range(3):
        _said(SessionFactory(), f"first words {n} " + "x" * 200, "second words")
    url = reverse("admin:agent_sessions_session_changelist")
    with CaptureQueriesContext(connection) as three:
        page = client.get(url).content.decode()
    assert "first words 0" in page and "second words" not in page
    assert "x" * 60 not in page  # cut to the column's width
    for n in range(3, 9):
        _said(SessionFactory(), f"first words {n}")
    with django_assert_max_num_queries(len(three.captured_queries)):
        assert "first words 8" in client.get(url).content.decode()


def test_the_session_page_shows_the_last_turn_and_links_its_model_calls(client, operator):
    session = _finished("tool_failures", {"ok": 1, "expired": 1})
    ModelCall.objects.create(
        session=session, turn=1, step=1, endpoint_name="rules", api="rules", outcome="success"
    )
    response = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    page = response.content.decode()
    summary = response.context["summary"]
    assert "ap-turn-tool_failures" in summary.last_turn
    assert summary.last_turn_calls == "1 ok · 1 expired"
    Event.objects.create(
        session=session,
        seq=1,
        type="turn.finished",
        data={"turn": 1, "stop_reason": "max_iterations"},
    )
    again = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    assert "turn 1: max iterations · 1 ok · 1 expired" in again.content.decode()
    model_calls = reverse("admin:agent_sessions_modelcall_changelist") + f"?session={session.pk}"
    assert f'id="ap-summary-model-calls" href="{model_calls}"'.replace("&", "&amp;") in page
    assert ">1 model call<" in page
    listed = client.get(model_calls).context["cl"].result_list
    assert [c.session_id for c in listed] == [session.pk]


def test_the_timeline_colours_what_did_not_run_and_shows_an_approvers_edit(client, operator):
    session = SessionFactory(state="finished", turn=1)
    common = {"session": session, "turn": 1, "step": 1}
    ToolCall.objects.create(
        **common, position=0, call_id="a", tool_name="issue_coupon", idempotency_key="k-a",
        input={"customer_id": 17, "amount": 20}, proposed_input={"customer_id": 17, "amount": 60},
        status="success", output={"coupon_code": "C-1"},
    )  # fmt: skip
    ToolCall.objects.create(
        **common, position=1, call_id="b", tool_name="send_notification", idempotency_key="k-b",
        input={"customer_id": 17}, status="rejected", refusal="expired",
        error="no one approved this call before its deadline; it did not run.",
    )  # fmt: skip
    items, _ = session_timeline(session.pk)
    coupon, notification = (i for i in items if i.kind == "toolcall")
    assert coupon.tone == "" and "ran with an approver's edit: amount: 60 → 20" in coupon.summary
    assert notification.tone == "failed" and ") expired: no one approved" in notification.summary
    page = client.get(reverse("admin:agent_sessions_session_change", args=[session.pk]))
    assert 'class="toolcall ap-failed"' in page.content.decode()

    calls = client.get(reverse("admin:agent_sessions_toolcall_changelist")).content.decode()
    assert "amount: 60 → 20" in calls and ">expired<" in calls
    edited = client.get(reverse("admin:agent_sessions_toolcall_changelist"), {"edited": "yes"})
    assert [c.call_id for c in edited.context["cl"].result_list] == ["a"]


@runs_a_turn
def test_an_agents_tools_are_picked_from_the_known_tools(client, operator, demo_session):
    agent = demo_session.agent
    url = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    page = client.get(url)
    html = page.content.decode()
    # A two-pane picker of every known tool, the agent's own chosen.
    assert 'class="selectfilter"' in html and 'name="tools"' in html and "SelectFilter2.js" in html
    field = page.context["adminform"].form.fields["tools"]
    names = [name for name, _ in field.choices]
    assert {"query_orders", "send_notification", "ask_user", "remember", "recall"} <= set(names)
    assert "send_notification (side effects)" in dict(field.choices).values()
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update(
        slug=agent.slug, model=agent.model_id, fallback_model="", enabled="on",
        tools=["query_orders", "ask_user"], rules="[]", dialogue="{}", context_budget="{}",
    )  # fmt: skip
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    agent.refresh_from_db()
    assert agent.tools == ["query_orders", "ask_user"]


@runs_a_turn
def test_agent_form_checks_peak_hours_and_time_zone(client, operator, demo_session):
    agent = demo_session.agent
    url = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    page = client.get(url)
    assert "Environment" in page.content.decode()
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    data.update(
        slug=agent.slug, model=agent.model_id, fallback_model="", enabled="on",
        tools=list(agent.tools), rules=json.dumps(agent.rules), dialogue="{}",
        context_budget="{}", peak_hours="09:00-12:00,25:00-26:00", timezone="Mars/Olympus",
    )  # fmt: skip
    response = client.post(url, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert sorted(errors) == ["peak_hours", "timezone"]
    assert "peak_hours[1]: '25:00-26:00' is not a window HH:MM-HH:MM" in errors["peak_hours"][0]
    assert "Unknown time zone 'Mars/Olympus'" in errors["timezone"][0]

    data.update(peak_hours="09:00-12:00, 22:00-02:00", timezone="Asia/Shanghai")
    assert client.post(url, data).status_code == 302
    agent.refresh_from_db()
    assert agent.peak_hours == ["09:00-12:00", "22:00-02:00"]
    assert agent.timezone == "Asia/Shanghai"


def test_tool_form_checks_sla_rate_and_quota(client, operator):
    url = reverse("admin:tools_tool_add")
    response = client.post(url, _tool_post(sla_rate="1.5", quota='{"calls": 0, "per": "week"}'))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "less than or equal to 1.0" in errors["sla_rate"][0]

    bad_quota = client.post(url, _tool_post(quota='{"calls": 5, "per": "week"}'))
    assert bad_quota.status_code == 200
    assert (
        "per: 'week' is not one of minute, hour, day"
        in (bad_quota.context["adminform"].form.errors["quota"][0])
    )
    assert client.post(url, _tool_post(quota='"lots"')).status_code == 200

    created = client.post(url, _tool_post(sla_rate="0.95", quota='{"calls": 5000, "per": "day"}'))
    assert created.status_code == 302
    tool = Tool.objects.get(name="lookup")
    assert tool.sla_rate == 0.95 and tool.quota == {"calls": 5000, "per": "day"}

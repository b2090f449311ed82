"""Every human action (and each decision the system makes in a person's place) is one audit
entry, written by the service that carries it out: who, what, which object, before/after."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import Approval
from audit.models import AuditEntry
from billing.services import account_settings_update, credits_adjust, credits_grant
from engine import session_run
from record.models import Agent, ModelEndpoint, Session
from runtime.breaker import model_breaker
from sessions.services import (
    approval_decide,
    approvals_expire_due,
    message_post,
    review_answer,
    session_cancel,
    session_force_finish,
    session_fork,
    session_hand_back,
    session_operator_reply,
    session_operator_tool_run,
    session_resume,
)
from tests.factories import AgentFactory, ToolFactory, UserFactory
from tools.execution import tool_breaker
from tools.models import Tool
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _pending(make_session: Any, content: str = "refund A1 80") -> Approval:
    session = make_session()
    message_post(session=session, content=content)
    session_run(session_id=session.pk)
    return Approval.objects.get(session=session)


def _only(action: str) -> AuditEntry:
    [entry] = AuditEntry.objects.filter(action=action)
    return entry


# --- Approvals ------------------------------------------------------------------------


def test_an_approval_in_the_admin_is_an_entry_by_that_person(approver, make_session):
    user, _ = approver
    approval = _pending(make_session)
    approval_decide(
        approval_id=approval.pk, approve=True, user=user, groups=["approvers"], comment="ok"
    )
    entry = _only("approval.approved")
    assert (entry.actor, entry.user_id, entry.key_prefix) == ("admin:alice", user.pk, "")
    assert (entry.object_type, entry.object_id) == ("approvals.approval", str(approval.pk))
    assert entry.owner_id == approval.session.owner_id and entry.reason == "ok"
    assert entry.data["tool"] == "refund" and entry.data["session"] == str(approval.session_id)


def test_a_rejection_over_the_api_names_the_key(approver, make_session):
    user, key = approver
    approval = _pending(make_session)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = client.post(
        f"/api/v1/approvals/{approval.pk}/reject/", {"comment": "no"}, format="json"
    )
    assert response.status_code == 200
    entry = _only("approval.rejected")
    assert (entry.actor, entry.user_id, entry.key_prefix) == ("api:alice", user.pk, key[:10])
    assert entry.reason == "no"


def test_an_edit_records_the_arguments_before_and_after(approver, make_session):
    user, _ = approver
    approval = _pending(make_session)
    approval_decide(
        approval_id=approval.pk, approve=True, user=user, groups=["approvers"],
        arguments={"order": "A1", "amount": 20},
    )  # fmt: skip
    entry = _only("approval.edited")
    assert (entry.before, entry.after) == ({"arguments.amount": "80"}, {"arguments.amount": 20})


def test_the_deadline_policy_is_an_entry_by_the_system(make_session):
    approval = _pending(make_session)
    Approval.objects.filter(pk=approval.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert approvals_expire_due() == [str(approval.pk)]
    entry = _only("approval.expired")
    assert (entry.actor, entry.user_id) == ("system", None)
    assert entry.data["outcome"] == "expired" and entry.data["policy"] == "reject"
    assert entry.reason == "no decision before the deadline"


def test_a_refused_decision_writes_no_entry(approver, make_session):
    user, _ = approver
    approval = _pending(make_session)
    approval_decide(
        approval_id=approval.pk, approve=False, user=user, groups=["approvers"], comment="x"
    )
    with pytest.raises(Exception, match="already rejected"):
        approval_decide(approval_id=approval.pk, approve=True, user=user, groups=["approvers"])
    assert AuditEntry.objects.filter(object_type="approvals.approval").count() == 1


def test_a_review_answer_is_an_entry(approver, make_session):
    user, _ = approver
    approval = _pending(make_session)
    Approval.objects.filter(pk=approval.pk).update(kind="recovery_review")
    review_answer(approval_id=approval.pk, answer="not_taken", user=user, groups=["approvers"])
    entry = _only("review.answered")
    assert entry.data["answer"] == "not_taken" and entry.actor == "admin:alice"


# --- Sessions: fork, resume, cancel, takeover -------------------------------------------


@pytest.fixture
def finished(make_session: Any) -> Session:
    session = make_session()
    message_post(session=session, content="hello")
    session_run(session_id=session.pk)
    session = Session.objects.get(pk=session.pk)
    assert session.state == "finished"
    return session


def test_a_fork_is_an_entry_on_the_source(finished):
    operator = UserFactory(username="op")
    fork = session_fork(session=finished, step=finished.step, actor="admin:op")
    entry = _only("session.fork")
    assert (entry.object_id, entry.user_id, entry.owner_id) == (
        str(finished.pk), operator.pk, finished.owner_id,
    )  # fmt: skip
    assert entry.data["fork"] == str(fork.pk) and entry.data["at_step"] == finished.step


def test_a_resume_is_an_entry(finished):
    Session.objects.filter(pk=finished.pk).update(state="error", last_error="boom")
    session_resume(session=Session.objects.get(pk=finished.pk), actor="api:customer")
    entry = _only("session.resume")
    assert entry.actor == "api:customer" and entry.data["error"] == "boom"


def test_a_cancel_is_an_entry_and_nothing_to_cancel_is_none(approver, make_session, finished):
    approval = _pending(make_session)
    assert session_cancel(session=approval.session, reason="stop it", actor="admin:op")
    entry = _only("session.cancel")
    assert entry.reason == "stop it" and entry.data["from_state"] == "awaiting_approval"
    assert not session_cancel(session=finished, actor="admin:op")
    assert AuditEntry.objects.filter(action="session.cancel").count() == 1


def test_each_takeover_control_is_an_entry(finished):
    session_operator_reply(session=finished, content="Operator here.", actor="admin:op")
    session_operator_tool_run(
        session=Session.objects.get(pk=finished.pk),
        tool_name="lookup",
        arguments={"order": "A1"},
        actor="admin:op",
    )
    session_run(session_id=finished.pk)
    session_hand_back(session=Session.objects.get(pk=finished.pk), actor="admin:op")
    reply, tool_run, hand_back = (
        _only("session.reply"), _only("session.tool_run"), _only("session.hand_back"),
    )  # fmt: skip
    assert reply.data["chars"] == len("Operator here.") and "Operator" not in str(reply.data)
    assert tool_run.after == {"arguments": {"order": "A1"}} and tool_run.data["tool"] == "lookup"
    assert hand_back.data["from_state"] == "finished"


def test_a_force_finish_is_an_entry_naming_the_approvals_it_closed(make_session):
    approval = _pending(make_session)
    session_force_finish(session=approval.session, content="Done by hand.", actor="admin:op")
    entry = _only("session.force_finish")
    assert entry.data["approvals_cancelled"] == [str(approval.pk)]
    assert entry.data["from_state"] == "awaiting_approval" and "Done" not in str(entry.data)


# --- Credits ------------------------------------------------------------------------------


def test_credit_grants_adjustments_and_settings_are_entries():
    owner = UserFactory(username="payer")
    credits_grant(owner_id=owner.pk, points=100, actor="admin:op", note="welcome")
    credits_adjust(owner_id=owner.pk, delta=-30, actor="admin:op", note="refund")
    account_settings_update(owner_id=owner.pk, daily_cap=50, actor="admin:op")
    account_settings_update(owner_id=owner.pk, daily_cap=50, actor="admin:op")  # no change
    grant, adjust = _only("credits.grant"), _only("credits.adjust")
    assert (grant.before, grant.after, grant.reason) == (
        {"balance": 0},
        {"balance": 100},
        "welcome",
    )
    assert (adjust.before, adjust.after, adjust.data) == (
        {"balance": 100},
        {"balance": 70},
        {"points": -30},
    )
    settings_entry = _only("credits.settings")
    assert (settings_entry.before, settings_entry.after) == ({"daily_cap": None}, {"daily_cap": 50})
    assert {grant.owner_id, adjust.owner_id, settings_entry.owner_id} == {owner.pk}


# --- The admin's edits of agents, tools, model endpoints and workflows ----------------------


@pytest.fixture
def root() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-not-used")
    client = Client()
    client.force_login(user)
    return client


def test_an_agent_added_changed_and_deleted_in_the_admin(root, rules_model):
    ToolFactory(name="lookup")
    add = reverse("admin:agent_sessions_agent_add")
    form = {
        "slug": "helper", "name": "Helper", "enabled": "on", "system_prompt": "Help.",
        "model": rules_model.pk, "context_window": 8000, "max_iterations": 8,
        "repeat_call_limit": 3, "same_result_limit": 3, "step_timeout_s": 60,
        "turn_timeout_s": 300, "tools": ["lookup"], "rules": "[]", "dialogue": "{}",
        "context_budget": "{}", "candidate_percent": 0, "busy_message": "busy",
        "max_depth": 2, "routing": "{}",
    }  # fmt: skip
    response = root.post(add, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    agent = Agent.objects.get(slug="helper")
    added = _only("admin.add")
    assert added.object_id == str(agent.pk) and added.after["slug"] == "helper"
    assert added.actor == "admin:root" and added.before is None

    change = reverse("admin:agent_sessions_agent_change", args=[agent.pk])
    assert root.post(change, {**form, "max_iterations": 4}).status_code == 302
    changed = _only("admin.change")
    assert (changed.before, changed.after) == ({"max_iterations": 8}, {"max_iterations": 4})

    delete = reverse("admin:agent_sessions_agent_delete", args=[agent.pk])
    assert root.post(delete, {"post": "yes"}).status_code == 302
    deleted = _only("admin.delete")
    assert deleted.before["slug"] == "helper" and deleted.after is None


def test_a_tools_enabled_box_in_the_list_and_its_breaker_reset(root):
    tool = ToolFactory(name="pay", side_effects=True)
    changelist = reverse("admin:tools_tool_changelist")
    form = {
        "form-TOTAL_FORMS": 1,
        "form-INITIAL_FORMS": 1,
        "form-0-id": tool.pk,
        "_save": "Save",
    }  # fmt: skip  (the box left unticked: disabled)
    assert root.post(changelist, form).status_code == 302
    changed = _only("admin.change")
    assert (changed.object_type, changed.before, changed.after) == (
        "tools.tool", {"enabled": True}, {"enabled": False},
    )  # fmt: skip

    breaker = tool_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure("pay")
    try:
        reset = {"action": "reset_breaker", "_selected_action": [tool.pk], "index": 0}
        root.post(changelist, reset)
        entry = _only("breaker.reset")
        assert breaker.state("pay").state == "closed"
        assert (entry.object_type, entry.before, entry.after) == (
            "tools.tool", {"breaker": "open"}, {"breaker": "closed"},
        )  # fmt: skip
    finally:
        breaker.reset("pay")


def test_a_model_endpoints_edit_and_breaker_reset(root, rules_model):
    change = reverse("admin:agent_sessions_modelendpoint_change", args=[rules_model.pk])
    page = root.get(change)
    form = {
        field.name: field.value() if field.value() is not None else ""
        for field in page.context["adminform"].form
    }
    form = {k: v for k, v in form.items() if v is not False}
    form.update(model="rules-v2", options="{}")
    assert root.post(change, form).status_code == 302
    changed = _only("admin.change")
    assert changed.object_type == "agent_sessions.modelendpoint"
    assert changed.after == {"model": "rules-v2"}

    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(rules_model.name)
    try:
        changelist = reverse("admin:agent_sessions_modelendpoint_changelist")
        root.post(
            changelist,
            {"action": "reset_breaker", "_selected_action": [rules_model.pk], "index": 0},
        )
        assert _only("breaker.reset").before == {"breaker": "open"}
    finally:
        breaker.reset(rules_model.name)


WORKFLOW = """slug: audited
role: support
start: look
nodes:
  look: {kind: tool, tool: lookup, args: {order: "'A1'"}, next: end}
"""


def test_a_workflow_added_edited_disabled_and_deleted_in_the_admin(root, rules_model):
    ToolFactory(
        name="lookup", parameters={"type": "object", "properties": {"order": {"type": "string"}}}
    )
    add = reverse("admin:workflows_workflow_add")
    assert root.post(add, {"definition_yaml": WORKFLOW}).status_code == 302
    workflow = Workflow.objects.get(slug="audited")
    added = _only("admin.add")
    assert added.object_type == "workflows.workflow" and added.data == {"version": 1}
    assert "definition.nodes.look.tool" in added.after

    change = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    edited = WORKFLOW.replace("'A1'", "'A2'")
    assert root.post(change, {"definition_yaml": edited, "enabled": "on"}).status_code == 302
    changed = _only("admin.change")
    assert changed.before == {"definition.nodes.look.args.order": "'A1'"}
    assert changed.after == {"definition.nodes.look.args.order": "'A2'"}

    assert root.post(change, {"definition_yaml": edited}).status_code == 302  # unticked
    disabled = AuditEntry.objects.filter(action="admin.change").latest("id")
    assert (disabled.before, disabled.after) == ({"enabled": True}, {"enabled": False})

    delete = reverse("admin:workflows_workflow_delete", args=[workflow.pk])
    assert root.post(delete, {"post": "yes"}).status_code == 302
    assert not Workflow.objects.filter(pk=workflow.pk).exists()
    assert _only("admin.delete").before["slug"] == "audited"


def test_an_admin_save_that_fails_validation_writes_nothing(root, rules_model):
    tool = ToolFactory(name="strict")
    change = reverse("admin:tools_tool_change", args=[tool.pk])
    response = root.post(change, {"name": "strict", "parameters": "[]", "kind": "python"})
    assert response.status_code == 200  # the form with its errors
    assert not AuditEntry.objects.exists()
    assert Tool.objects.get(pk=tool.pk).parameters == tool.parameters
    assert not ModelEndpoint.objects.filter(name=f"x-{uuid.uuid4().hex}").exists()


def test_an_agent_created_outside_the_admin_is_not_an_admin_entry(rules_model):
    AgentFactory(slug="config-made", model=rules_model)
    assert not AuditEntry.objects.exists()


def test_a_fork_resume_and_cancel_over_the_api_name_the_key(finished):
    from accounts.services import api_key_create

    issued = api_key_create(username=finished.owner.username, roles=["support"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
    base = f"/api/v1/sessions/{finished.pk}"
    assert (
        client.post(f"{base}/fork/", {"checkpoint": finished.step}, format="json").status_code
        == 201
    )
    Session.objects.filter(pk=finished.pk).update(state="error", last_error="boom")
    assert client.post(f"{base}/resume/", {}, format="json").status_code == 200
    client.post(f"{base}/cancel/", {}, format="json")
    for action in ("session.fork", "session.resume", "session.cancel"):
        entry = _only(action)
        assert entry.key_prefix == issued.raw[:10], action
        assert (entry.actor, entry.user_id) == (f"api:{finished.owner.username}", finished.owner_id)

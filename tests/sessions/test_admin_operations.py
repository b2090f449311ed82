"""The operator's admin actions and views added for models, tools and durability."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils.html import strip_tags

from engine import session_run
from record.models import Checkpoint, ModelCall, ModelEndpoint, Session, ToolCall, Transition
from runtime.breaker import model_breaker
from sessions import services
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import SessionFactory, UserFactory
from tools.models import Tool

# session_run closes its connection between steps, so these tests need real transactions.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-not-used")
    client.force_login(user)
    return user


@pytest.fixture
def finished_session():
    demo_install()
    session = SessionFactory(agent__slug="order-support", owner=UserFactory(username="alice"))
    services.message_post(session=session, content=DEMO_REQUEST)
    assert session_run(session_id=session.pk).stopped == "idle"
    session.refresh_from_db()
    return session


def test_the_session_list_shows_which_models_each_session_used(client, operator, finished_session):
    page = client.get(reverse("admin:agent_sessions_session_changelist"))
    assert page.status_code == 200
    row = next(s for s in page.context["cl"].result_list if s.pk == finished_session.pk)
    assert page.context["cl"].model_admin.models_used(row) == "rules"
    # ...and it can be filtered by model.
    filtered = client.get(
        reverse("admin:agent_sessions_session_changelist"), {"model_calls__endpoint_name": "rules"}
    )
    assert [s.pk for s in filtered.context["cl"].result_list] == [finished_session.pk]


def test_model_calls_are_listed_read_only(client, operator, finished_session):
    page = client.get(reverse("admin:agent_sessions_modelcall_changelist"))
    assert page.status_code == 200
    assert (
        page.context["cl"].result_count
        == ModelCall.objects.filter(session=finished_session).count()
        == 4
    )
    call = ModelCall.objects.filter(session=finished_session).first()
    assert (
        client.get(reverse("admin:agent_sessions_modelcall_change", args=[call.pk])).status_code
        == 200
    )
    assert client.get(reverse("admin:agent_sessions_modelcall_add")).status_code == 403


def test_the_endpoint_list_shows_and_resets_the_circuit_breaker(client, operator):
    endpoint = ModelEndpoint.objects.create(
        name="flaky-endpoint", api="openai", base_url="http://127.0.0.1:9/v1"
    )
    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(endpoint.name)
    url = reverse("admin:agent_sessions_modelendpoint_changelist")
    page = client.get(url)
    badge = page.context["cl"].model_admin.breaker(endpoint)
    assert strip_tags(badge).startswith("open until ")
    # Only the state is kept on one line: the time may wrap, so the column stays narrow.
    assert '<span style="white-space:nowrap">open</span> until' in badge
    client.post(url, {"action": "reset_breaker", "_selected_action": [endpoint.pk]})
    assert breaker.state(endpoint.name).state == "closed"
    assert ">closed<" in client.get(url).context["cl"].model_admin.breaker(endpoint)


def test_fork_from_a_checkpoint_in_the_admin(client, operator, finished_session):
    middle = (
        Checkpoint.objects.filter(session=finished_session, context__phase="tool_results")
        .order_by("step")
        .first()
    )
    preview = client.post(
        reverse("admin:agent_sessions_checkpoint_changelist"),
        {"action": "fork_from_checkpoint", "_selected_action": [middle.pk]},
    )
    # First the preview: the checkpoint, and the notifications sent after it, which a
    # continued run may send again; nothing is forked yet.
    html = preview.content.decode()
    assert preview.status_code == 200 and "fork-preview" in html
    assert f"Fork session {str(finished_session.pk)[:8]} at step {middle.step}?" in html
    effects = set(Tool.objects.filter(side_effects=True).values_list("name", flat=True))
    after = ToolCall.objects.filter(session=finished_session, step__gt=middle.step)
    sent_after = sum(1 for call in after if call.tool_name in effects)
    assert sent_after == 4  # three notifications and the report
    assert f"May be repeated: {sent_after} side-effecting calls after this checkpoint" in html
    assert "send_notification" in html and "took effect" in html
    assert not Session.objects.filter(forked_from=finished_session).exists()
    client.post(
        reverse("admin:agent_sessions_session_operate", args=[finished_session.pk]),
        {"action": f"fork@{middle.step}", "confirm": "yes"},
    )
    fork = Session.objects.get(forked_from=finished_session)
    assert fork.forked_at_step == middle.step
    assert Transition.objects.get(session=fork, trigger="fork").actor == "admin:op"
    # The original is untouched.
    assert Session.objects.get(pk=finished_session.pk).version == finished_session.version


def test_resume_a_failed_run_in_the_admin(client, operator, finished_session):
    Session.objects.filter(pk=finished_session.pk).update(state="error")
    url = reverse("admin:agent_sessions_session_changelist")
    client.post(url, {"action": "resume_failed_run", "_selected_action": [finished_session.pk]})
    resumed = Session.objects.get(pk=finished_session.pk)
    assert resumed.state == "tool_loop" and resumed.resume_check
    assert Transition.objects.filter(session=resumed, trigger="resume", actor="admin:op").exists()
    # A session not in error is refused with a message, and nothing changes.
    page = client.post(
        url, {"action": "resume_failed_run", "_selected_action": [resumed.pk]}, follow=True
    )
    assert "only a session in error can be resumed" in page.content.decode()
    assert Session.objects.get(pk=resumed.pk).version == resumed.version


def test_the_session_page_shows_checkpoint_counts_and_sizes(client, operator, finished_session):
    page = client.get(reverse("admin:agent_sessions_session_change", args=[finished_session.pk]))
    count = Checkpoint.objects.filter(session=finished_session).count()
    assert f"{count} checkpoints" in page.content.decode()


def test_the_checkpoint_list_says_what_happened_at_each_step(client, operator, finished_session):
    page = client.get(
        reverse("admin:agent_sessions_checkpoint_changelist"), {"q": str(finished_session.pk)}
    )
    html = page.content.decode()
    assert "What happened" in html and "Last message" in html
    # A tool step names its calls and their outcome; a model step the calls it asked for.
    assert "tool results: send_notification=success, send_notification=success" in html
    assert "tool intent: send_notification, send_notification, send_notification" in html
    assert "#4 assistant: asks for send_notification" in html
    # Each with its message (who said it, and its start) and its time to the second.
    assert "#1 user: find last week" in html
    first = Checkpoint.objects.filter(session=finished_session).order_by("step").first()
    assert first.created_at.strftime("%Y-%m-%d %H:%M:%S") in html

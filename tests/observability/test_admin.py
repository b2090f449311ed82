"""Prompt samples: stored for the sampled share of calls, shown only to whom may see them."""

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from llm.types import ChatMessage, ChatRequest, ChatResponse
from observability import prompts
from observability.models import PromptSample

pytestmark = pytest.mark.django_db

SECRET_PROMPT = "my card is 4111 1111 1111 1111"


def _record(owner_id: int | None = None, prompt: str = SECRET_PROMPT) -> PromptSample:
    session_id = uuid.uuid4()
    prompts.prompt_sample_record(
        session_id=session_id, owner_id=owner_id, turn=1, iteration=1, endpoint="main",
        model="m-1", trace_id="",
        request=ChatRequest(messages=(ChatMessage(role="user", content=prompt),), agent_config={"rules": []}),
        response=ChatResponse(text="noted"), input_tokens=9, output_tokens=2,
    )  # fmt: skip
    return PromptSample.objects.get(session_id=session_id)


def test_the_sample_rate_decides(settings) -> None:
    settings.PROMPT_SAMPLE_RATE = 0
    assert not any(prompts.sampled() for _ in range(200))
    settings.PROMPT_SAMPLE_RATE = 1
    assert all(prompts.sampled() for _ in range(200))
    settings.PROMPT_SAMPLE_RATE = 0.5
    assert 40 < sum(prompts.sampled() for _ in range(200)) < 160


def test_a_sample_keeps_the_call_whole_without_the_agent_config() -> None:
    sample = _record()
    assert sample.request["messages"][0]["content"] == SECRET_PROMPT
    assert "agent_config" not in sample.request
    assert sample.response["text"] == "noted"


def _staff(username: str, *perms: str, superuser: bool = False) -> Client:
    user = get_user_model().objects.create_user(
        username=username, password="pw", is_staff=True, is_superuser=superuser
    )
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_only_superusers_and_holders_of_the_permission_see_samples() -> None:
    sample = _record(owner_id=get_user_model().objects.create_user(username="reader").pk)
    page = f"/admin/observability/promptsample/{sample.pk}/change/"
    listing = "/admin/observability/promptsample/"
    plain = _staff("operator")
    assert plain.get(listing).status_code == 403
    assert plain.get(page).status_code == 403
    assert "promptsample" not in plain.get("/admin/").content.decode()
    reader = _staff("reader-staff", "view_promptsample", "view_prompt_content")
    PromptSample.objects.filter(pk=sample.pk).update(
        owner=get_user_model().objects.get(username="reader-staff")
    )
    readers = (reader, _staff("root", superuser=True))
    for client in readers:
        assert client.get(listing).status_code == 200
        shown = client.get(page)
        assert shown.status_code == 200
        assert SECRET_PROMPT in shown.content.decode()
    # The view permission alone lists the samples; what was sent stays masked.
    lister = _staff("lister", "view_promptsample")
    PromptSample.objects.filter(pk=sample.pk).update(
        owner=get_user_model().objects.get(username="lister")
    )
    assert lister.get(listing).status_code == 200
    masked = lister.get(page).content.decode()
    assert "m-1" in masked  # the model it went to
    assert SECRET_PROMPT not in masked and "noted" not in masked
    assert "hidden: needs the view_prompt_content permission" in masked
    # Read-only: nobody adds or edits one.
    assert (
        _staff("root2", superuser=True).get("/admin/observability/promptsample/add/").status_code
        == 403
    )


def test_a_staff_user_reaches_only_their_own_tenants_samples() -> None:
    """Issue 43: a staff user who owns nothing read three users' full prompts."""
    users = get_user_model().objects
    victims = [users.create_user(username=f"victim{i}") for i in range(3)]
    samples = [_record(owner_id=v.pk, prompt=f"{SECRET_PROMPT} of {v.username}") for v in victims]
    nobody = _staff("nobody", "view_promptsample", "view_prompt_content")
    listing = nobody.get("/admin/observability/promptsample/")
    assert listing.status_code == 200
    assert listing.context["cl"].result_count == 0
    for sample in samples:
        page = f"/admin/observability/promptsample/{sample.pk}/change/"
        shown = nobody.get(page)
        # The admin's "does not exist": back to the index, nothing of the sample read.
        assert shown.status_code == 302 and shown.url == "/admin/"
        assert SECRET_PROMPT not in nobody.get(page, follow=True).content.decode()
        history = nobody.get(f"/admin/observability/promptsample/{sample.pk}/history/")
        assert history.status_code == 302
        # Searching by the session's id finds nothing either.
        found = nobody.get(listing.request["PATH_INFO"], {"q": str(sample.session_id)})
        assert found.context["cl"].result_count == 0
    # Their own tenant's sample, they see; a superuser sees every one.
    mine = _record(owner_id=users.get(username="nobody").pk, prompt="my own prompt")
    own_listing = nobody.get("/admin/observability/promptsample/")
    assert [row.pk for row in own_listing.context["cl"].result_list] == [mine.pk]
    assert (
        "my own prompt"
        in nobody.get(f"/admin/observability/promptsample/{mine.pk}/change/").content.decode()
    )
    root = _staff("root", superuser=True)
    assert root.get("/admin/observability/promptsample/").context["cl"].result_count == 4
    for sample in samples:
        page = root.get(f"/admin/observability/promptsample/{sample.pk}/change/")
        assert page.status_code == 200 and SECRET_PROMPT in page.content.decode()


def test_a_sample_without_an_owner_is_a_superusers_only() -> None:
    orphan = _record(owner_id=None)
    staff = _staff("staff", "view_promptsample", "view_prompt_content")
    assert staff.get("/admin/observability/promptsample/").context["cl"].result_count == 0
    assert staff.get(f"/admin/observability/promptsample/{orphan.pk}/change/").status_code == 302
    root = _staff("root", superuser=True)
    assert root.get(f"/admin/observability/promptsample/{orphan.pk}/change/").status_code == 200


# The engine's run opens connections of its own: they must see the committed rows.
@pytest.mark.django_db(transaction=True)
def test_the_engine_keeps_the_sessions_owner_on_its_samples(settings, monkeypatch) -> None:
    from engine import session_run
    from record.models import Session
    from sessions.services import message_post
    from tests.factories import AgentFactory, ModelEndpointFactory

    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    settings.PROMPT_SAMPLE_RATE = 1
    agent = AgentFactory(
        slug="sampled", model=ModelEndpointFactory(name="rules", api="rules", options={}),
        rules=[{"answer": "Noted."}],
    )  # fmt: skip
    owner = get_user_model().objects.create_user(username="tenant")
    session = Session.objects.create(agent=agent, owner=owner, role="support")
    message_post(session=session, content=SECRET_PROMPT)
    session_run(session_id=session.pk)
    [sample] = PromptSample.objects.filter(session_id=session.pk)
    assert sample.owner_id == owner.pk

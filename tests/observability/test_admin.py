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


def _record() -> PromptSample:
    session_id = uuid.uuid4()
    prompts.prompt_sample_record(
        session_id=session_id, turn=1, iteration=1, endpoint="main", model="m-1", trace_id="",
        request=ChatRequest(messages=(ChatMessage(role="user", content=SECRET_PROMPT),), agent_config={"rules": []}),
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
    sample = _record()
    page = f"/admin/observability/promptsample/{sample.pk}/change/"
    listing = "/admin/observability/promptsample/"
    plain = _staff("operator")
    assert plain.get(listing).status_code == 403
    assert plain.get(page).status_code == 403
    assert "promptsample" not in plain.get("/admin/").content.decode()
    readers = (
        _staff("reader", "view_promptsample", "view_prompt_content"),
        _staff("root", superuser=True),
    )
    for client in readers:
        assert client.get(listing).status_code == 200
        shown = client.get(page)
        assert shown.status_code == 200
        assert SECRET_PROMPT in shown.content.decode()
    # The view permission alone lists the samples; what was sent stays masked.
    lister = _staff("lister", "view_promptsample")
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

"""Naming a run webhook (the egress policy decides, a 400 names the field) and the outbox row
the turn's final commit writes: one per turn, for the session's webhook or the message's."""

import pytest

from engine import session_run
from hooks.models import WebhookDelivery
from hooks.outbox import webhook_url_check
from record.errors import InvalidInput
from sessions.services import message_post, message_post_for_owner, session_create
from tests.factories import AgentFactory, ModelEndpointFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"url": "http://127.0.0.1:9/x"}, "loopback"),
        ({"url": "http://169.254.169.254/latest/meta-data"}, "metadata"),
        ({"url": "http://10.1.2.3/"}, "private"),
        ({"url": "http://[::1]/"}, "loopback"),
        ({"url": "http://0x7f.1/"}, "loopback"),  # the resolver reads numeric forms too
        ({"url": "ftp://example.com/"}, "http or https"),
        ({"url": "http://user:pw@example.com/"}, "credentials"),
        ({"url": "http://" + "a" * 600}, "http or https"),
        ({"url": 5}, "one key, url"),
        ({"url": "https://x.example", "secret": "s"}, "one key, url"),
        ("https://x.example", "one key, url"),
        ({"url": "http://no-such-host.invalid/"}, "does not resolve"),
    ],
)
def test_a_webhook_the_policy_or_the_shape_refuses_names_the_field(settings, value, says):
    settings.EGRESS_ALLOW = []
    with pytest.raises(InvalidInput) as caught:
        webhook_url_check(value, field="webhook")
    assert says in caught.value.message
    assert caught.value.details["field"].startswith("webhook")


def test_the_metadata_address_is_refused_even_inside_an_allowed_range(settings):
    settings.EGRESS_ALLOW = ["169.254.0.0/16"]
    with pytest.raises(InvalidInput, match="metadata"):
        webhook_url_check({"url": "http://169.254.169.254/"}, field="webhook")
    assert webhook_url_check({"url": "http://169.254.1.1/"}, field="webhook")


def _agent() -> str:
    return AgentFactory(model=ModelEndpointFactory(name="rules", api="rules", options={})).slug


@pytest.mark.django_db(transaction=True)
def test_each_turn_of_a_session_with_a_webhook_writes_one_delivery():
    owner = UserFactory()
    session = session_create(
        owner=owner,
        agent_slug=_agent(),
        key_roles=["support"],
        webhook={"url": "http://127.0.0.1:9/hooks"},
    )
    for text in ("one", "two"):
        message_post(session=session, content=text)
        assert session_run(session_id=session.pk).stopped == "idle"
    rows = list(WebhookDelivery.objects.filter(session=session).order_by("turn"))
    assert [(r.turn, r.url, r.status, r.finished["outcome"]) for r in rows] == [
        (1, "http://127.0.0.1:9/hooks", "pending", "ok"),
        (2, "http://127.0.0.1:9/hooks", "pending", "ok"),
    ]
    assert rows[0].finished["usage"].keys() == {"input_tokens", "output_tokens", "cost"}


@pytest.mark.django_db(transaction=True)
def test_a_message_webhook_is_for_its_own_turn_and_wins_over_the_sessions():
    owner = UserFactory()
    plain = session_create(owner=owner, agent_slug=_agent(), key_roles=["support"])
    posted = message_post_for_owner(
        session_id=plain.pk,
        owner_id=owner.pk,
        key_roles=["support"],
        content="first",
        webhook={"url": "http://127.0.0.1:9/first"},
    )
    assert session_run(session_id=plain.pk).stopped == "idle"
    message_post(session=plain, content="second, no webhook")
    assert session_run(session_id=plain.pk).stopped == "idle"
    assert list(WebhookDelivery.objects.filter(session=plain).values_list("turn", "url")) == [
        (1, "http://127.0.0.1:9/first")
    ]
    assert posted.created

    hooked = session_create(
        owner=owner,
        agent_slug=_agent(),
        key_roles=["support"],
        webhook={"url": "http://127.0.0.1:9/s"},
    )
    message_post_for_owner(
        session_id=hooked.pk,
        owner_id=owner.pk,
        key_roles=["support"],
        content="mine",
        webhook={"url": "http://127.0.0.1:9/m"},
    )
    assert session_run(session_id=hooked.pk).stopped == "idle"
    assert list(WebhookDelivery.objects.filter(session=hooked).values_list("url", flat=True)) == [
        "http://127.0.0.1:9/m"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_turn_without_any_webhook_writes_nothing():
    session = session_create(owner=UserFactory(), agent_slug=_agent(), key_roles=[])
    message_post(session=session, content="hi")
    assert session_run(session_id=session.pk).stopped == "idle"
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_queued_messages_webhook_waits_for_its_own_turn():
    owner = UserFactory()
    session = session_create(owner=owner, agent_slug=_agent(), key_roles=[])
    message_post(session=session, content="first")  # turn 1 starts; no worker ran it yet
    message_post_for_owner(
        session_id=session.pk,
        owner_id=owner.pk,
        key_roles=[],
        content="second",
        webhook={"url": "http://127.0.0.1:9/second"},
    )  # queued behind turn 1
    while session_run(session_id=session.pk).stopped != "idle":
        pass
    assert list(WebhookDelivery.objects.filter(session=session).values_list("turn", "url")) == [
        (2, "http://127.0.0.1:9/second")
    ]

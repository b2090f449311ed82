"""Delivering run webhooks (signed, once per turn, retried with backoff; hostile receivers)
and firing schedules (once per due time, the overlap policies, a failed start recorded)."""

import json
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from accounts.services import api_key_create
from billing.models import SpendDaily
from engine import session_run
from hooks.models import (
    FireStatus,
    Overlap,
    Schedule,
    ScheduleFire,
    WebhookDelivery,
)
from hooks.services import (
    SIGNATURE_HEADER,
    schedule_fire,
    schedule_problems,
    schedules_fire_due,
    webhook_deliver,
    webhooks_due,
)
from record.models import Session
from runtime.webhooks import signature_valid
from sessions.services import message_post, session_create
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, UserFactory
from workflows.selectors import definition_check
from workflows.services import workflow_apply

from .conftest import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def _turn_with_webhook(url: str, turns: int = 1) -> Session:
    agent = AgentFactory(model=ModelEndpointFactory(name="rules", api="rules", options={}))
    session = session_create(
        owner=UserFactory(), agent_slug=agent.slug, key_roles=[], webhook={"url": url}
    )
    for i in range(turns):
        message_post(session=session, content=f"hello {i}")
        assert session_run(session_id=session.pk).stopped == "idle"
    return session


def _delivery(session: Session, turn: int = 1) -> WebhookDelivery:
    return WebhookDelivery.objects.get(session=session, turn=turn)


def test_a_turns_outcome_is_posted_signed_with_its_idempotency_key_once(
    receiver: Receiver, settings
):
    settings.RUN_WEBHOOK_SECRET = "run-secret"
    session = _turn_with_webhook(receiver.url)
    delivery = _delivery(session)

    done = webhook_deliver(delivery_id=delivery.pk)
    assert done is not None and (done.status, done.attempts) == ("sent", 1)
    assert webhook_deliver(delivery_id=delivery.pk) is None  # sent: never again
    [got] = receiver.received
    assert got.headers["idempotency-key"] == f"{session.pk}:1"
    assert signature_valid("run-secret", got.body, got.headers[SIGNATURE_HEADER.lower()])
    assert not signature_valid("another", got.body, got.headers[SIGNATURE_HEADER.lower()])
    body = json.loads(got.body)
    assert body == {
        "session": str(session.pk),
        "turn": 1,
        "outcome": "ok",
        "stop_reason": body["stop_reason"],
        "answer": "Echo: hello 0",
        "usage": body["usage"],
    }
    assert set(body["usage"]) == {"input_tokens", "output_tokens", "cost"}
    row = _delivery(session)
    assert (row.status, row.attempts, row.last_error, row.sent_at is not None) == (
        "sent",
        1,
        "",
        True,
    )


def test_a_failing_receiver_is_retried_with_backoff_then_given_up(receiver: Receiver, settings):
    settings.RUN_WEBHOOK_RETRIES = 2
    receiver.status = 503
    delivery = _delivery(_turn_with_webhook(receiver.url))

    first = webhook_deliver(delivery_id=delivery.pk)
    assert first is not None and (first.status, first.error) == ("failing", "HTTP 503")
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert row.next_attempt_at > timezone.now() and delivery.pk not in webhooks_due()
    assert webhook_deliver(delivery_id=delivery.pk) is None  # not due before its backoff
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery.pk in webhooks_due()
    second = webhook_deliver(delivery_id=delivery.pk)
    assert second is not None and (second.status, second.attempts) == ("failed", 2)
    assert len(receiver.received) == 2
    # Both attempts carried the same key: the receiver can tell a retry from a new turn.
    assert {r.headers["idempotency-key"] for r in receiver.received} == {f"{delivery.session_id}:1"}


def test_a_receiver_that_hangs_times_out_and_is_retried(receiver: Receiver, settings):
    settings.RUN_WEBHOOK_TIMEOUT_S = 0.3
    receiver.hang_s = 2
    delivery = _delivery(_turn_with_webhook(receiver.url))
    done = webhook_deliver(delivery_id=delivery.pk)
    assert done is not None and done.status == "failing" and "Timeout" in done.error
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert row.claimed_until is None and row.last_error == done.error


def test_a_redirect_inward_is_not_followed(receiver: Receiver):
    receiver.status, receiver.location = 307, "http://169.254.169.254/latest/meta-data/"
    delivery = _delivery(_turn_with_webhook(receiver.url))
    done = webhook_deliver(delivery_id=delivery.pk)
    assert done is not None and (done.status, done.error) == ("failing", "HTTP 307")
    assert len(receiver.received) == 1  # only the receiver itself was asked


def test_an_address_the_policy_refuses_at_delivery_is_given_up_at_once(
    receiver: Receiver, settings
):
    delivery = _delivery(_turn_with_webhook(receiver.url))
    settings.EGRESS_ALLOW = []  # the operator withdrew loopback after the run began
    done = webhook_deliver(delivery_id=delivery.pk)
    assert done is not None and done.status == "failed" and "egress refused" in done.error
    assert receiver.received == []


def test_a_delivery_held_by_a_killed_sender_is_sent_again_once_its_claim_runs_out(
    receiver: Receiver,
):
    delivery = _delivery(_turn_with_webhook(receiver.url))
    # A sender claimed it and died before recording anything.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        claimed_until=timezone.now() + timedelta(seconds=60), attempts=1
    )
    assert delivery.pk not in webhooks_due()
    assert webhook_deliver(delivery_id=delivery.pk) is None
    WebhookDelivery.objects.filter(pk=delivery.pk).update(claimed_until=timezone.now())
    assert delivery.pk in webhooks_due()
    done = webhook_deliver(delivery_id=delivery.pk)
    assert done is not None and (done.status, done.attempts) == ("sent", 2)


FLOW = """
slug: nightly
name: Nightly
role: ops
input: {type: object, properties: {days: {type: integer}}, required: [days]}
start: look
result: now
nodes:
  look: {kind: tool, tool: clock, args: {}, output: now, next: end}
"""


def _workflow() -> None:
    ModelEndpointFactory(name="rules", api="rules", options={})
    ToolFactory(name="clock", roles=["ops"])
    raw = yaml.safe_load(FLOW)
    workflow_apply(definition=definition_check(raw, where="t"), where="t", default_model="rules")


def _schedule(**fields: object) -> Schedule:
    values: dict[str, object] = {
        "name": "nightly",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "workflow": "nightly",
        "input": {"days": 1},
        "owner": UserFactory(username="ops"),
        "overlap": Overlap.SKIP,
        "next_due_at": timezone.now() - timedelta(minutes=5),
    }
    values.update(fields)
    return Schedule.objects.create(**values)


def test_a_due_time_that_passed_fires_once_however_often_it_is_looked_at():
    _workflow()
    schedule = _schedule()
    due = schedule.next_due_at
    assert schedules_fire_due() == 1
    assert schedules_fire_due() == 0
    assert schedule_fire(schedule_id=schedule.pk) == 0
    [run] = Session.objects.filter(metadata__schedule="nightly")
    assert run.metadata == {"schedule": "nightly", "due": due.isoformat()}
    assert run.workflow_version is not None and run.owner.username == "ops"
    [fire] = ScheduleFire.objects.all()
    assert (fire.status, fire.session_id, fire.due) == (FireStatus.STARTED, run.pk, due)
    # The next due time is the cron's next 02:00 in Berlin, after now.
    schedule.refresh_from_db()
    assert schedule.next_due_at > timezone.now()
    local = schedule.next_due_at.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (2, 0)
    # Set back by hand to the due time it fired: still once (the key is in the database).
    Schedule.objects.filter(pk=schedule.pk).update(next_due_at=due)
    assert schedules_fire_due() == 0
    assert Session.objects.filter(metadata__schedule="nightly").count() == 1


def _due_again(schedule: Schedule, minutes: int) -> None:
    Schedule.objects.filter(pk=schedule.pk).update(
        next_due_at=timezone.now() - timedelta(minutes=minutes)
    )


@pytest.mark.parametrize(
    ("overlap", "second"),
    [
        (Overlap.SKIP, FireStatus.SKIPPED),
        (Overlap.QUEUE, FireStatus.QUEUED),
        (Overlap.ALLOW, FireStatus.STARTED),
    ],
)
def test_a_due_time_while_the_last_run_is_going_follows_the_overlap_policy(overlap, second):
    _workflow()
    schedule = _schedule(overlap=overlap)
    assert schedules_fire_due() == 1  # started; no worker ran it: still going
    _due_again(schedule, 1)
    assert schedules_fire_due() == 1
    statuses = list(ScheduleFire.objects.order_by("due").values_list("status", flat=True))
    assert statuses == [FireStatus.STARTED, second]
    if overlap == Overlap.QUEUE:
        first = ScheduleFire.objects.order_by("due").first()
        assert first is not None and first.session_id is not None
        assert session_run(session_id=first.session_id).stopped == "idle"
        schedules_fire_due()  # the queued one starts now that the last run ended
        assert list(ScheduleFire.objects.order_by("due").values_list("status", flat=True)) == [
            FireStatus.STARTED,
            FireStatus.STARTED,
        ]
    runs = Session.objects.filter(metadata__schedule="nightly").count()
    assert runs == (1 if overlap == Overlap.SKIP else 2)


def test_an_agent_turn_schedule_opens_a_session_with_its_message_and_webhook():
    agent = AgentFactory(model=ModelEndpointFactory(name="rules", api="rules", options={}))
    _schedule(
        workflow="", agent=agent.slug, message="daily report", webhook_url="http://127.0.0.1:9/h"
    )
    assert schedules_fire_due() == 1
    [run] = Session.objects.filter(metadata__schedule="nightly")
    assert session_run(session_id=run.pk).stopped == "idle"
    assert run.messages.filter(role="assistant").get().content == "Echo: daily report"
    assert _delivery(run).url == "http://127.0.0.1:9/h"


TOLD = """
slug: told
role: ops
input: {type: object, properties: {days: {type: integer}}, required: [days]}
start: tell
result: answer
nodes:
  tell: {kind: llm, prompt: "Tell: {{ input.days }} days", output: answer, next: end}
rules:
  - {when: {user: "^Tell: (.*)$"}, answer: "Told {{ match.1 }}"}
"""


def test_a_scheduled_workflow_run_is_charged_to_the_schedules_key():
    ModelEndpointFactory(name="rules", api="rules", options={})
    raw = yaml.safe_load(TOLD)
    workflow_apply(definition=definition_check(raw, where="t"), where="t", default_model="rules")
    key = api_key_create(username="ops", roles=["ops"], name="nightly").api_key
    _schedule(workflow="told", owner=key.owner, api_key=key)
    assert schedules_fire_due() == 1
    [run] = Session.objects.filter(metadata__schedule="nightly")
    assert run.api_key_id == key.pk
    assert session_run(session_id=run.pk).stopped == "idle"
    run.refresh_from_db()
    assert run.state == "finished" and run.workflow_state["result"] == "Told 1 days"
    # The llm node's model call is in the key's spend, as a scheduled agent turn's is.
    spent = SpendDaily.objects.filter(owner=key.owner, api_key_id=key.pk)
    assert sum(row.model_calls for row in spent) == 1


def test_a_run_that_cannot_start_is_recorded_as_failed_and_the_schedule_moves_on():
    _workflow()
    schedule = _schedule(input={"days": "one"})  # not the workflow's input schema
    assert schedules_fire_due() == 1
    [fire] = ScheduleFire.objects.all()
    assert fire.status == FireStatus.FAILED and "days" in fire.error and fire.session is None
    schedule.refresh_from_db()
    assert schedule.next_due_at > timezone.now()


def test_a_schedules_problems_are_named_by_field(settings):
    settings.EGRESS_ALLOW = []
    assert schedule_problems(
        cron="0 2 * *",
        zone="Mars/Olympus",
        workflow="",
        agent="nobody",
        message="",
        webhook_url="http://127.0.0.1/x",
        known_agents=set(),
    ) == {
        "cron": "'0 2 * *' is not five fields (minute hour day month weekday)",
        "timezone": "unknown time zone 'Mars/Olympus' (an IANA name such as Europe/Berlin or UTC)",
        "agent": "unknown agent 'nobody'",
        "message": "required with an agent: the turn's user message",
        "webhook": "egress refused: 127.0.0.1 is a loopback address that EGRESS_ALLOW does not list",
    }
    assert schedule_problems(
        cron="* * * * *", zone="UTC", workflow="a", agent="b", message="m"
    ) == {"workflow": "name a workflow, or an agent with a message (one of the two)"}

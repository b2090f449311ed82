"""Schedules that fire once per due time, and the delivery of run webhooks.

Firing: a tick (beat, every SCHEDULES_TICK_S) looks at the schedules whose next due time
has passed. Each is fired in one short transaction holding its row: the fire's row (unique
per schedule and due time), the run it starts (or the overlap policy's verdict) and the next
due time commit together, so a due time fires once however many ticks, workers or restarts
see it, and times missed while everything was down come to one run, for the first of them.

Delivering: a task claims the outbox row (hooks.outbox) for a while, POSTs the outcome
signed, and marks it sent, or failing with the next attempt's time (1 s doubling up to
RUN_WEBHOOK_BACKOFF_MAX_S, RUN_WEBHOOK_RETRIES attempts). A worker killed mid-delivery
leaves a claim that runs out; the sweep sends the row again with the same Idempotency-Key,
which is how the receiver knows it has the turn already. No row lock is held over the POST.
"""

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import ApiKey
from record.errors import DomainError, InvalidInput
from record.models import Agent, Session
from record.states import State
from runtime.tasks import task_send
from runtime.webhooks import EgressRefused, WebhookFailed, signed_post
from sessions.services import message_post, session_create
from workflows.models import Workflow
from workflows.services import workflow_run_start

from .cron import cron_problem, fire_times, zone_problem
from .models import (
    DeliveryStatus,
    FireStatus,
    Overlap,
    Schedule,
    ScheduleFire,
    WebhookDelivery,
)
from .outbox import webhook_target_add, webhook_url_check
from .selectors import delivery_payload

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Run-Signature"
# A session in one of these has no turn going: the schedule's last run has ended.
ENDED = frozenset({State.IDLE, State.FINISHED, State.CANCELLED, State.ERROR})


def schedule_problems(
    *,
    cron: str,
    zone: str,
    workflow: str,
    agent: str,
    message: str,
    webhook_url: str = "",
    known_workflows: Collection[str] | None = None,
    known_agents: Collection[str] | None = None,
) -> dict[str, str]:
    """What is wrong with a schedule, by field (the config file's names); the known workflows
    and agents default to those in the database."""
    problems: dict[str, str] = {}
    if wrong := cron_problem(cron):
        problems["cron"] = wrong
    if wrong := zone_problem(zone):
        problems["timezone"] = wrong
    if bool(workflow) == bool(agent):
        problems["workflow"] = "name a workflow, or an agent with a message (one of the two)"
    elif workflow:
        known = (
            set(Workflow.objects.values_list("slug", flat=True))
            if known_workflows is None
            else known_workflows
        )
        if workflow not in known:
            problems["workflow"] = f"unknown workflow '{workflow}'"
    else:
        known = (
            set(Agent.objects.filter(workflow__isnull=True).values_list("slug", flat=True))
            if known_agents is None
            else known_agents
        )
        if agent not in known:
            problems["agent"] = f"unknown agent '{agent}'"
        if not message.strip():
            problems["message"] = "required with an agent: the turn's user message"
    if webhook_url:
        try:
            webhook_url_check({"url": webhook_url}, field="webhook")
        except InvalidInput as exc:
            problems["webhook"] = exc.message.removeprefix("webhook.url: ")
    return problems


def schedule_next_due(*, schedule: Schedule, after: datetime | None = None) -> datetime | None:
    """The schedule's first due time after `after` (now)."""
    found = fire_times(schedule.cron, schedule.timezone, after or timezone.now())
    return found[0] if found else None


def schedules_fire_due(*, now: datetime | None = None) -> int:
    """Fire every schedule that is due (and start what waits behind a finished run); the
    number of fires recorded."""
    now = now or timezone.now()
    due = Schedule.objects.filter(enabled=True, next_due_at__lte=now).values_list("pk", flat=True)
    waiting = ScheduleFire.objects.filter(
        status=FireStatus.QUEUED, schedule__enabled=True
    ).values_list("schedule_id", flat=True)
    fired = 0
    for pk in sorted({*due[:500], *waiting[:500]}):
        fired += schedule_fire(schedule_id=pk, now=now)
    return fired


def schedule_fire(*, schedule_id: int, now: datetime | None = None) -> int:
    """Fire one schedule if it is due; 1 if a fire was recorded, else 0. Another tick
    holding the row skips it (it fires it)."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk=schedule_id, enabled=True)
            .select_related("owner", "api_key")
            .first()
        )
        if schedule is None:
            return 0
        running = _running(schedule)
        queued = schedule.fires.filter(status=FireStatus.QUEUED).order_by("due").first()
        if queued is not None and not running:
            _start(schedule, queued)
            running = queued.status == FireStatus.STARTED
        due = schedule.next_due_at
        if due is None or due > now:
            return 0
        schedule.next_due_at = schedule_next_due(schedule=schedule, after=max(now, due))
        schedule.save(update_fields=["next_due_at", "updated_at"])
        if ScheduleFire.objects.filter(schedule=schedule, due=due).exists():
            return 0  # fired already (its next due time was set back by hand)
        fire = ScheduleFire(schedule=schedule, due=due, status=FireStatus.STARTED)
        if running and schedule.overlap == Overlap.SKIP:
            fire.status = FireStatus.SKIPPED
            fire.save()
        elif running and schedule.overlap == Overlap.QUEUE:
            fire.status = FireStatus.QUEUED
            fire.save()
        else:
            _start(schedule, fire)
    return 1


def _running(schedule: Schedule) -> bool:
    """Whether the schedule's last started run is still going."""
    last = (
        schedule.fires.filter(status=FireStatus.STARTED, session__isnull=False)
        .order_by("-due")
        .values_list("session__state", flat=True)
        .first()
    )
    return last is not None and last not in ENDED


def _start(schedule: Schedule, fire: ScheduleFire) -> None:
    """Start the fire's run in a savepoint, and save the fire: started with its session, or
    failed with the reason (an unknown workflow, a key without its role, a refused input)."""
    due = fire.due.isoformat()
    metadata = {"schedule": schedule.name, "due": due}
    key = schedule.api_key if schedule.api_key and schedule.api_key.is_active else None
    try:
        with transaction.atomic():
            session = _run_start(schedule, key, metadata, f"schedule:{schedule.name}:{due}")
            if schedule.webhook_url:
                webhook_target_add(session_id=session.pk, url=schedule.webhook_url)
    except DomainError as exc:
        fire.status, fire.error = FireStatus.FAILED, exc.message[:2000]
        logger.warning("schedule %s at %s did not start: %s", schedule.name, due, exc.message)
    else:
        fire.status, fire.session = FireStatus.STARTED, session
    fire.save()


def _run_start(
    schedule: Schedule, key: ApiKey | None, metadata: dict[str, Any], idempotency_key: str
) -> Session:
    if schedule.workflow:
        session, _ = workflow_run_start(
            owner=schedule.owner,
            # An operator's schedule without a key runs with the workflow's own role.
            key_roles=list(key.roles) if key else _workflow_role(schedule.workflow),
            slug=schedule.workflow,
            input=schedule.input,
            idempotency_key=idempotency_key,
            metadata=metadata,
            # Charged to the schedule's key, as a scheduled agent turn is.
            api_key_id=key.pk if key else None,
        )
        return session
    session = session_create(
        owner=schedule.owner,
        agent_slug=schedule.agent,
        key_roles=list(key.roles) if key else [],
        metadata=metadata,
        api_key_id=key.pk if key else None,
    )
    message_post(session=session, content=schedule.message, idempotency_key=idempotency_key)
    return session


def _workflow_role(slug: str) -> list[str]:
    role = Workflow.objects.filter(slug=slug).values_list("role", flat=True).first()
    return [role] if role else []


@dataclass(frozen=True)
class Delivered:
    status: str
    attempts: int
    error: str = ""


def _backoff(attempts: int) -> float:
    return float(min(2 ** max(attempts - 1, 0), settings.RUN_WEBHOOK_BACKOFF_MAX_S))


def webhook_deliver(*, delivery_id: int) -> Delivered | None:
    """Send one delivery if it is due and no one else holds it; what came of it (None: not
    due, sent or held)."""
    # The claim outlasts the POST's timeout: a live sender is never overtaken.
    hold = timedelta(seconds=settings.RUN_WEBHOOK_TIMEOUT_S * 2 + 5)
    now = timezone.now()
    claimed = WebhookDelivery.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
        pk=delivery_id,
        status__in=[DeliveryStatus.PENDING, DeliveryStatus.FAILING],
        next_attempt_at__lte=now,
    ).update(claimed_until=now + hold, attempts=F("attempts") + 1)
    if not claimed:
        return None
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    payload = delivery_payload(delivery=delivery)
    try:
        signed_post(
            url=delivery.url,
            payload=payload,
            secret=settings.RUN_WEBHOOK_SECRET,
            header=SIGNATURE_HEADER,
            timeout_s=settings.RUN_WEBHOOK_TIMEOUT_S,
            headers={"Idempotency-Key": f"{delivery.session_id}:{delivery.turn}"},
        )
    except EgressRefused as exc:
        # The policy will not change its mind on a retry: given up at once.
        return _failed(delivery, str(exc), final=True)
    except WebhookFailed as exc:
        return _failed(delivery, str(exc), final=delivery.attempts >= settings.RUN_WEBHOOK_RETRIES)
    WebhookDelivery.objects.filter(pk=delivery_id).update(
        status=DeliveryStatus.SENT, sent_at=timezone.now(), claimed_until=None, last_error=""
    )
    return Delivered(status=DeliveryStatus.SENT, attempts=delivery.attempts)


def _failed(delivery: WebhookDelivery, error: str, *, final: bool) -> Delivered:
    status = DeliveryStatus.FAILED if final else DeliveryStatus.FAILING
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status,
        claimed_until=None,
        last_error=error[:300],
        next_attempt_at=timezone.now() + timedelta(seconds=_backoff(delivery.attempts)),
    )
    logger.warning(
        "run webhook %s:%s attempt %d: %s",
        delivery.session_id,
        delivery.turn,
        delivery.attempts,
        error,
    )
    return Delivered(status=status, attempts=delivery.attempts, error=error)


def webhooks_due(*, limit: int = 200) -> list[int]:
    """Deliveries due and held by no one: new ones whose task was lost, retries whose
    backoff has passed, and those a killed worker held."""
    now = timezone.now()
    return list(
        WebhookDelivery.objects.filter(
            Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
            status__in=[DeliveryStatus.PENDING, DeliveryStatus.FAILING],
            next_attempt_at__lte=now,
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )


def webhooks_sweep() -> int:
    """A task for each due delivery; how many were sent to the workers."""
    due = webhooks_due()
    for pk in due:
        task_send("hooks.tasks.webhook_deliver", (pk,))
    return len(due)

"""`schedules:` in a config file: created and updated by name (its next fire time in the
report, in the audit entry), every wrong field named by entry and field, nothing written."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.services import api_key_create
from audit.models import AuditEntry
from configuration.services import ConfigInvalid, config_apply
from hooks.models import Schedule

pytestmark = pytest.mark.django_db

FLOW = {
    "slug": "nightly",
    "name": "Nightly",
    "role": "ops",
    "input": {"type": "object", "properties": {"days": {"type": "integer"}}},
    "start": "look",
    "result": "now",
    "nodes": {
        "look": {"kind": "tool", "tool": "clock", "args": {}, "output": "now", "next": "end"}
    },
}


def _document(**schedule: Any) -> dict[str, Any]:
    entry = {
        "name": "nightly-exceptions",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "workflow": "nightly",
        "input": {"days": 1},
        "owner": "ops",
        "overlap": "skip",
        **schedule,
    }
    return {
        "roles": [{"name": "ops"}],
        "models": [{"name": "main", "api": "rules"}],
        "tools": [
            {
                "name": "clock",
                "description": "The current date and time in UTC. Use when the user asks what "
                "time or day it is; do not use it for other time zones.",
                "result_description": "The time as {now: ISO 8601 timestamp}.",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
                "roles": ["ops"],
            }
        ],
        "agents": [{"slug": "support", "model": "main"}],
        "workflows": [FLOW],
        "schedules": [{k: v for k, v in entry.items() if v is not None}],
    }


def test_a_schedule_is_created_with_its_next_fire_time_then_updated_by_name():
    key = api_key_create(username="ops", roles=["ops"])
    report = config_apply(document=_document(api_key=key.api_key.prefix))
    [line] = [r for r in report if r.startswith("schedule ")]
    assert line.startswith("schedule nightly-exceptions: created; next ")
    row = Schedule.objects.get(name="nightly-exceptions")
    assert (row.workflow, row.input, row.owner.username, row.api_key_id) == (
        "nightly",
        {"days": 1},
        "ops",
        key.api_key.pk,
    )
    assert row.next_due_at is not None and row.next_due_at > timezone.now()
    assert row.next_due_at - timezone.now() <= timedelta(days=1, hours=1)

    # Re-applied unchanged: the due time stays; a new cron moves it.
    due = row.next_due_at
    report = config_apply(document=_document(api_key=key.api_key.prefix))
    assert any(r.startswith("schedule nightly-exceptions: unchanged") for r in report), report
    assert Schedule.objects.get(pk=row.pk).next_due_at == due
    report = config_apply(document=_document(api_key=key.api_key.prefix, cron="30 3 * * 1"))
    assert any(r.startswith("schedule nightly-exceptions: updated (cron)") for r in report)
    entry = AuditEntry.objects.filter(action="config.apply").order_by("-id").first()
    assert entry is not None
    assert entry.before["schedule nightly-exceptions"] == {"cron": "0 2 * * *"}
    assert entry.after["schedule nightly-exceptions"] == {"cron": "30 3 * * 1"}


def test_an_agent_turn_schedule_with_a_webhook():
    api_key_create(username="ops", roles=[])
    config_apply(
        document=_document(
            workflow=None,
            input=None,
            agent="support",
            message="Summarise yesterday",
            webhook={"url": "http://127.0.0.1:9/runs"},
        )
    )
    row = Schedule.objects.get()
    assert (row.agent, row.message, row.webhook_url) == (
        "support",
        "Summarise yesterday",
        "http://127.0.0.1:9/runs",
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"cron": "0 2 * *"}, ".cron: '0 2 * *' is not five fields"),
        ({"cron": "0 25 * * *"}, ".cron: '0 25 * * *' is not a valid cron expression"),
        ({"timezone": "Europe/Atlantis"}, ".timezone: unknown time zone 'Europe/Atlantis'"),
        ({"workflow": "nope"}, ".workflow: unknown workflow 'nope'"),
        ({"agent": "support", "message": "hi"}, ".workflow: name a workflow, or an agent"),
        ({"workflow": None, "agent": "support"}, ".message: required with an agent"),
        ({"workflow": None, "agent": "support", "message": "hi"}, ".input: only with a workflow"),
        ({"owner": "nobody"}, ".owner: unknown user 'nobody'"),
        ({"api_key": "ap_nope"}, ".api_key: no active key of ops with the prefix 'ap_nope'"),
        ({"overlap": "sometimes"}, ".overlap:"),
        ({"webhook": {"url": "http://169.254.169.254/"}}, ".webhook: egress refused"),
        ({"webhook": {"url": "http://x.example", "extra": 1}}, ".webhook:"),
        ({"every": "day"}, "every"),
    ],
)
def test_a_wrong_schedule_is_named_by_entry_and_field_and_nothing_is_written(change, error):
    api_key_create(username="ops", roles=["ops"])
    with pytest.raises(ConfigInvalid) as caught:
        config_apply(document=_document(**change))
    assert any(error in e for e in caught.value.errors), caught.value.errors
    assert any(e.startswith("schedules[0]") for e in caught.value.errors), caught.value.errors
    assert not Schedule.objects.exists()


def test_a_key_without_the_workflows_role_is_refused():
    key = api_key_create(username="ops", roles=["support"])
    with pytest.raises(ConfigInvalid) as caught:
        config_apply(document=_document(api_key=key.api_key.prefix))
    assert caught.value.errors == [
        "schedules[0] (nightly-exceptions).api_key: the key does not hold workflow nightly's role 'ops'"
    ]

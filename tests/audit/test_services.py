"""An audit entry commits with its action, and its log line names no value and no text."""

import logging
from decimal import Decimal

import pytest
from django.db import transaction

from audit.models import AuditAction, AuditEntry
from audit.services import admin_change_record, audit_record, row_snapshot, stored_snapshot
from tests.factories import ModelEndpointFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_entry_names_its_user_from_the_actor_and_logs_one_line_after_commit(caplog):
    alice = UserFactory(username="alice")
    caplog.set_level(logging.INFO, logger="audit")
    with transaction.atomic():
        entry = audit_record(
            action=AuditAction.CREDITS_GRANT,
            actor="admin:alice",
            object_type="billing.creditaccount",
            object_id=7,
            before={"balance": 10},
            after={"balance": Decimal("60")},
            reason="goodwill for jane@example.org, card 4242 4242 4242 4242",
        )
        assert not [r for r in caplog.records if r.name == "audit"]  # not before the commit
    entry.refresh_from_db()
    assert entry.user_id == alice.pk and entry.after == {"balance": "60"}
    [line] = [r.getMessage() for r in caplog.records if r.name == "audit"]
    assert "action=credits.grant actor=admin:alice object=billing.creditaccount:7" in line
    assert "fields=balance" in line
    for leak in ("jane@example.org", "4242", "goodwill", "60"):
        assert leak not in line.split("object=")[1].replace(":7 ", " "), line


def test_an_action_rolled_back_leaves_no_entry_and_no_line(caplog):
    caplog.set_level(logging.INFO, logger="audit")
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(action="session.cancel", actor="system", object_type="x.y", object_id=1)
        raise RuntimeError("the action failed after its entry")
    assert not AuditEntry.objects.exists()
    assert not [r for r in caplog.records if r.name == "audit"]


def test_an_admin_change_records_only_what_changed():
    endpoint = ModelEndpointFactory(name="main", api="openai", model="m1")
    before = stored_snapshot(type(endpoint), endpoint.pk)
    endpoint.model = "m2"
    endpoint.save()
    entry = admin_change_record(
        actor="admin:op", user_id=None, obj=endpoint, before=before,
        after=row_snapshot(endpoint), action=AuditAction.ADMIN_CHANGE,
    )  # fmt: skip
    assert entry is not None
    assert (entry.before, entry.after) == ({"model": "m1"}, {"model": "m2"})
    assert entry.object_type == "agent_sessions.modelendpoint" and entry.object_repr
    # Saving without a change writes nothing.
    same = row_snapshot(endpoint)
    assert (
        admin_change_record(
            actor="admin:op",
            user_id=None,
            obj=endpoint,
            before=same,
            after=same,
            action=AuditAction.ADMIN_CHANGE,
        )  # fmt: skip
        is None
    )
    assert "updated_at" not in same and "created_at" not in same

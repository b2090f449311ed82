"""A queryset compiled once returns what the ORM returns, in one query."""

from uuid import UUID, uuid4

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from record.models import Session
from runtime.fastpaths.prepared import PreparedQuery
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db

# Django puts owner_id before pk in the statement: the call's order must not matter.
by_id_and_owner: PreparedQuery[Session] = PreparedQuery(
    lambda pk, owner_id: Session.objects.select_related("agent").filter(pk=pk, owner_id=owner_id),
    example=[UUID(int=0), 0],
)


def _fields(obj):  # type: ignore[no-untyped-def]
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_row_is_the_orms_with_its_related_object_and_converted_values():
    session = SessionFactory(metadata={"ticket": 7, "tags": ["a"]})
    expected = Session.objects.select_related("agent").get(pk=session.pk)
    with CaptureQueriesContext(connection) as queries:
        got = by_id_and_owner.first(session.pk, session.owner_id)
        assert got is not None
        assert got.agent.slug == expected.agent.slug  # cached: no second query
    assert len(queries) == 1
    assert _fields(got) == _fields(expected)
    assert got.metadata == {"ticket": 7, "tags": ["a"]}  # jsonb through the field's converter
    assert _fields(got.agent) == _fields(expected.agent)
    assert got._state.adding is False and got._state.db == "default"
    got.save(update_fields=["metadata"])  # a normal instance: it saves
    assert by_id_and_owner.first(session.pk, session.owner_id + 1) is None
    assert by_id_and_owner.first(uuid4(), session.owner_id) is None


@pytest.mark.django_db(transaction=True)  # autocommit outside the atomic block below
def test_select_for_update_is_refused_outside_a_transaction_as_the_orm_does():
    session = SessionFactory()
    locking: PreparedQuery[Session] = PreparedQuery(
        lambda pk: Session.objects.locked().filter(pk=pk),
        example=[UUID(int=0)],
    )
    with transaction.atomic():
        assert locking.first(session.pk) is not None
    with pytest.raises(TransactionManagementError):
        locking.first(session.pk)


def test_a_queryset_whose_parameters_are_not_the_examples_fails_at_once():
    transformed: PreparedQuery[Session] = PreparedQuery(
        lambda role: Session.objects.filter(role__icontains=role), example=["x"]
    )
    with pytest.raises(ValueError, match="not the examples"):
        transformed.first("support")
    alike: PreparedQuery[Session] = PreparedQuery(
        lambda a, b: Session.objects.filter(turn=a, step=b), example=[0, 0]
    )
    with pytest.raises(ValueError, match="not the examples"):
        alike.first(1, 1)


@pytest.mark.django_db(transaction=True)
def test_off_each_call_runs_the_queryset_through_the_orm(settings):
    settings.FAST_PATHS = False
    session = SessionFactory(metadata={"ticket": 7})
    fresh: PreparedQuery[Session] = PreparedQuery(
        lambda pk, owner_id: Session.objects.select_related("agent").filter(
            pk=pk, owner_id=owner_id
        ),
        example=[UUID(int=0), 0],
    )
    with CaptureQueriesContext(connection) as queries:
        got = fresh.first(session.pk, session.owner_id)
        assert got is not None and got.agent.slug == session.agent.slug
    assert len(queries) == 1 and "LIMIT 1" in queries[0]["sql"]
    assert fresh._compiled == {} and got.metadata == {"ticket": 7}
    assert fresh.first(session.pk, session.owner_id + 1) is None

    locking: PreparedQuery[Session] = PreparedQuery(
        lambda pk: Session.objects.locked().filter(pk=pk),
        example=[UUID(int=0)],
    )
    with transaction.atomic():
        assert locking.first(session.pk) == session
    with pytest.raises(TransactionManagementError):
        locking.first(session.pk)

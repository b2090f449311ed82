"""The read serializers whose fields are built once answer exactly as DRF builds them."""

from decimal import Decimal

import pytest
from rest_framework import serializers

from record.models import Message
from sessions.api.serializers import MessageSerializer, SessionSerializer, UsageSerializer
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db


class PlainUsage(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=6)


class PlainSession(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    usage = serializers.SerializerMethodField()
    workflow = serializers.SerializerMethodField()
    last_turn = serializers.SerializerMethodField()
    get_workflow = SessionSerializer.get_workflow
    parent = serializers.UUIDField(source="parent_id", allow_null=True, read_only=True)
    get_last_turn = SessionSerializer.get_last_turn

    class Meta(SessionSerializer.Meta):
        pass

    def get_usage(self, obj):  # type: ignore[no-untyped-def]
        usage = {
            "input_tokens": obj.input_tokens,
            "output_tokens": obj.output_tokens,
            "cost": obj.cost,
        }
        return dict(PlainUsage(usage).data)


class PlainMessage(serializers.ModelSerializer):
    class Meta(MessageSerializer.Meta):
        pass


def test_session_and_message_representations_match_drfs():
    session = SessionFactory(metadata={"k": [1, "two"]}, input_tokens=3, cost=Decimal("0.5"))
    other = SessionFactory(
        role="",
        last_turn_number=2,
        last_turn_outcome="tool_failures",
        last_turn_calls={"ok": 1, "rejected": 3},
    )
    messages = [
        Message.objects.create(session=session, role="user", content="hi", token_count=1),
        Message.objects.create(
            session=session,
            role="assistant",
            content="",
            tool_calls=[{"id": "c1", "name": "t", "arguments": {}}],
            seq=4,
            turn=2,
            idempotency_key="k-1",
        ),
    ]
    for row in (session, other):
        assert SessionSerializer(row).data == PlainSession(row).data
        assert (
            SessionSerializer(row).data["usage"]["cost"] == PlainSession(row).data["usage"]["cost"]
        )
    assert (
        SessionSerializer([session, other], many=True).data
        == PlainSession([session, other], many=True).data
    )
    for message in messages:
        assert MessageSerializer(message).data == PlainMessage(message).data
    assert MessageSerializer(messages, many=True).data == PlainMessage(messages, many=True).data
    assert dict(UsageSerializer({"input_tokens": 1, "output_tokens": 2, "cost": 1}).data) == {
        "input_tokens": 1,
        "output_tokens": 2,
        "cost": "1.000000",
    }


def test_the_schema_still_sees_every_field():
    assert list(SessionSerializer().fields) == SessionSerializer.Meta.fields
    assert list(MessageSerializer().fields) == MessageSerializer.Meta.fields

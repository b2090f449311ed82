from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from record.errors import PayloadTooLarge
from record.events import CALL_KINDS, TurnOutcome
from record.json_limits import JsonRejected, json_check
from record.models import Agent, Checkpoint, Event, Message, Session
from runtime.fastpaths.drf_fields import FieldsBuiltOnce


class _StringsOnly:
    """DRF's text fields turn 123 or 1.5 into "123"; a JSON API should say the type is wrong."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")  # type: ignore[attr-defined]
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictCharField(_StringsOnly, serializers.CharField):
    pass


class StrictSlugField(_StringsOnly, serializers.SlugField):
    pass


class StrictSerializer(serializers.Serializer):
    """Rejects unknown fields and non-object bodies with a clear message."""

    def to_internal_value(self, data):  # type: ignore[no-untyped-def]
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["expected a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


WEBHOOK_SCHEMA = {
    "type": "object",
    "properties": {"url": {"type": "string", "format": "uri", "maxLength": 500}},
    "required": ["url"],
    "additionalProperties": False,
    "description": (
        "POSTed the outcome, answer or result and usage when the turn (every turn of a "
        "session; a message's own turn) ends, signed in X-Run-Signature, with "
        "Idempotency-Key <session>:<turn>. The URL must pass the egress policy (400 naming "
        "webhook.url otherwise)."
    ),
    "example": {"url": "https://app.example.com/hooks/runs"},
}


@extend_schema_field(WEBHOOK_SCHEMA)
class WebhookField(serializers.JSONField):
    """Any JSON here; the service checks it (an object with url, allowed by the egress
    policy) and names the field."""


class SessionCreateSerializer(StrictSerializer):
    agent = StrictSlugField(max_length=100)
    role = StrictCharField(max_length=50, required=False, allow_blank=True)
    metadata = serializers.DictField(required=False, default=dict)
    # What the session is worth to the customer app: calls competing for points
    # are served highest value per point first, and runs get a broker priority from it
    # (default: the agent's value). Above the agent's value only as far as an operator
    # granted the key (sessions.services.session_value_check).
    value = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=1e12,
        help_text="The session's value (priority for credits and workers); default the agent's. "
        "Above the agent's value only up to the key's max_value (403 value_not_allowed).",
    )
    webhook = WebhookField(required=False)

    def validate_metadata(self, value: dict[str, Any]) -> dict[str, Any]:
        limit = settings.METADATA_MAX_BYTES
        try:
            json_check(value, root="$.metadata", max_bytes=limit)
        except JsonRejected as exc:
            if exc.too_large:  # too big is a 413, as for a message's content
                raise PayloadTooLarge(
                    f"metadata: {exc.reason}", details={"field": "metadata", "limit": limit}
                ) from None
            raise serializers.ValidationError(exc.message) from None
        return value


EXTRA_CONTEXT_SCHEMA = {
    "type": "object",
    "additionalProperties": True,
    "nullable": True,
    "description": (
        "Optional data from your app for this turn (the page the user is on, their cart, "
        "...). The model sees it as data, never as instructions. A JSON object of at most "
        "8,192 bytes as compact UTF-8 JSON (413 beyond) and 8 levels of nesting (400 beyond), "
        "unless the operator set other limits."
    ),
    "example": {"page": "orders/SO-1001", "plan": "gold"},
}


@extend_schema_field(EXTRA_CONTEXT_SCHEMA)
class ExtraContextField(serializers.JSONField):
    """Any JSON here; the service says what is wrong with it (an object only, its size and
    depth), so a websocket frame and a POST get the same answer."""


class MessageCreateSerializer(StrictSerializer):
    # Length is checked by the service so that too long is a 413, not a 400.
    content = StrictCharField(trim_whitespace=False, allow_blank=True)
    idempotency_key = StrictCharField(max_length=200, required=False, allow_blank=False)
    extra_context = ExtraContextField(required=False, allow_null=True)
    webhook = WebhookField(required=False)


# Read-only serializers build their fields once per class (runtime/fastpaths/drf_fields.py).
class UsageSerializer(FieldsBuiltOnce, serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=6)


class WorkflowRunSerializer(FieldsBuiltOnce, serializers.Serializer):
    slug = serializers.CharField()
    version = serializers.IntegerField()
    active = serializers.ListField(child=serializers.CharField())
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(
        allow_null=True, help_text="{node, message} when a node failed for good."
    )


class CallCountsSerializer(FieldsBuiltOnce, serializers.Serializer):
    ok = serializers.IntegerField(help_text="Ran and succeeded.")
    failed = serializers.IntegerField(help_text="Ran and failed or timed out, or was held back.")
    rejected = serializers.IntegerField(
        help_text="Rejected by an approver, or the turn ended before it ran."
    )
    expired = serializers.IntegerField(help_text="No approver decided before its deadline.")
    unpaid = serializers.IntegerField(help_text="The owner's credit points could not pay for it.")


class LastTurnSerializer(FieldsBuiltOnce, serializers.Serializer):
    turn = serializers.IntegerField()
    outcome = serializers.ChoiceField(
        choices=[o.value for o in TurnOutcome],
        help_text="ok: every tool call ran and succeeded; tool_failures: at least one failed, "
        "was rejected, expired or was refused for credits; stopped: a guard, budget or cancel "
        "ended the turn; error.",
    )
    calls = CallCountsSerializer(help_text="The turn's tool calls by how they ended.")


class SessionSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    usage = serializers.SerializerMethodField()
    workflow = serializers.SerializerMethodField()
    parent = serializers.UUIDField(
        source="parent_id",
        allow_null=True,
        read_only=True,
        help_text="The session whose agent.<slug> call (or workflow agent node) started this one.",
    )
    last_turn = serializers.SerializerMethodField()
    agent_version = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id",
            "agent",
            "role",
            "metadata",
            "state",
            "version",
            "turn",
            "queued_count",
            "value",
            "ephemeral",
            "usage",
            "last_error",
            "last_turn",
            "agent_version",
            "workflow",
            "parent",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(LastTurnSerializer(allow_null=True))
    def get_last_turn(self, obj: Session) -> dict[str, object] | None:
        """How the last turn that ended went; null before any turn ended."""
        if obj.last_turn_number is None or not obj.last_turn_outcome:
            return None
        return {
            "turn": obj.last_turn_number,
            "outcome": obj.last_turn_outcome,
            "calls": {**dict.fromkeys(CALL_KINDS, 0), **(obj.last_turn_calls or {})},
        }

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_agent_version(self, obj: Session) -> str | None:
        """The agent configuration version its current or last turn ran on ("support@5");
        null for a workflow's agent or a session older than versions."""
        version = obj.agent_version
        return None if version is None else f"{version.agent.slug}@{version.number}"

    @extend_schema_field(WorkflowRunSerializer(allow_null=True))
    def get_workflow(self, obj: Session) -> dict[str, object] | None:
        """A workflow run's version and where it stands; null for a conversation."""
        version = obj.workflow_version
        if version is None:
            return None
        state = obj.workflow_state or {}
        return {
            "slug": version.workflow.slug,
            "version": version.number,
            "active": list(state.get("active") or []),
            "result": state.get("result"),
            "error": state.get("error"),
        }

    @extend_schema_field(UsageSerializer)
    def get_usage(self, obj: Session) -> dict[str, object]:
        # Through the serializer, so cost is always "0.000000"-shaped, fresh row or not.
        usage = {
            "input_tokens": obj.input_tokens,
            "output_tokens": obj.output_tokens,
            "cost": obj.cost,
        }
        return dict(UsageSerializer(usage).data)


class MessageSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
    class Meta:
        model = Message
        fields = [
            "id",
            "seq",
            "turn",
            "role",
            "status",
            "content",
            "tool_calls",
            "tool_call_id",
            "name",
            "token_count",
            "idempotency_key",
            "extra_context",
            "created_at",
        ]
        read_only_fields = fields


class EventSerializer(serializers.ModelSerializer):
    session = serializers.UUIDField(source="session_id", read_only=True)
    ts = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Event
        fields = ["seq", "type", "session", "ts", "data"]
        read_only_fields = fields


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.BooleanField()
    session = SessionSerializer()


class ForkSerializer(StrictSerializer):
    checkpoint = serializers.IntegerField(
        min_value=1, help_text="Step number of the checkpoint to fork from."
    )
    role = StrictCharField(
        max_length=50,
        required=False,
        allow_blank=True,
        help_text="The fork's role, one your key holds (default: the session's; "
        "403 role_not_held if your key does not hold it).",
    )


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = [
            "step",
            "turn",
            "state",
            "message_seq",
            "context",
            "fingerprint",
            "size_bytes",
            "created_at",
        ]
        read_only_fields = fields


class AgentSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="Its latest configuration version: an evaluation's candidate "
        '{"agent_version": "<slug>@<number>"} names one.',
    )

    class Meta:
        model = Agent
        fields = ("slug", "name", "version")


class SessionDetailSerializer(SessionSerializer):
    """One session: also its children (the sessions its agent calls started), oldest first."""

    children = serializers.SerializerMethodField()

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "children"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.UUIDField()))
    def get_children(self, obj: Session) -> list[str]:
        return [str(pk) for pk in obj.children.order_by("created_at").values_list("pk", flat=True)]

"""REST edge of workflows: list what a key may start, start a run. Translation only."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.throttling import ApiKeyRateThrottle, SessionCreateThrottle
from sessions.services import (
    IDEMPOTENCY_HEADER,
    KeyedRequest,
    request_fingerprint,
    request_key_parse,
    request_keyed_respond,
)

from . import api_docs, selectors, services


class WorkflowSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    role = serializers.CharField()
    version = serializers.IntegerField(source="current_version")
    input = serializers.JSONField(help_text="The JSON Schema a run's input must satisfy.")


class RunCreateSerializer(serializers.Serializer):
    input = serializers.JSONField(
        help_text="The run's input, valid against the workflow's `input` schema."
    )
    idempotency_key = serializers.CharField(required=False, max_length=200, allow_blank=False)
    metadata = serializers.DictField(required=False)
    webhook = serializers.JSONField(
        required=False,
        help_text='`{"url": str}`: POSTed the outcome, result and usage when the run ends, '
        "signed in X-Run-Signature (docs/schedules-and-webhooks.md); the URL must pass the "
        "egress policy (400 naming webhook.url otherwise).",
    )


class RunSerializer(serializers.Serializer):
    """A run is a session: `id` is the session's, for its events, websocket, cancel and fork."""

    id = serializers.UUIDField()
    workflow = serializers.CharField(source="workflow_version.workflow.slug")
    version = serializers.IntegerField(source="workflow_version.number")
    state = serializers.CharField()
    role = serializers.CharField()
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()


def _key_roles(request: Request) -> list[str]:
    return list(getattr(request.auth, "roles", None) or [])


class WorkflowListView(APIView):
    @api_docs.workflow_list
    @extend_schema(
        responses=WorkflowSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        rows = []
        for workflow in selectors.workflows_startable(key_roles=_key_roles(request)):
            version = selectors.workflow_current_version(workflow)
            rows.append(
                {
                    "slug": workflow.slug,
                    "name": workflow.name,
                    "description": workflow.description,
                    "role": workflow.role,
                    "current_version": workflow.current_version,
                    "input": version.definition.get("input") or {"type": "object"},
                }
            )
        return Response(WorkflowSerializer(rows, many=True).data)


class WorkflowRunsView(APIView):
    throttle_classes = [ApiKeyRateThrottle, SessionCreateThrottle]  # a run is a new session
    key_grants_checked = ("POST",)  # the workflow's role the key does not hold (403, schema.py)

    @api_docs.workflow_run_create
    @extend_schema(
        request=RunCreateSerializer,
        responses={201: RunSerializer, 200: RunSerializer},
    )
    def post(self, request: Request, slug: str) -> Response:
        payload = RunCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        key = request_key_parse(
            request.headers.get(IDEMPOTENCY_HEADER), data.get("idempotency_key")
        )

        def start() -> tuple[int, Any]:
            session, created = services.workflow_run_start(
                owner=request.user,
                key_roles=_key_roles(request),
                slug=slug,
                input=data["input"],
                idempotency_key=key,
                metadata=data.get("metadata") or {},
                webhook=data.get("webhook"),
                api_key_id=getattr(request.auth, "pk", None),
            )
            code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
            return code, RunSerializer(session).data

        keyed = (
            None
            if key is None
            else KeyedRequest(
                key=key,
                fingerprint=request_fingerprint(
                    request.method,
                    request.path,
                    data["input"],
                    data.get("metadata") or {},
                    *([data["webhook"]] if "webhook" in data else []),
                ),
            )
        )
        answer = request_keyed_respond(owner_id=request.user.pk, keyed=keyed, run=start)
        if not answer.replayed:
            return Response(answer.body, status=answer.status)
        # A retry's answer is the first one's body, with 200 (nothing new was started).
        response = Response(answer.body, status=status.HTTP_200_OK)
        response["Idempotent-Replayed"] = "true"
        return response

"""REST edge of evaluations (`/api/v1/evaluations/`): create, list, read, cancel; an API
key evaluates only its owner's sessions. Translation only."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.throttling import ApiKeyRateThrottle

from . import api_docs, selectors, services


class FilterSerializer(serializers.Serializer):
    agent = serializers.SlugField(required=False, max_length=100)
    since = serializers.DateField(required=False)
    until = serializers.DateField(required=False)
    outcome = serializers.ChoiceField(
        choices=[*selectors.OUTCOMES, *selectors.RUN_OUTCOMES],
        required=False,
        help_text="A conversation's last turn: ok, tool_failures, stopped, error; a workflow "
        "run (a workflow_version candidate): finished, failed, cancelled.",
    )
    search = serializers.CharField(required=False, max_length=200, allow_blank=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("since") and attrs.get("until") and attrs["since"] > attrs["until"]:
            raise serializers.ValidationError({"since": "since is after until"})
        return attrs


class EvaluationCreateSerializer(serializers.Serializer):
    sessions = serializers.ListField(
        child=serializers.CharField(max_length=64),
        required=False,
        max_length=selectors.MAX_SESSIONS,
        allow_empty=False,
        help_text="Recorded session ids (the key owner's); or `filter`.",
    )
    filter = FilterSerializer(required=False, help_text="Pick the owner's sessions instead.")
    same_sessions_as = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="The saved set of an earlier evaluation of yours (its id): the same sessions.",
    )
    candidate = serializers.JSONField(
        help_text='{"model": name}, {"system_prompt": str}, {"agent_version": '
        "\"<agent slug>@<n>\"} (one of the sessions' agent's configuration versions) or "
        '{"workflow_version": "<workflow>@<n>"} (the sessions are then recorded runs of that '
        "workflow)."
    )
    allow_read_only_calls = serializers.BooleanField(default=False)
    judge = serializers.JSONField(required=False, help_text='{"model": name, "rubric": str}')
    budget = serializers.DecimalField(
        max_digits=14, decimal_places=6, required=False, min_value=0, help_text="Cost limit."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [k for k in ("sessions", "filter", "same_sessions_as") if k in attrs]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"sessions": "give one of sessions, filter or same_sessions_as"}
            )
        return attrs


class EvaluationListItemSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    candidate = serializers.JSONField()
    done = serializers.IntegerField()
    total = serializers.IntegerField()
    totals = serializers.JSONField()
    created_at = serializers.DateTimeField()


class EvaluationCreatedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    progress = serializers.DictField(help_text="{done, total}: turns replayed, turns to replay.")


class EvaluationStateSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()


class EvaluationReportSerializer(EvaluationCreatedSerializer):
    """The report (DESIGN.md "Evaluations"): read from the selectors as it is."""

    agent = serializers.CharField(allow_null=True)
    candidate = serializers.JSONField()
    allow_read_only_calls = serializers.BooleanField()
    totals = serializers.JSONField()
    spent = serializers.CharField()
    budget = serializers.CharField(allow_null=True)
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    turns = serializers.ListField(child=serializers.JSONField())


class EvaluationListView(APIView):
    throttle_classes = [ApiKeyRateThrottle]

    @api_docs.evaluation_list
    @extend_schema(responses=EvaluationListItemSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = selectors.evaluations_of_owner(owner_id=request.user.pk)
        return Response(EvaluationListItemSerializer(rows, many=True).data)

    @api_docs.evaluation_create
    @extend_schema(request=EvaluationCreateSerializer, responses={201: EvaluationCreatedSerializer})
    def post(self, request: Request) -> Response:
        payload = EvaluationCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        where = data.get("filter")
        picked = selectors.sessions_pick(
            owner_id=request.user.pk,
            ids=data.get("sessions"),
            where=selectors.SessionFilter(**where) if where is not None else None,
            same_as=data.get("same_sessions_as"),
            # A workflow version's candidate replays recorded runs of its workflow.
            workflow=selectors.candidate_workflow(data["candidate"]),
        )
        evaluation = services.evaluation_create(
            owner=request.user,
            actor=f"api:{request.user.get_username()}",
            sessions=picked,
            candidate=data["candidate"],
            allow_read_only_calls=data["allow_read_only_calls"],
            judge=data.get("judge"),
            budget_cost=data.get("budget"),
        )
        return Response(
            {
                "id": evaluation.pk,
                "state": evaluation.state,
                "progress": {"done": 0, "total": evaluation.total},
            },
            status=status.HTTP_201_CREATED,
        )


class EvaluationDetailView(APIView):
    throttle_classes = [ApiKeyRateThrottle]

    @api_docs.evaluation_detail
    @extend_schema(responses=EvaluationReportSerializer)
    def get(self, request: Request, evaluation_id: str) -> Response:
        evaluation = selectors.evaluation_for_owner(
            evaluation_id=evaluation_id, owner_id=request.user.pk
        )
        return Response(selectors.evaluation_report(evaluation))


class EvaluationCancelView(APIView):
    throttle_classes = [ApiKeyRateThrottle]

    @api_docs.evaluation_cancel
    @extend_schema(request=None, responses=EvaluationStateSerializer)
    def post(self, request: Request, evaluation_id: str) -> Response:
        evaluation = selectors.evaluation_for_owner(
            evaluation_id=evaluation_id, owner_id=request.user.pk
        )
        services.evaluation_cancel(
            evaluation=evaluation, actor=f"api:{request.user.get_username()}"
        )
        return Response({"id": evaluation.pk, "state": evaluation.state})

"""REST edge of approvals: approvers list pending approvals and decide them."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import approver_groups
from record.errors import InvalidInput
from sessions import services

from . import api_docs
from .models import Approval, ReviewAnswer
from .selectors import approvals_list
from .states import ApprovalStatus


class ApprovalSerializer(serializers.ModelSerializer):
    session = serializers.UUIDField(source="session_id", read_only=True)
    tool = serializers.CharField(source="tool_name", read_only=True)
    decided_by = serializers.CharField(source="decided_by_name", read_only=True)
    # A workflow's review: which workflow, run and node, its title, summary and the values
    # its node shows and lets the approver edit (null for an ordinary tool call).
    review = serializers.JSONField(read_only=True)
    # Until when the decision may be withdrawn or changed (its undo window); null otherwise.
    undo_until = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = Approval
        fields = [
            "id",
            "session",
            "kind",
            "tool",
            "arguments",
            "edited_arguments",
            "risk_level",
            "reason",
            "status",
            "group",
            "requested_at",
            "deadline",
            "decided_by",
            "decided_at",
            "comment",
            "answer",
            "answer_result",
            "review",
            "undo_until",
        ]
        read_only_fields = fields


class ApproveSerializer(serializers.Serializer):
    arguments = serializers.DictField(required=False, help_text="Edited arguments (what runs).")
    comment = serializers.CharField(required=False, allow_blank=True, max_length=4000, default="")


class RejectSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=4000, help_text="The model receives it.")


class ReviewSerializer(serializers.Serializer):
    answer = serializers.ChoiceField(choices=ReviewAnswer.choices)
    result = serializers.JSONField(
        required=False, help_text="With took_effect: the call's result, as the model will read it."
    )
    comment = serializers.CharField(required=False, allow_blank=True, max_length=4000, default="")


class WithdrawSerializer(serializers.Serializer):
    comment = serializers.CharField(
        required=False, allow_blank=True, max_length=4000, default="", help_text="Why."
    )


class ChangeSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(
        choices=["approved", "rejected"], help_text="The decision it becomes."
    )
    comment = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=4000,
        default="",
        help_text="The model receives it (needed to reject).",
    )
    arguments = serializers.DictField(
        required=False, help_text="Approving: edited arguments (what runs)."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["decision"] == "rejected" and not attrs.get("comment"):
            raise serializers.ValidationError({"comment": "a rejection needs a comment"})
        return attrs


class IsApprover(permissions.BasePermission):
    """Only approvers' keys (403 otherwise); the OpenAPI schema documents it from here."""

    message = "this API key belongs to a user who is not an approver"

    def has_permission(self, request: Request, view: Any) -> bool:
        user_id = request.user.pk if request.user else None
        return user_id is not None and approver_groups(user_id=user_id) is not None


APPROVER_ONLY = [permissions.IsAuthenticated, IsApprover]


def _groups(request: Request) -> list[str]:
    groups = approver_groups(user_id=request.user.pk)
    if groups is None:
        raise PermissionDenied("this API key belongs to a user who is not an approver")
    return groups


def _key_prefix(request: Request) -> str:
    """The presenting key's prefix, for the audit trail."""
    return str(getattr(request.auth, "prefix", "") or "")


class ApprovalListView(APIView):
    permission_classes = APPROVER_ONLY

    @api_docs.approval_list
    @extend_schema(
        responses=ApprovalSerializer(many=True),
        parameters=[
            OpenApiParameter("status", str, enum=[s.value for s in ApprovalStatus]),
            OpenApiParameter("limit", int),
        ],
    )
    def get(self, request: Request) -> Response:
        groups = _groups(request)
        status = request.query_params.get("status") or None
        if status is not None and status not in {s.value for s in ApprovalStatus}:
            raise InvalidInput(
                f"status must be one of {', '.join(s.value for s in ApprovalStatus)}",
                details={"field": "status"},
            )
        raw_limit = request.query_params.get("limit") or "100"
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
            raise InvalidInput(
                "limit must be an integer from 1 to 1000", details={"field": "limit"}
            )
        rows = approvals_list(status=status, groups=groups)[: int(raw_limit)]
        return Response(ApprovalSerializer(rows, many=True).data)


class ApprovalApproveView(APIView):
    permission_classes = APPROVER_ONLY

    @api_docs.approval_approve
    @extend_schema(request=ApproveSerializer, responses=ApprovalSerializer)
    def post(self, request: Request, approval_id: str) -> Response:
        groups = _groups(request)
        payload = ApproveSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        approval = services.approval_decide(
            approval_id=approval_id,
            approve=True,
            user=request.user,
            groups=groups,
            comment=data.get("comment") or "",
            arguments=data.get("arguments"),
            key_prefix=_key_prefix(request),
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalRejectView(APIView):
    permission_classes = APPROVER_ONLY

    @api_docs.approval_reject
    @extend_schema(request=RejectSerializer, responses=ApprovalSerializer)
    def post(self, request: Request, approval_id: str) -> Response:
        groups = _groups(request)
        payload = RejectSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        approval = services.approval_decide(
            approval_id=approval_id,
            approve=False,
            user=request.user,
            groups=groups,
            comment=payload.validated_data["comment"],
            key_prefix=_key_prefix(request),
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalReviewView(APIView):
    """Answer a recovery review: did the uncertain call take effect?"""

    permission_classes = APPROVER_ONLY

    @api_docs.approval_review
    @extend_schema(request=ReviewSerializer, responses=ApprovalSerializer)
    def post(self, request: Request, approval_id: str) -> Response:
        groups = _groups(request)
        payload = ReviewSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        approval = services.review_answer(
            approval_id=approval_id,
            answer=data["answer"],
            result=data.get("result"),
            user=request.user,
            groups=groups,
            comment=data.get("comment") or "",
            key_prefix=_key_prefix(request),
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalWithdrawView(APIView):
    """Take a decision back: the call waits for a person again, with a fresh deadline."""

    permission_classes = APPROVER_ONLY

    @api_docs.approval_withdraw
    @extend_schema(
        request=WithdrawSerializer,
        responses=ApprovalSerializer,
    )
    def post(self, request: Request, approval_id: str) -> Response:
        groups = _groups(request)
        payload = WithdrawSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        approval = services.approval_change(
            approval_id=approval_id,
            decision="pending",
            user=request.user,
            groups=groups,
            comment=payload.validated_data.get("comment") or "",
            key_prefix=_key_prefix(request),
        )
        return Response(ApprovalSerializer(approval).data)


class ApprovalChangeView(APIView):
    """Change a decision the other way: approved -> rejected, or rejected -> approved."""

    permission_classes = APPROVER_ONLY

    @api_docs.approval_change
    @extend_schema(
        request=ChangeSerializer,
        responses=ApprovalSerializer,
    )
    def post(self, request: Request, approval_id: str) -> Response:
        groups = _groups(request)
        payload = ChangeSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        approval = services.approval_change(
            approval_id=approval_id,
            decision=data["decision"],
            user=request.user,
            groups=groups,
            comment=data.get("comment") or "",
            arguments=data.get("arguments"),
            key_prefix=_key_prefix(request),
        )
        return Response(ApprovalSerializer(approval).data)

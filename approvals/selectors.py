"""Named reads of approvals."""

from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import Count, F, Min, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from observability.readings import Gauge

from .models import Approval, ApprovalKind
from .states import CHANGEABLE, UNDO_HOLD, ApprovalStatus


def approval_get(*, approval_id: UUID | str) -> Approval | None:
    try:
        return Approval.objects.filter(pk=approval_id).first()
    except (ValueError, ValidationError):
        return None


def approvals_list(
    *, status: str | None = None, groups: list[str] | None = None
) -> QuerySet[Approval]:
    rows = Approval.objects.all().order_by("requested_at")
    if status:
        rows = rows.filter(status=status)
    if groups is not None:
        rows = rows.filter(group__in=groups)
    return rows


def approvals_for_calls(*, call_ids: list[int]) -> dict[int, Approval]:
    """The approval of each of these tool calls that has one."""
    if not call_ids:
        return {}
    return {
        a.tool_call_id: a
        for a in Approval.objects.filter(tool_call_id__in=call_ids, kind=ApprovalKind.TOOL_CALL)
        if a.tool_call_id
    }


def reviews_for_calls(*, call_ids: list[int]) -> dict[int, Approval]:
    """The latest recovery review of each of these calls that has one."""
    if not call_ids:
        return {}
    latest: dict[int, Approval] = {}
    for review in Approval.objects.filter(
        tool_call_id__in=call_ids, kind=ApprovalKind.RECOVERY_REVIEW
    ).order_by("requested_at"):
        if review.tool_call_id:
            latest[review.tool_call_id] = review
    return latest


def approval_pending_exists(*, session_id: UUID | str) -> bool:
    return Approval.objects.filter(session_id=session_id, status=ApprovalStatus.PENDING).exists()


def approval_remembered(*, session_id: UUID | str, tool_name: str, arguments: Any) -> bool:
    """An approver said "approve and remember" for this tool with these arguments in this session."""
    return Approval.objects.filter(
        session_id=session_id,
        tool_name=tool_name,
        status=ApprovalStatus.APPROVED,
        remember=True,
        arguments=arguments,
    ).exists()


def approvals_due(*, limit: int = 100) -> list[Approval]:
    return list(
        Approval.objects.filter(
            status=ApprovalStatus.PENDING, deadline__lte=timezone.now()
        ).order_by("deadline")[:limit]
    )


def approvals_queue(*, groups: list[str] | None, limit: int = 100) -> list[Approval]:
    """Pending approvals of these groups (None: all), oldest first, with their sessions."""
    rows = Approval.objects.filter(status=ApprovalStatus.PENDING).select_related(
        "session", "session__agent", "session__owner", "tool_call"
    )
    if groups is not None:
        rows = rows.filter(group__in=groups)
    return list(rows.order_by("requested_at")[:limit])


def approvals_recently_decided(*, groups: list[str] | None, limit: int = 10) -> list[Approval]:
    rows = Approval.objects.exclude(status=ApprovalStatus.PENDING).filter(decided_at__isnull=False)
    if groups is not None:
        rows = rows.filter(group__in=groups)
    return list(rows.order_by("-decided_at")[:limit])


def approvals_count(*, groups: list[str] | None) -> int:
    rows = Approval.objects.filter(status=ApprovalStatus.PENDING)
    if groups is not None:
        rows = rows.filter(group__in=groups)
    return rows.count()


def approvals_pending_gauges() -> list[Gauge]:
    """Scrape-time gauges (observability/collector.py): pending approvals and the oldest one's age."""
    row = Approval.objects.filter(status=ApprovalStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("requested_at")
    )
    age = (timezone.now() - row["oldest"]).total_seconds() if row["oldest"] else 0.0
    return [
        Gauge("agent_approvals_pending", "Approvals waiting for a person.", (), [((), row["n"])]),
        Gauge(
            "agent_approvals_oldest_pending_seconds",
            "Age of the oldest pending approval (0 when none).",
            (),
            [((), age)],
        ),
    ]


def approvals_changeable(*, approval_ids: list[Any]) -> set[Any]:
    """Which of these decisions may still be withdrawn or changed: an approved or rejected
    call of the session's current turn, the session waiting (for a person, or for a worker
    nobody has taken yet, or its decision's undo window open), the call neither sent nor
    finished. The service checks the same
    under the session's row lock (sessions/services/approvals.py `call_started`)."""
    if not approval_ids:
        return set()
    return set(
        Approval.objects.filter(
            pk__in=approval_ids,
            kind=ApprovalKind.TOOL_CALL,
            status__in=[s.value for s in CHANGEABLE],
            turn=F("session__turn"),
            session__state__in=["awaiting_approval", "tool_wait"],
            tool_call__status="executing",
            tool_call__dispatched_at__isnull=True,
        )
        .filter(
            Q(session__lease_owner__isnull=True)
            | Q(session__lease_owner="")
            | Q(session__lease_owner=UNDO_HOLD, session__lease_expires_at__gt=Now())
        )
        .values_list("pk", flat=True)
    )


def approvals_pending_oldest(*, owner_id: int | None) -> tuple[int, Any]:
    """(how many approvals wait, when the oldest was asked for): the admin home's line.
    `owner_id` None: the whole platform, else that tenant's sessions only."""
    rows = Approval.objects.filter(status=ApprovalStatus.PENDING)
    if owner_id is not None:
        rows = rows.filter(session__owner_id=owner_id)
    row = rows.aggregate(n=Count("id"), oldest=Min("requested_at"))
    return row["n"], row["oldest"]

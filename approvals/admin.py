"""Admin of approvals: the approvers' queue (their home page), and every approval's history.

Decisions go through the same services as the REST API (races, validation,
the session's resumption, four eyes: an approval of a session the user owns is
refused and shown as someone else's to decide); these views only translate. Deciding here takes an approver's
rights (their groups, as over the API) and the `decide_approval` permission; an approver
without it sees the queue and decides nothing. The arguments the model sent are message
content: on the change pages they take `view_message_content` (the queue shows them to
its approvers, who decide on them).
"""

import json
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from accounts.admin_access import MESSAGE_CONTENT, ContentMaskedAdmin, holds, masked
from accounts.selectors import approver_groups
from accounts.tenancy import TenantScopedAdmin
from record.errors import DomainError, InvalidInput
from record.models import Message
from sessions import services
from sessions.selectors import messages_recent

from .models import Approval, ApprovalKind, ApprovalTransition, ReviewAnswer
from .policy import four_eyes_forbids
from .selectors import (
    approval_get,
    approvals_changeable,
    approvals_count,
    approvals_queue,
    approvals_recently_decided,
)


def arguments_diff(before: Any, after: Any) -> list[tuple[str, str, str]]:
    """(argument, as the model sent it, as the approver changed it) for each changed one."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}

    def show(values: dict[str, Any], key: str) -> str:
        return json.dumps(values[key], ensure_ascii=False) if key in values else "(absent)"

    return [
        (key, show(old, key), show(new, key))
        for key in sorted(set(old) | set(new))
        if show(old, key) != show(new, key)
    ]


@dataclass
class KeptEdit:
    """Arguments an approver typed that were refused: shown again with why."""

    arguments: str
    comment: str
    error: str


@dataclass
class QueueCard:
    approval: Approval
    recent: list[Message]
    # The viewer owns the session: four eyes leave the decision to someone else.
    own_session: bool = False
    kept: KeptEdit | None = None

    @property
    def age(self) -> str:
        seconds = int((timezone.now() - self.approval.requested_at).total_seconds())
        if seconds < 60:
            return f"{seconds}s"
        if seconds < 3600:
            return f"{seconds // 60}m"
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.approval.arguments, indent=2, ensure_ascii=False)

    @property
    def is_review(self) -> bool:
        return self.approval.kind == ApprovalKind.RECOVERY_REVIEW

    @property
    def overdue_in(self) -> str:
        return time_left(int((self.approval.deadline - timezone.now()).total_seconds()))

    @property
    def typed_arguments(self) -> str:
        """What the edit box holds: the refused text, else what may be edited."""
        if self.kept is not None:
            return self.kept.arguments
        return json.dumps(self.approval.editable_arguments, indent=2, ensure_ascii=False)

    @property
    def can_edit(self) -> bool:
        """Only an edit that can succeed is offered: a review's only if its node declares
        `editable` values."""
        review = self.approval.review
        return review is None or bool(review["editable"])


def time_left(seconds: int) -> str:
    """A deadline as an approver reads it (the queue page's script counts down the same way)."""
    if seconds <= 0:
        return "overdue"
    if seconds < 120:
        return f"{seconds}s left"
    if seconds < 3600:
        return f"{seconds // 60}m left"
    return f"{seconds // 3600}h {seconds % 3600 // 60}m left"


def queue_groups(request: HttpRequest) -> list[str] | None:
    """The groups whose approvals this user decides; None for a superuser (all). 403 otherwise."""
    if request.user.is_superuser:
        return None
    user_id = request.user.pk
    groups = approver_groups(user_id=user_id) if user_id is not None else None
    if groups is None:
        raise PermissionDenied
    return groups


DECIDE = "approvals.decide_approval"


def may_decide(request: HttpRequest) -> bool:
    """Decides in the admin: the permission, and approver rights (a superuser has both)."""
    user_id = request.user.pk
    if not holds(request, DECIDE) or user_id is None:
        return False
    return bool(request.user.is_superuser) or approver_groups(user_id=user_id) is not None


def approver_only(request: HttpRequest) -> bool:
    """An approver who is not an operator: the queue is all they see."""
    user = request.user
    if not user.is_active or not user.is_staff or user.is_superuser or user.pk is None:
        return False
    # Deciding is an approver's own permission, not an operator's.
    return approver_groups(user_id=user.pk) is not None and user.get_all_permissions() <= {DECIDE}


class ApprovalTransitionInline(ContentMaskedAdmin, admin.TabularInline):
    model = ApprovalTransition
    extra = 0
    can_delete = False
    fields = ("at", "outcome", "from_status", "to_status", "actor", "group", "comment", "arguments")
    readonly_fields = fields
    content_permission = MESSAGE_CONTENT
    content_fields = {"arguments": "arguments_hidden"}
    arguments_hidden = masked("arguments", MESSAGE_CONTENT)

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Approval)
class ApprovalAdmin(ContentMaskedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    # The change pages; approvers act through the queue, routed by their groups.
    tenant_owner_path = "session__owner"
    list_display = (
        "tool_name",
        "status",
        "risk_level",
        "group",
        "session",
        "requested_at",
        "deadline",
        "decided_by_name",
    )
    list_filter = ("status", "kind", "group", "tool_name")
    search_fields = ("tool_name", "session__id", "decided_by_name")
    readonly_fields = tuple(f.name for f in Approval._meta.fields)
    inlines = [ApprovalTransitionInline]
    actions = ["approve", "approve_and_remember", "reject", "withdraw_decision", "change_decision"]
    content_permission = MESSAGE_CONTENT
    content_fields = {
        "arguments": "arguments_hidden",
        "edited_arguments": "edited_arguments_hidden",
        "answer_result": "answer_result_hidden",
    }
    arguments_hidden = masked("arguments", MESSAGE_CONTENT)
    edited_arguments_hidden = masked("edited arguments", MESSAGE_CONTENT)
    answer_result_hidden = masked("answer result", MESSAGE_CONTENT)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # An approval is the record of a decision (or of one awaited: its session waits on
        # the row); it goes only with its session, never by hand (issue 43).
        return False

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return may_decide(request)

    def get_urls(self) -> list[Any]:
        queue = path(
            "queue/", self.admin_site.admin_view(self.queue_view), name="approvals_approval_queue"
        )
        return [queue, *super().get_urls()]

    def queue_view(self, request: HttpRequest) -> HttpResponse:
        """Pending approvals and reviews, oldest first: decide each in one click, or reject many."""
        groups = queue_groups(request)
        kept: dict[str, KeptEdit] = {}
        if request.method == "POST":
            if not may_decide(request):
                raise PermissionDenied
            kept = self._queue_post(request, groups)
            if not kept:
                return HttpResponseRedirect(reverse("admin:approvals_approval_queue"))
        pending = approvals_queue(groups=groups)
        # The conversation so far (not only the last user message), for who may read it.
        context_shown = holds(request, MESSAGE_CONTENT) or may_decide(request)
        recent = (
            messages_recent(session_ids=list({a.session_id for a in pending}), per_session=6)
            if context_shown
            else {}
        )
        cards = [
            QueueCard(
                a,
                recent.get(a.session_id, []),
                own_session=four_eyes_forbids(
                    session_owner_id=a.session.owner_id, decider_id=request.user.pk
                ),
                kept=kept.get(str(a.pk)),
            )
            for a in pending
        ]
        recently = approvals_recently_decided(groups=groups)
        changeable = approvals_changeable(approval_ids=[a.pk for a in recently])
        decided = [
            (
                a,
                arguments_diff(a.arguments, a.edited_arguments) if a.edited_arguments else [],
                a.pk in changeable,
            )
            for a in recently
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Approvals queue",
            "opts": self.opts,
            "cards": cards,
            "oldest": cards[0].age if cards else "",
            "decided": decided,
            "review_answers": ReviewAnswer.choices,
            "approver_only": approver_only(request),
            "can_decide": may_decide(request),
            "context_shown": context_shown,
        }
        # A refused edit comes back with what was typed and why (400), not a redirect.
        status = 400 if kept else 200
        return TemplateResponse(request, "admin/approvals/queue.html", context, status=status)

    def _queue_post(self, request: HttpRequest, groups: list[str] | None) -> dict[str, KeptEdit]:
        """Carry out the queue's form; a refused edit of arguments is returned (by approval
        id) with what was typed, for the page to show again with the reason."""
        action = request.POST.get("action", "")
        ids = (
            request.POST.getlist("ids")
            if action == "reject_selected"
            else [request.POST.get("id", "")]
        )
        comment = request.POST.get("comment", "").strip()
        typed = request.POST.get("arguments", "")
        kept: dict[str, KeptEdit] = {}
        done = 0
        for approval_id in ids:
            approval = approval_get(approval_id=approval_id) if approval_id else None
            if approval is None:
                self.message_user(request, "No such approval.", messages.WARNING)
                continue
            allowed = [approval.group] if groups is None else groups
            try:
                if action == "approve":
                    services.approval_decide(
                        approval_id=approval.pk,
                        approve=True,
                        user=request.user,  # type: ignore[arg-type]
                        groups=allowed,
                        comment=comment,
                        arguments=self._edited(request, approval),
                    )
                elif action in ("reject", "reject_selected"):
                    services.approval_decide(
                        approval_id=approval.pk,
                        approve=False,
                        user=request.user,  # type: ignore[arg-type]
                        groups=allowed,
                        comment=comment or f"rejected in the queue by {request.user}",
                    )
                elif action in ("withdraw", "change"):
                    flipped = "rejected" if approval.status == "approved" else "approved"
                    services.approval_change(
                        approval_id=approval.pk,
                        decision="pending" if action == "withdraw" else flipped,
                        user=request.user,  # type: ignore[arg-type]
                        groups=allowed,
                        comment=comment
                        or (
                            f"changed in the queue by {request.user}"
                            if flipped == "rejected"
                            else ""
                        ),
                    )
                elif action == "review":
                    answer = request.POST.get("answer", "")
                    services.review_answer(
                        approval_id=approval.pk,
                        answer=answer,
                        result=self._json(request, "result") if answer == "took_effect" else None,
                        user=request.user,  # type: ignore[arg-type]
                        groups=allowed,
                        comment=comment,
                    )
                else:
                    self.message_user(request, f"Unknown action {action!r}.", messages.ERROR)
                    return kept
                done += 1
            except DomainError as exc:
                edited = action == "approve" and typed.strip() != self._shown(approval).strip()
                if edited and isinstance(exc, InvalidInput) and approval.status == "pending":
                    kept[str(approval.pk)] = KeptEdit(typed, comment, exc.message)
                else:
                    self.message_user(request, f"{approval}: {exc.message}", messages.WARNING)
        if done:
            said = {
                "withdraw": f"Undone: {done} decision(s) waiting for a decision again.",
                "change": f"Changed {done} decision(s).",
            }.get(action, f"Decided {done} approval(s).")
            self.message_user(request, said, messages.SUCCESS)
        return kept

    @staticmethod
    def _shown(approval: Approval) -> str:
        return json.dumps(approval.editable_arguments, indent=2, ensure_ascii=False)

    def _json(self, request: HttpRequest, field: str) -> Any:
        raw = request.POST.get(field, "").strip()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise InvalidInput(f"{field} is not valid JSON: {exc}") from None

    def _edited(self, request: HttpRequest, approval: Approval) -> dict[str, Any] | None:
        """The arguments as edited on the card, or None when left as the model sent them."""
        edited = self._json(request, "arguments")
        if edited is None or edited == approval.editable_arguments:
            return None
        if not isinstance(edited, dict):
            raise InvalidInput("arguments must be a JSON object")
        return edited

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[Approval], *, approve: bool, remember: bool
    ) -> None:
        user_id = request.user.pk
        groups = (approver_groups(user_id=user_id) or []) if user_id is not None else []
        done = 0
        for approval in queryset:
            allowed = [approval.group] if request.user.is_superuser else groups
            try:
                services.approval_decide(
                    approval_id=approval.pk,
                    approve=approve,
                    user=request.user,  # type: ignore[arg-type]
                    groups=allowed,
                    comment="" if approve else f"rejected in the admin by {request.user}",
                    remember=remember,
                )
                done += 1
            except DomainError as exc:
                self.message_user(request, f"{approval}: {exc.message}", messages.WARNING)
        self.message_user(request, f"Decided {done} approval(s).", messages.SUCCESS)

    @admin.action(description="Approve", permissions=["decide"])
    def approve(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=True, remember=False)

    @admin.action(
        description="Approve and remember for the session (same tool and arguments)",
        permissions=["decide"],
    )
    def approve_and_remember(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=True, remember=True)

    @admin.action(description="Reject", permissions=["decide"])
    def reject(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._decide(request, queryset, approve=False, remember=False)

    def _change(
        self, request: HttpRequest, queryset: QuerySet[Approval], *, withdraw: bool
    ) -> None:
        user_id = request.user.pk
        groups = (approver_groups(user_id=user_id) or []) if user_id is not None else []
        done = 0
        for approval in queryset:
            allowed = [approval.group] if request.user.is_superuser else groups
            flipped = "rejected" if approval.status == "approved" else "approved"
            try:
                services.approval_change(
                    approval_id=approval.pk,
                    decision="pending" if withdraw else flipped,
                    user=request.user,  # type: ignore[arg-type]
                    groups=allowed,
                    comment=""
                    if withdraw or flipped == "approved"
                    else f"changed in the admin by {request.user}",
                )
                done += 1
            except DomainError as exc:
                self.message_user(request, f"{approval}: {exc.message}", messages.WARNING)
        verb = "Withdrew" if withdraw else "Changed"
        self.message_user(request, f"{verb} {done} decision(s).", messages.SUCCESS)

    @admin.action(
        description="Withdraw the decision (pending again; only before the call starts)",
        permissions=["decide"],
    )
    def withdraw_decision(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._change(request, queryset, withdraw=True)

    @admin.action(
        description="Change the decision: approved <-> rejected (only before the call starts)",
        permissions=["decide"],
    )
    def change_decision(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._change(request, queryset, withdraw=False)


_stock_index = admin.site.index


def _index(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    """The admin's home: an approver who is not an operator lands on the queue; everyone
    who may approve sees how many approvals wait."""
    if approver_only(request):
        return HttpResponseRedirect(reverse("admin:approvals_approval_queue"))
    extra = dict(extra_context or {})
    user_id = request.user.pk
    groups = approver_groups(user_id=user_id) if user_id is not None else None
    if request.user.is_superuser or groups is not None:
        mine = None if request.user.is_superuser else groups
        extra["approvals_pending"] = approvals_count(groups=mine)
    return _stock_index(request, extra_context=extra)


# The stock index is bound at URL build time, after this module registers its pages.
admin.site.index = _index  # type: ignore[method-assign,assignment]

"""The admin home: what is wrong right now, above the app list. Failed and stopped turns
of the last 24 h, runs in flight, pending approvals, today's spend against the owner
budgets, workers alive and open circuit breakers, each linking to its filtered list.

A superuser sees the platform; a staff user sees their own tenant's sessions, approvals
and spend (accounts/tenancy.py), and only the lines their permissions open."""

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import redis
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone

from accounts.selectors import approver_groups
from runtime import health
from runtime.breaker import breakers_open

from ..selectors import RUNNING_STATES, home_figures

CENTS = Decimal("0.01")


@dataclass
class HomeLine:
    label: str
    figure: str
    url: str
    alarm: bool = False
    detail: str = ""
    links: list[tuple[str, str]] = field(default_factory=list)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def home_lines(request: HttpRequest) -> tuple[list[HomeLine], list[str]]:
    """The home's lines for this user, and what could not be read (Redis down)."""
    user = request.user
    may = user.has_perm
    owner_id = None if user.is_superuser else user.pk
    lines: list[HomeLine] = []
    problems: list[str] = []
    figures = home_figures(owner_id=owner_id)
    sessions_url = reverse("admin:agent_sessions_session_changelist")
    if may("agent_sessions.view_session"):
        since = timezone.localtime(figures.since).strftime("%Y-%m-%d %H:%M:%S")
        labels = {
            "error": "Turns failed (error)",
            "stopped": "Turns stopped (limit, budget, cancel)",
            "tool_failures": "Turns with tool failures",
        }
        for outcome, n in figures.not_ok.items():
            query = urlencode({"last_turn": outcome, "updated_at__gte": since})
            lines.append(
                HomeLine(
                    f"{labels[outcome]}, 24 h",
                    str(n),
                    f"{sessions_url}?{query}",
                    alarm=n > 0,
                )
            )
        running = urlencode({"state__in": ",".join(RUNNING_STATES)})
        lines.append(HomeLine("Runs in flight", str(figures.running), f"{sessions_url}?{running}"))
    if may("approvals.view_approval"):
        detail = ""
        if figures.approvals_oldest is not None:
            age = (timezone.now() - figures.approvals_oldest).total_seconds()
            detail = f"oldest waits {_ago(age)}"
        # The queue is a superuser's or an approver's (anyone else gets a 403 there): a
        # staff user who may only read approvals gets the pending ones' list instead.
        if user.is_superuser or (
            user.pk is not None and approver_groups(user_id=user.pk) is not None
        ):
            approvals_url = reverse("admin:approvals_approval_queue")
        else:
            approvals_url = (
                reverse("admin:approvals_approval_changelist") + "?status__exact=pending"
            )
        lines.append(
            HomeLine(
                "Approvals pending",
                str(figures.approvals_pending),
                approvals_url,
                alarm=figures.approvals_pending > 0,
                detail=detail,
            )
        )
    if user.is_superuser or may("billing.view_ownerbudget"):
        budgets_url = reverse("admin:billing_ownerbudget_changelist")
        near = [
            (
                f"{b.username}: {b.spent.quantize(CENTS)} of {b.limit.normalize():f} "
                f"({round(b.share * 100)} %)",
                reverse("admin:billing_ownerbudget_changelist")
                + "?"
                + urlencode({"q": b.username}),
            )
            for b in figures.budgets
        ]
        lines.append(
            HomeLine(
                "Spend today",
                str(figures.spend_today.quantize(CENTS)),
                reverse("admin:billing_usagedaily_changelist")
                if user.is_superuser
                else budgets_url,
                alarm=any(b.share >= 0.8 for b in figures.budgets),
                detail="owner day budgets:" if near else "no owner day budget set",
                links=near,
            )
        )
    if may("agent_sessions.view_workerhealth"):
        try:
            reports = health.reports_read()
            down = sum(1 for r in reports if not r.accepting)
            lines.append(
                HomeLine(
                    "Workers alive",
                    str(len(reports)),
                    reverse("admin:agent_sessions_workerhealth_changelist"),
                    alarm=not reports or down > 0,
                    detail=f"{down} not accepting work" if down else "",
                )
            )
        except (redis.RedisError, ValueError, TypeError, KeyError) as exc:
            problems.append(f"Workers: Redis could not be read ({type(exc).__name__})")
    see_models = may("agent_sessions.view_modelendpoint")
    see_tools = may("tools.view_tool")
    if see_models or see_tools:
        try:
            found = [
                b
                for b in breakers_open()
                if (b.kind == "model" and see_models) or (b.kind == "tool" and see_tools)
            ]
            now = time.time()
            links = []
            for b in found:
                page = (
                    "admin:agent_sessions_modelendpoint_changelist"
                    if b.kind == "model"
                    else "admin:tools_tool_changelist"
                )
                state = (
                    f"open {_ago(b.open_until - now)} more" if b.open_until > now else "half-open"
                )
                links.append(
                    (f"{b.kind} {b.name} ({state})", f"{reverse(page)}?{urlencode({'q': b.name})}")
                )
            default_page = (
                "admin:agent_sessions_modelendpoint_changelist"
                if see_models
                else "admin:tools_tool_changelist"
            )
            lines.append(
                HomeLine(
                    "Open circuit breakers",
                    str(len(found)),
                    reverse(default_page),
                    alarm=bool(found),
                    links=links,
                )
            )
        except redis.RedisError as exc:
            problems.append(f"Breakers: Redis could not be read ({type(exc).__name__})")
    return lines, problems


_inner_index = admin.site.index


def _index(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    extra = dict(extra_context or {})
    if request.user.is_active and request.user.is_staff:
        extra["home_lines"], extra["home_problems"] = home_lines(request)
        extra["home_at"] = datetime.now(tz=UTC)
    return _inner_index(request, extra_context=extra)


# Wraps whatever index is bound now (approvals' queue redirect, if loaded first, stays on).
admin.site.index = _index  # type: ignore[method-assign,assignment]

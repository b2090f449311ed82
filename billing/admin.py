"""The billing pages of the admin: the cost page (spend per day as a stacked chart by
model or agent, and rankings as a table, a chart and CSV), credit accounts with their
ledger and grant/adjust actions, owner and API key budgets, cost notices, and credit pools
with their queue of waiting requests.

Pages read through billing/rankings.py and write through billing/services.py only.
"""

import csv
from datetime import date, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from accounts.tenancy import TenantScopedAdmin, tenant_scope
from audit.edits import AuditedAdmin, admin_actor

from .charts import spend_chart
from .models import (
    CreditAccount,
    CreditLedger,
    CreditPool,
    KeyBudget,
    OwnerBudget,
    PoolRequest,
    PoolRequestStatus,
    SpendNotice,
    UsageDaily,
)
from .notices import billing_today
from .rankings import GROUPS, METRICS, SPEND_GROUPS, RankRow, cost_rankings, degradation_levels
from .selectors import day_budgets_total
from .series import RANGES, STACKS, spend_series
from .services import (
    CreditError,
    account_settings_update,
    credits_adjust,
    credits_grant,
    notice_dismiss,
)

CHART_BARS = 20
CSV_LIMIT = 10_000
# The time series draws at most this many days (a longer custom period: its last days).
SERIES_MAX_DAYS = 366
DEFAULT_RANGE = 30


class PeriodForm(forms.Form):
    group = forms.ChoiceField(choices=[(g, g) for g in GROUPS], initial="user", required=False)
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    o = forms.CharField(required=False)
    days = forms.TypedChoiceField(
        choices=[(str(n), str(n)) for n in RANGES], coerce=int, required=False, empty_value=None
    )
    stack = forms.ChoiceField(choices=[(s, s) for s in STACKS], required=False)


def ranked_link(group: str, key: str) -> str:
    """Where a ranked row leads: a user's or a key's sessions, an agent's sessions, an
    endpoint's model calls, a session's page; '' for a day or sessions opened without a key."""
    sessions = reverse("admin:agent_sessions_session_changelist")
    if group == "user":
        return f"{sessions}?{urlencode({'owner__id__exact': key})}"
    if group == "agent":
        return f"{sessions}?{urlencode({'agent__id__exact': key})}"
    if group == "key":
        return f"{sessions}?{urlencode({'api_key_id': key})}" if key != "0" else ""
    if group == "model":
        calls = reverse("admin:agent_sessions_modelcall_changelist")
        return f"{calls}?{urlencode({'endpoint_name': key})}"
    if group == "session":
        return reverse("admin:agent_sessions_session_change", args=[key])
    return ""


def bar_chart(rows: list[RankRow], metric: str) -> SafeString:
    """A horizontal SVG bar chart of the top rows, drawn here: no script, no CDN."""
    rows = rows[:CHART_BARS]
    values = [float(r.value(metric) or 0) for r in rows]
    top = max(values, default=0) or 1.0
    # Drawn 1300 wide and scaled to the page's width (viewBox): about 1:1 at 1,400 px.
    height, width, label_w = 20, 1300, 280
    bars = format_html_join(
        "",
        '<g transform="translate(0,{})"><text x="{}" y="14" text-anchor="end" font-size="13">{}</text>'
        '<rect x="{}" y="2" height="15" width="{}" fill="#417690"><title>{}: {}</title></rect>'
        '<text x="{}" y="14" font-size="13">{}</text></g>',
        (
            (
                i * height,
                label_w - 6,
                row.label[:40],
                label_w,
                round((width - label_w - 80) * value / top, 1),
                row.label,
                value,
                label_w + round((width - label_w - 80) * value / top, 1) + 4,
                f"{value:g}",
            )
            for i, (row, value) in enumerate(zip(rows, values, strict=True))
        ),
    )
    return format_html(
        '<svg role="img" aria-label="{} by {}" viewBox="0 0 {} {}" width="100%" '
        'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">{}</svg>',
        metric,
        "row",
        width,
        max(len(rows), 1) * height,
        bars,
    )


@admin.register(UsageDaily)
class CostRankingsAdmin(admin.ModelAdmin):
    """The rollup table's page is the rankings page: users, agents, sessions or days
    over a chosen period, sortable by any metric, as a table, a chart and CSV."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Every tenant's spending side by side: the platform's operators only.
        return bool(request.user.is_superuser)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = PeriodForm(request.GET or None)
        # The rollups' days are BILLING_TIME_ZONE's.
        today = billing_today()
        days, stack = DEFAULT_RANGE, "model"
        group, order = "user", "-cost"
        start, end = today - timedelta(days=days - 1), today
        if form.is_valid():
            data = form.cleaned_data
            group = data["group"] or group
            order = data["o"] or order
            stack = data["stack"] or stack
            if data["days"]:
                days = data["days"]
                start, end = today - timedelta(days=days - 1), today
            elif data["start"] or data["end"]:
                days = 0  # a custom period
                start = data["start"] or start
                end = data["end"] or end
        if start > end:
            start, end = end, start
        metric = order.lstrip("-") if order.lstrip("-") in METRICS else "cost"
        if request.GET.get("format") == "csv":
            rows = cost_rankings(group=group, start=start, end=end, order=order, limit=CSV_LIMIT)
            return _csv(rows, group, start, end)
        rows = cost_rankings(group=group, start=start, end=end, order=order, limit=100)
        levels = degradation_levels(group=group, keys=[r.key for r in rows])
        series = spend_series(
            stack=stack, start=max(start, end - timedelta(days=SERIES_MAX_DAYS - 1)), end=end
        )
        # The chart adds up every owner's spend, so its line adds up their day budgets.
        budget, budgets = day_budgets_total()
        query = {"group": group, "start": start.isoformat(), "end": end.isoformat()}
        columns = [
            (
                METRIC_LABELS[m],
                "-" + m if order != "-" + m else m,
                m == metric,
                order.startswith("-"),
            )
            for m in METRICS
            if group not in SPEND_GROUPS or m not in ("tool_calls", "credits_spent")
        ]
        period = {"start": start.isoformat(), "end": end.isoformat()}
        context = {
            **self.admin_site.each_context(request),
            "title": "Cost",
            "opts": self.model._meta,
            "form": PeriodForm(initial={**query, "o": order}),
            "rows": [(row, levels.get(row.key), ranked_link(group, row.key)) for row in rows],
            "spend_groups": group in SPEND_GROUPS,
            "series_chart": spend_chart(
                series,
                budget,
                f"day budget{'s' if budgets != 1 else ''} of {budgets} owner{'s' if budgets != 1 else ''}",
            ),
            "series": series,
            "stack": stack,
            "stacks": STACKS,
            "days": days,
            "ranges": RANGES,
            "today": today,
            # Links that change one choice and keep the others.
            "range_links": [
                (n, "?" + urlencode({"days": n, "stack": stack, "group": group, "o": order}))
                for n in RANGES
            ],
            "stack_links": [
                (s, "?" + urlencode({"stack": s, "group": group, "o": order, **period}))
                for s in STACKS
            ],
            "group_links": [
                (g, "?" + urlencode({"group": g, "stack": stack, **period})) for g in GROUPS
            ],
            "levels": group in ("user", "agent"),
            "group": group,
            "groups": GROUPS,
            "start": start,
            "end": end,
            "order": order,
            "columns": columns,
            "query": query,
            "chart": bar_chart(rows, metric),
            "metric": METRIC_LABELS[metric],
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/billing/rankings.html", context)


# Column headings a person reads; the CSV keeps the field names for spreadsheets and scripts.
METRIC_LABELS = {
    "cost": "cost",
    "input_tokens": "input tokens",
    "output_tokens": "output tokens",
    "model_calls": "model calls",
    "tool_calls": "tool calls",
    "credits_spent": "credits spent",
}


# A cell a spreadsheet would read as a formula (OWASP "CSV injection"): a username such
# as `=HYPERLINK(...)` is written with a leading quote, so it is shown as text.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def _csv(rows: list[RankRow], group: str, start: date, end: date) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = (
        f'attachment; filename="cost-{group}-{start.isoformat()}-{end.isoformat()}.csv"'
    )
    writer = csv.writer(response)
    writer.writerow([group, "key", *METRICS])
    for row in rows:
        writer.writerow([csv_cell(row.label), csv_cell(row.key), *(row.value(m) for m in METRICS)])
    return response


class LedgerInline(admin.TabularInline):
    model = CreditLedger
    fields = ("created_at", "kind", "points", "delta", "balance_after", "actor", "note", "tool")
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).order_by("-id")


class PointsForm(forms.Form):
    points = forms.IntegerField(help_text="Grant: points to add (>= 0). Adjust: +/- points.")
    daily_cap = forms.IntegerField(required=False, min_value=0, help_text="Grant only: new cap.")
    note = forms.CharField(required=False, max_length=500)


@admin.register(CreditAccount)
class CreditAccountAdmin(TenantScopedAdmin, admin.ModelAdmin):
    list_display = (
        "owner",
        "balance",
        "reserved",
        "daily_cap",
        "spent_today",
        "low_water_mark",
        "updated_at",
    )
    search_fields = ("owner__username",)
    list_select_related = ("owner",)
    readonly_fields = ("owner", "balance", "reserved", "spent_today", "spent_day", "actions_links")
    fields = (
        "owner",
        "balance",
        "reserved",
        "daily_cap",
        "spent_today",
        "spent_day",
        "low_water_mark",
        "actions_links",
    )
    inlines = [LedgerInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # accounts open with their first grant

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Titled by whose credits they are, not the row's id."""
        rows = tenant_scope(CreditAccount.objects.select_related("owner"), request.user, "owner")
        account = rows.filter(pk=int(object_id)).first() if str(object_id).isdigit() else None
        extra = dict(extra_context or {})
        if account is not None:
            extra["title"] = f"Credits of {account.owner.get_username()}"
            extra["subtitle"] = None  # the title says it; the fields show the balance
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def save_model(self, request: HttpRequest, obj: CreditAccount, form: Any, change: bool) -> None:
        # Only the settings are editable here; points move through grant and adjust.
        account_settings_update(
            owner_id=obj.owner_id,
            daily_cap=obj.daily_cap,
            low_water_mark=obj.low_water_mark,
            actor=f"admin:{request.user.get_username()}",
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="points")
    def actions_links(self, obj: CreditAccount) -> str:
        return format_html(
            '<a class="button" href="{}">Grant</a> <a class="button" href="{}">Adjust</a>',
            reverse("admin:billing_creditaccount_points", args=[obj.pk, "grant"]),
            reverse("admin:billing_creditaccount_points", args=[obj.pk, "adjust"]),
        )

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<int:pk>/points/<str:action>/",
                self.admin_site.admin_view(self.points_view),
                name="billing_creditaccount_points",
            ),
            *super().get_urls(),
        ]

    def points_view(self, request: HttpRequest, pk: int, action: str) -> HttpResponse:
        account = get_object_or_404(
            tenant_scope(CreditAccount.objects.all(), request.user, "owner"), pk=pk
        )
        if not self.has_change_permission(request, account):
            # "view" shows the account; moving points is a change (403, as Django's own pages).
            raise PermissionDenied
        if action not in ("grant", "adjust"):
            return HttpResponseRedirect(reverse("admin:billing_creditaccount_change", args=[pk]))
        form = PointsForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            actor = f"admin:{request.user.get_username()}"
            try:
                if action == "grant":
                    credits_grant(
                        owner_id=account.owner_id,
                        points=data["points"],
                        actor=actor,
                        daily_cap=data["daily_cap"],
                        set_daily_cap=data["daily_cap"] is not None,
                        note=data["note"],
                    )
                else:
                    credits_adjust(
                        owner_id=account.owner_id,
                        delta=data["points"],
                        actor=actor,
                        note=data["note"],
                    )
            except CreditError as exc:
                form.add_error("points", str(exc))
            else:
                messages.success(request, f"{action}: {data['points']} points for {account.owner}")
                return HttpResponseRedirect(
                    reverse("admin:billing_creditaccount_change", args=[pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.title()} points: {account.owner}",
            "opts": self.model._meta,
            "original": account,
            "form": form,
            "action": action,
        }
        return TemplateResponse(request, "admin/billing/points.html", context)


@admin.register(OwnerBudget)
class OwnerBudgetAdmin(AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    list_display = (
        "owner",
        "turn_tokens",
        "turn_cost",
        "session_tokens",
        "session_cost",
        "day_tokens",
        "day_cost",
        "month_tokens",
        "month_cost",
    )
    search_fields = ("owner__username",)
    autocomplete_fields = ("owner",)
    fieldsets = (
        (None, {"fields": ("owner",)}),
        (
            "Per turn and per session (a run's own limits)",
            {"fields": ("turn_tokens", "turn_cost", "session_tokens", "session_cost")},
        ),
        (
            "Per day and per calendar month (BILLING_TIME_ZONE; a new period starts at zero)",
            {"fields": ("day_tokens", "day_cost", "month_tokens", "month_cost")},
        ),
    )


@admin.register(KeyBudget)
class KeyBudgetAdmin(AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    """A budget for the sessions one API key opens, per day or calendar month."""

    list_display = ("api_key", "owner", "period", "tokens", "cost", "updated_at")
    list_filter = ("period",)
    search_fields = ("api_key__prefix", "api_key__name", "owner__username")
    list_select_related = ("api_key__owner", "owner")
    fields = ("api_key", "period", "tokens", "cost")
    raw_id_fields = ("api_key",)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "api_key":
            # A staff user budgets their own tenant's keys only (superusers: every key).
            keys = db_field.remote_field.model.objects.all()
            kwargs["queryset"] = tenant_scope(keys, request.user, "owner")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: KeyBudget, form: Any, change: bool) -> None:
        # The owner is the key's: the gate finds watched owners without a join.
        obj.owner_id = obj.api_key.owner_id
        super().save_model(request, obj, form, change)


@admin.register(SpendNotice)
class SpendNoticeAdmin(TenantScopedAdmin, admin.ModelAdmin):
    """Cost notices: budgets past a threshold and low balances, newest first. The banner on
    every admin page shows those not dismissed whose period still runs."""

    list_display = (
        "created_at",
        "kind",
        "message",
        "threshold",
        "period_start",
        "period_end",
        "state",
        "webhook_status",
    )
    list_filter = ("kind", "threshold", "period_start")
    search_fields = ("message", "subject")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in SpendNotice._meta.fields]
    actions = ["dismiss"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="state")
    def state(self, obj: SpendNotice) -> str:
        if obj.dismissed_at is not None:
            return f"dismissed by {obj.dismissed_by}"
        return "open" if obj.period_end > billing_today() else "period over"

    def has_dismiss_permission(self, request: HttpRequest) -> bool:
        # The platform's operators' notices: the banner shows to superusers only.
        return bool(request.user.is_superuser)

    @admin.action(
        description="Dismiss the selected notices (hide their banner)", permissions=["dismiss"]
    )
    def dismiss(self, request: HttpRequest, queryset: Any) -> None:
        dismissed = sum(
            notice_dismiss(notice_id=pk, actor=admin_actor(request))
            for pk in queryset.values_list("pk", flat=True)
        )
        messages.success(request, f"{dismissed} notice(s) dismissed.")

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<int:pk>/dismiss/",
                self.admin_site.admin_view(self.dismiss_view),
                name="billing_spendnotice_dismiss",
            ),
            *super().get_urls(),
        ]

    def dismiss_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The banner's "dismiss" button (a POST; a GET changes nothing)."""
        if not self.has_dismiss_permission(request):
            raise PermissionDenied
        notice = get_object_or_404(self.get_queryset(request), pk=pk)
        if request.method == "POST":
            notice_dismiss(notice_id=notice.pk, actor=admin_actor(request))
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("admin:billing_spendnotice_changelist")
        return HttpResponseRedirect(back)


def _level(pool: CreditPool) -> str:
    return f"{pool.in_use} / {pool.size} ({100 * pool.in_use // max(pool.size, 1)} %)"


@admin.register(CreditPool)
class CreditPoolAdmin(AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    """Credit pools: their size and level (points granted to calls in flight), and a link to
    each one's queue. `in_use` is the grants' own: never edited here."""

    list_display = ("name", "owner", "size", "level", "queue", "enabled", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("name", "owner__username")
    fields = ("name", "owner", "size", "enabled", "in_use")
    readonly_fields = ("in_use",)
    autocomplete_fields = ("owner",)

    @admin.display(description="level")
    def level(self, obj: CreditPool) -> str:
        return _level(obj)

    @admin.display(description="waiting")
    def queue(self, obj: CreditPool) -> SafeString:
        waiting = obj.requests.filter(status=PoolRequestStatus.WAITING).count()
        url = reverse("admin:billing_poolrequest_changelist")
        return format_html(
            '<a href="{}?pool__id__exact={}&status=waiting">{} waiting</a>', url, obj.pk, waiting
        )


class QueueStatusFilter(admin.SimpleListFilter):
    """The queue by default: the waiting requests (the others are its history)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*PoolRequestStatus.choices, ("all", "All")]

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": (self.value() or PoolRequestStatus.WAITING) == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value() or PoolRequestStatus.WAITING
        if value == "all":
            return queryset
        if value not in PoolRequestStatus.values:
            return queryset.none()
        return queryset.filter(status=value)


class PoolFilter(admin.RelatedFieldListFilter):
    """The pools a staff user's requests can be in: their tenant's and the global one
    (another tenant's pool names are not theirs to read)."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[Any]:
        pools = CreditPool.objects.order_by("name")
        if not request.user.is_superuser:
            pools = pools.filter(Q(owner__isnull=True) | Q(owner=request.user))
        return [(pool.pk, str(pool)) for pool in pools]


@admin.register(PoolRequest)
class PoolRequestAdmin(TenantScopedAdmin, admin.ModelAdmin):
    """The credit pools' queue: each waiting request with its ROI (value / cost), value,
    cost and age, in the order it will be granted, and its pool's level. Read-only: the
    grants alone move it."""

    # Long actions, pool names and notes are shortened (whole in a tooltip and on the
    # request's page) so that every column stays on a 1,400 px screen.
    list_display = (
        "action_shown",
        "roi_shown",
        "value",
        "cost",
        "age",
        "status",
        "pool_level",
        "session_link",
        "note_shown",
    )
    list_display_links = ("action_shown",)
    list_filter = (QueueStatusFilter, ("pool", PoolFilter))
    list_select_related = ("pool",)
    search_fields = ("action", "=session_id")
    # The grant order: highest ROI first, ties in arrival order.
    ordering = ("pool", "-roi", "id")
    readonly_fields = [f.name for f in PoolRequest._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="ROI", ordering="roi")
    def roi_shown(self, obj: PoolRequest) -> str:
        return f"{obj.roi:.3g}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: PoolRequest) -> str:
        end = obj.granted_at or timezone.now()
        seconds = max(int((end - obj.created_at).total_seconds()), 0)
        if seconds < 120:
            return f"{seconds} s"
        if seconds < 7200:
            return f"{seconds // 60} min"
        return f"{seconds // 3600} h"

    @admin.display(description="action", ordering="action")
    def action_shown(self, obj: PoolRequest) -> SafeString:
        return format_html(
            '<span title="{}" style="overflow-wrap: anywhere">{}</span>',
            obj.action,
            Truncator(obj.action).chars(48),
        )

    @admin.display(description="note")
    def note_shown(self, obj: PoolRequest) -> SafeString:
        return format_html('<span title="{}">{}</span>', obj.note, Truncator(obj.note).chars(60))

    @admin.display(description="pool level")
    def pool_level(self, obj: PoolRequest) -> SafeString:
        return format_html(
            '<span title="{}">{}: {}</span>',
            obj.pool.name,
            Truncator(obj.pool.name).chars(28),
            _level(obj.pool),
        )

    @admin.display(description="session")
    def session_link(self, obj: PoolRequest) -> SafeString:
        url = reverse("admin:agent_sessions_session_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.session_id)[:8])

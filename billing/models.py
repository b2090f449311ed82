"""Credit accounts, their ledger and reservations, and the daily usage rollups.

Every change of a balance is one guarded UPDATE plus one ledger row in the same
transaction (billing/services.py); the CHECK constraints are the last line of
defence, never the mechanism. The rollups are kept incrementally by upserts in
the step's own transaction, so rankings read a few rows per owner and day,
never the raw calls.

Sessions are referenced by plain id columns: billing never imports sessions
(import-linter), and a ledger outlives the sessions it charged.
"""

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce


class CreditAccount(models.Model):
    """An owner's points. `balance` is what is free to reserve; points held by
    in-flight calls sit in `reserved` until they are settled (spent) or released
    (given back to `balance`). `spent_today` counts reserved and settled points of
    `spent_day` (the owner's day in BILLING_TIME_ZONE) against `daily_cap`."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_account"
    )
    balance = models.BigIntegerField(default=0)
    reserved = models.BigIntegerField(default=0)
    daily_cap = models.BigIntegerField(
        null=True, blank=True, help_text="Points per day at most; empty: no cap."
    )
    spent_today = models.BigIntegerField(default=0)
    spent_day = models.DateField(null=True, blank=True)
    low_water_mark = models.BigIntegerField(
        default=0, help_text="A `credits.low` progress event fires when the balance drops below it."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(balance__gte=0), name="credit_balance_not_negative"),
            models.CheckConstraint(
                condition=Q(reserved__gte=0), name="credit_reserved_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(spent_today__gte=0), name="credit_spent_today_not_negative"
            ),
        ]

    def __str__(self) -> str:
        # Named by its owner, as the admin's pages title it (the balance moves).
        return f"credits of {self.owner.get_username()}"


class LedgerKind(models.TextChoices):
    GRANT = "grant"
    RESERVE = "reserve"
    SETTLE = "settle"
    RELEASE = "release"
    ADJUST = "adjust"
    CHARGE = "charge"  # a model call's tokens, taken after the call (no reservation)


class CreditLedger(models.Model):
    """One row per change. `delta` is the signed change of `balance` (grant and
    release add, reserve and charge take, settle moves reserved points to spent and
    leaves the balance alone, adjust either way): the deltas of an account sum to its
    balance."""

    # No index of its own: `credit_ledger_account` (account, -id) leads with it, and a
    # second index would be one more write on every ledger row.
    account = models.ForeignKey(
        CreditAccount, on_delete=models.CASCADE, related_name="ledger", db_index=False
    )
    kind = models.CharField(max_length=10, choices=LedgerKind.choices)
    points = models.BigIntegerField(help_text="The amount the entry is about (always >= 0).")
    delta = models.BigIntegerField(help_text="Signed change of the balance.")
    balance_after = models.BigIntegerField()
    idempotency_key = models.CharField(max_length=200, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    note = models.CharField(max_length=500, blank=True)
    session_id = models.UUIDField(null=True, blank=True)
    agent_id = models.BigIntegerField(null=True, blank=True)
    tool = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # A re-run after a crash cannot reserve, settle or release a call twice.
            models.UniqueConstraint(
                fields=["kind", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="credit_ledger_once_per_key",
            ),
            models.CheckConstraint(condition=Q(points__gte=0), name="credit_ledger_points_gte_0"),
        ]
        indexes = [models.Index(fields=["account", "-id"], name="credit_ledger_account")]

    def __str__(self) -> str:
        return f"{self.kind} {self.points}"


class ReservationStatus(models.TextChoices):
    WAITING = "waiting"  # queued for points held by in-flight calls; nothing deducted
    RESERVED = "reserved"
    SETTLED = "settled"
    RELEASED = "released"
    REFUSED = "refused"  # waited in vain (or could never be paid): nothing was deducted


class CreditReservation(models.Model):
    """The points of one tool call, keyed by the call's idempotency key."""

    idempotency_key = models.CharField(max_length=200, unique=True)
    account = models.ForeignKey(
        CreditAccount, on_delete=models.CASCADE, related_name="reservations"
    )
    session_id = models.UUIDField(null=True, blank=True)
    agent_id = models.BigIntegerField(null=True, blank=True)
    tool = models.CharField(max_length=100, blank=True)
    points = models.BigIntegerField()
    status = models.CharField(max_length=10, choices=ReservationStatus.choices)
    value_per_point = models.FloatField(
        default=0.0,
        help_text="The session's value divided by the points: waiters are served highest first.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    wait_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A waiting call gives up (insufficient_credits) after this.",
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["account", "-value_per_point"],
                condition=Q(status="waiting"),
                name="credit_reservation_waiting",
            ),
            models.Index(
                fields=["created_at"],
                condition=Q(status="reserved"),
                name="credit_reservation_open",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(points__gt=0), name="credit_reservation_points_gt_0")
        ]

    def __str__(self) -> str:
        return f"{self.idempotency_key}: {self.points} {self.status}"


class UsageDaily(models.Model):
    """Per owner, agent and day (BILLING_TIME_ZONE): what the agent spent for the owner.

    Striped over up to 8 rows by session (`shard`: `billing_rollup_shard(session_id)`,
    migration 0008), and every reader sums them: every step of every session upserts
    its row, and a row lock lasts until the commit, so with one row the owner's
    concurrent steps committed one after another, each with a WAL flush of its own."""

    # No index of its own: usage_daily_key leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    agent = models.ForeignKey("agent_sessions.Agent", on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    model_calls = models.BigIntegerField(default=0)
    tool_calls = models.BigIntegerField(default=0)
    credits_spent = models.BigIntegerField(default=0)
    shard = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        # The admin's index names the page after what it shows (not "Usage dailys").
        verbose_name = "cost and usage"
        verbose_name_plural = "cost and usage"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "agent", "day", "shard"], name="usage_daily_key"
            )
        ]
        indexes = [
            models.Index(fields=["day", "owner"], name="usage_daily_day_owner"),
            models.Index(fields=["day", "agent"], name="usage_daily_day_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}/{self.agent_id}/{self.day}"


class ToolUsageDaily(models.Model):
    """Per tool, owner and day: calls, failures, time and points (striped like UsageDaily)."""

    tool = models.CharField(max_length=100)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    calls = models.BigIntegerField(default=0)
    failures = models.BigIntegerField(default=0)
    total_ms = models.BigIntegerField(default=0)
    credits_spent = models.BigIntegerField(default=0)
    shard = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        verbose_name = "tool usage per day"
        verbose_name_plural = "tool usage per day"
        constraints = [
            models.UniqueConstraint(
                fields=["tool", "owner", "day", "shard"], name="tool_usage_daily_key"
            )
        ]
        indexes = [models.Index(fields=["day", "tool"], name="tool_usage_daily_day_tool")]

    def __str__(self) -> str:
        return f"{self.tool}/{self.owner_id}/{self.day}"


class OwnerBudget(models.Model):
    """An owner's budgets over all their agents (billing/budgets.py); empty = no limit.
    The agent's own budgets are fields of the agent; a model call must fit both."""

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budget"
    )
    turn_tokens = models.BigIntegerField(null=True, blank=True)
    turn_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    session_tokens = models.BigIntegerField(null=True, blank=True)
    session_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    day_tokens = models.BigIntegerField(null=True, blank=True)
    day_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # A calendar month in BILLING_TIME_ZONE: the spend is the sum of the month's daily
    # rollups, so a new month starts at zero with no reset job.
    month_tokens = models.BigIntegerField(null=True, blank=True)
    month_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "owner budget"

    def __str__(self) -> str:
        return f"budget of {self.owner.get_username()}"


class SpendDaily(models.Model):
    """Per day, owner, agent, model endpoint and API key: the model calls' tokens and cost.

    The cost pages' series by model and their breakdowns per endpoint and per key read it
    (a few rows per key and day, never the raw calls), and so do the per-key budgets. A
    step writes it in its own batch (engine/gates/metering.py), one multi-row upsert, no
    commit of its own; striped by session like UsageDaily. `api_key_id` 0: no key (the
    session was opened by the admin, a command or a workflow)."""

    # No index of its own: spend_daily_key leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    day = models.DateField()
    agent_id = models.BigIntegerField()
    endpoint = models.CharField(max_length=100)
    # A plain id, not a foreign key: billing never imports accounts, and a revoked or
    # deleted key's spend stays on the books.
    api_key_id = models.BigIntegerField(default=0)
    shard = models.SmallIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    model_calls = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "spend per day"
        verbose_name_plural = "spend per day"
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "day", "agent_id", "endpoint", "api_key_id", "shard"],
                name="spend_daily_key",
            )
        ]
        indexes = [
            # The cost page's period: the series by model and the ranking of endpoints.
            models.Index(fields=["day", "endpoint"], name="spend_daily_day_endpoint"),
            # A key's budget sums its days of the period; the key ranking's second pass.
            models.Index(fields=["api_key_id", "day"], name="spend_daily_key_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.endpoint} key {self.api_key_id}"


class BudgetPeriod(models.TextChoices):
    DAY = "day"
    MONTH = "month"


class KeyBudget(models.Model):
    """A budget for the model calls of sessions opened with one API key, per day or per
    calendar month (BILLING_TIME_ZONE). Spend is keyed by day (SpendDaily), so a new
    period starts at zero: nothing has to reset it. Empty limits: no limit."""

    api_key = models.OneToOneField(
        "accounts.ApiKey", on_delete=models.CASCADE, related_name="budget"
    )
    # The key's owner, copied when the budget is saved: the gate asks "is this owner
    # watched?" without a join through accounts.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    period = models.CharField(
        max_length=5, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH
    )
    tokens = models.BigIntegerField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "API key budget"

    def __str__(self) -> str:
        return f"budget of key {self.api_key_id} per {self.period}"


class NoticeKind(models.TextChoices):
    BUDGET = "budget"
    CREDITS_LOW = "credits_low"


class SpendNotice(models.Model):
    """A budget crossed a threshold share of its limit, or a balance fell below its
    low-water mark: shown as a banner on every admin page until its period ends or an
    operator dismisses it, and POSTed to COST_NOTICE_WEBHOOK_URL.

    One row per (subject, threshold, period): the unique constraint is the dedupe, so
    concurrent steps that see the same crossing insert one row and send one webhook."""

    kind = models.CharField(max_length=12, choices=NoticeKind.choices)
    # What crossed: "owner:<id>:month", "key:<id>:day", "agent:<id>:day", "credits:<owner id>".
    subject = models.CharField(max_length=100)
    threshold = models.PositiveSmallIntegerField(help_text="Percent of the limit (or 0).")
    period_start = models.DateField()
    period_end = models.DateField(help_text="The first day the notice no longer applies.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", null=True
    )
    message = models.CharField(max_length=300)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    dismissed_at = models.DateTimeField(null=True, blank=True)
    dismissed_by = models.CharField(max_length=150, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_status = models.CharField(max_length=200, blank=True)

    class Meta:
        verbose_name = "cost notice"
        constraints = [
            models.UniqueConstraint(
                fields=["subject", "threshold", "period_start"], name="spend_notice_once"
            )
        ]
        indexes = [
            # The banner: notices not dismissed whose period still runs.
            models.Index(
                fields=["period_end"],
                condition=Q(dismissed_at__isnull=True),
                name="spend_notice_open",
            )
        ]

    def __str__(self) -> str:
        return self.message


class BudgetHold(models.Model):
    """What a session's model call in flight may still cost: its worst case (the request's
    input plus its `max_tokens`, priced at the endpoint it goes to), held against the
    owner's shared budgets (owner day and month, the agent's day, the API key's period)
    from before the call until the step that records it commits (which deletes the row).

    `billing_budget_reserve` (migration 0010) takes it only if every budget's spend, plus
    every other hold of the owner, plus this one fits, under a per-owner lock: concurrent
    turns cannot all pass the same check. One row per session: a run taken over replaces
    its session's row; a crashed run's row stops counting at `expires_at` and the sweeper
    deletes it once the session's lease lapsed."""

    session_id = models.UUIDField(primary_key=True)
    owner_id = models.BigIntegerField()
    agent_id = models.BigIntegerField()
    api_key_id = models.BigIntegerField(default=0)
    # The run (its lease owner) that holds it: more calls of the same run's step add up.
    run = models.CharField(max_length=200, blank=True)
    tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = "budget hold"
        indexes = [models.Index(fields=["owner_id"], name="budget_hold_owner")]

    def __str__(self) -> str:
        return f"{self.session_id}: {self.tokens} tokens, {self.cost}"


class CreditPool(models.Model):
    """Points that paid tool calls borrow while they run (docs/cost-and-budgets.md "Credit
    pools"): a call's estimated cost is granted from its pool before it runs and comes back
    when its results commit. One global pool (no owner) and/or one per tenant (an owner);
    a tenant's own pool is used before the global one. Requests that do not fit wait
    (`PoolRequest`) and are granted highest `value / cost` first, ties in arrival order.

    `in_use` changes only in `billing_pool_grant` / `billing_pool_dispatch` (migration
    0011) and the release statement, each under the row's lock: concurrent workers cannot
    grant past `size`. It may exceed a size an operator lowered; nothing more is granted
    until it is back under."""

    name = models.CharField(max_length=100, unique=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="+",
        null=True,
        blank=True,
        help_text="The tenant whose calls use it; empty: the global pool.",
    )
    size = models.BigIntegerField(help_text="Points that may be granted at once.")
    in_use = models.BigIntegerField(default=0, help_text="Points granted to calls in flight.")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "credit pool"
        constraints = [
            models.CheckConstraint(condition=Q(size__gt=0), name="credit_pool_size_gt_0"),
            models.CheckConstraint(condition=Q(in_use__gte=0), name="credit_pool_in_use_gte_0"),
            # One pool per tenant and one global pool (owner 0): the grant takes "the" one.
            models.UniqueConstraint(
                Coalesce("owner", models.Value(0)), name="credit_pool_one_per_owner"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # An edit (the admin's, a config file's) never writes `in_use` back: grants and
        # releases change it under the row's lock meanwhile, and a stale copy would hand
        # out points twice.
        if self.pk is not None and not kwargs.get("force_insert") and "update_fields" not in kwargs:
            kwargs["update_fields"] = ["name", "owner", "size", "enabled", "updated_at"]
        super().save(*args, **kwargs)


class PoolRequestStatus(models.TextChoices):
    WAITING = "waiting"  # no room yet: its session is parked (waiting_credits)
    GRANTED = "granted"  # its points are in the pool's in_use while the call runs
    RELEASED = "released"  # the call's results committed: the points came back
    REFUSED = "refused"  # its turn ended while it waited, or it can never fit


class PoolRequest(models.Model):
    """One tool step's request for pool points: its action (the paid tools), estimated
    value and cost, and their ratio, by which waiting requests are granted."""

    key = models.CharField(max_length=200, unique=True)
    pool = models.ForeignKey(CreditPool, on_delete=models.CASCADE, related_name="requests")
    # The session's owner (the tenant): the admin's queue shows a tenant only its own.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    session_id = models.UUIDField()
    action = models.CharField(max_length=200)
    value = models.FloatField()
    cost = models.BigIntegerField()
    roi = models.FloatField(help_text="value / cost: waiting requests are granted highest first.")
    status = models.CharField(max_length=10, choices=PoolRequestStatus.choices)
    note = models.CharField(
        max_length=500,
        blank=True,
        help_text="Why the value or cost is not the tool's estimate (its expression failed).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    granted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "credit pool request"
        indexes = [
            # The queue, in grant order.
            models.Index(
                "pool",
                models.F("roi").desc(),
                "id",
                condition=Q(status="waiting"),
                name="pool_request_queue",
            ),
            models.Index(fields=["session_id"], name="pool_request_session"),
            # The sweeper's look for points a dead or cancelled turn still holds.
            models.Index(
                fields=["session_id"], condition=Q(status="granted"), name="pool_request_granted"
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(cost__gt=0), name="pool_request_cost_gt_0"),
            models.CheckConstraint(condition=Q(value__gte=0), name="pool_request_value_gte_0"),
        ]

    def __str__(self) -> str:
        return f"{self.action}: {self.cost} points, ROI {self.roi:.3g}"

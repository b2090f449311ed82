"""Named reads of sessions, their history and their events."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from django.conf import settings
from django.contrib.postgres.aggregates import StringAgg
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Substr
from django.utils import timezone

from approvals.models import Approval
from approvals.selectors import approvals_pending_oldest
from approvals.states import UNDO_HOLD, ApprovalStatus
from billing.selectors import OwnerDaySpend, spend_today
from observability.readings import Gauge
from record.errors import InvalidInput, NotFound
from record.events import EventType
from record.models import (
    Agent,
    AgentVersion,
    Checkpoint,
    Event,
    Message,
    ModelCall,
    ModelEndpoint,
    Session,
    ToolCall,
    ToolCallStatus,
    Transition,
    TurnOutcomeChoice,
)
from record.states import State
from runtime.fastpaths.prepared import PreparedQuery
from workflows.selectors import run_graph_svg

from .status import call_key

# The API's session read (every GET of a session): compiled once (runtime/fastpaths/prepared.py).
_session_of_owner: PreparedQuery[Session] = PreparedQuery(
    lambda pk, owner_id: Session.objects.select_related(
        "agent", "workflow_version__workflow", "agent_version__agent"
    ).filter(pk=pk, owner_id=owner_id),
    example=[UUID(int=0), 0],
)


def session_id_parse(session_id: UUID | str) -> UUID | None:
    """The id as the database takes it; None if it cannot name a session."""
    if isinstance(session_id, UUID):
        return session_id
    try:
        return UUID(str(session_id))
    except (ValueError, TypeError, AttributeError):
        return None


def session_get_for_owner(*, session_id: UUID | str, owner_id: int) -> Session:
    """Another owner's session is reported as missing, not forbidden."""
    pk = session_id_parse(session_id)
    session = None if pk is None else _session_of_owner.first(pk, owner_id)
    if session is None:
        raise NotFound(f"session {session_id} not found")
    return session


# A page of the session list ends at a session; the next starts after it, in the list's
# order (newest first): "<created_at in µs since the epoch>.<id>", opaque to clients.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def session_cursor(session: Session) -> str:
    return f"{(session.created_at - _EPOCH) // timedelta(microseconds=1)}.{session.pk.hex}"


def session_cursor_parse(cursor: str) -> tuple[datetime, UUID]:
    """The (created_at, id) a cursor names; InvalidInput for anything else."""
    micros, _, pk = cursor.partition(".")
    try:
        return _EPOCH + timedelta(microseconds=int(micros)), UUID(hex=pk)
    except (ValueError, OverflowError):
        raise InvalidInput(
            f"before must be a cursor from a Link header; got {cursor[:80]!r}",
            details={"field": "before"},
        ) from None


def session_list_for_owner(
    *, owner_id: int, ephemeral: bool = False, before: str | None = None
) -> QuerySet[Session]:
    """The owner's sessions, newest first; ephemeral ones (stateless OpenAI-compatible
    requests) only with `ephemeral`; with `before` (a cursor), those after it in that order."""
    rows = Session.objects.select_related(
        "agent", "workflow_version__workflow", "agent_version__agent"
    ).filter(owner_id=owner_id)
    if not ephemeral:
        rows = rows.filter(ephemeral=False)
    if before:
        created, pk = session_cursor_parse(before)
        rows = rows.filter(Q(created_at__lt=created) | Q(created_at=created, pk__lt=pk))
    return rows.order_by("-created_at", "-pk")


def message_history(*, session: Session, limit: int, before: int | None = None) -> list[Message]:
    """The last `limit` messages, oldest first; messages waiting for their turn come last.
    With `before` (a seq): the last `limit` of those before it (no waiting ones)."""
    rows_q = Message.objects.filter(session=session)
    if before is not None:
        rows_q = rows_q.filter(seq__lt=before)
    rows = list(rows_q.order_by(F("seq").desc(nulls_first=True), "-id")[:limit])
    rows.reverse()
    return rows


def events_after(*, session_id: UUID | str, after: int, limit: int = 1000) -> list[Event]:
    return list(Event.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:limit])


@dataclass(frozen=True)
class EventsPage:
    """One page of a session's events; `more`: events after the last one exist."""

    events: list[Event]
    more: bool


# SQL names from model metadata (constants); every value is a bound parameter. The
# innermost query takes the page's rows by count first, so a page never measures more
# than `limit + 1` events however long the session is.
_EVENTS_PAGE = f"""
SELECT page.id, page.session_id, page.seq, page.type, page.data, page.created_at, page.fetched
  FROM (SELECT head.*,
               sum(octet_length(head.data::text)) OVER (ORDER BY head.seq) AS running,
               row_number() OVER (ORDER BY head.seq) AS position,
               count(*) OVER () AS fetched
          FROM (SELECT * FROM "{Event._meta.db_table}"
                 WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s) head) page
 WHERE page.position = 1 OR page.running <= %s
 ORDER BY page.seq"""  # nosec B608


def events_page(
    *, session_id: UUID | str, after: int, limit: int, max_bytes: int | None = None
) -> EventsPage:
    """Events after `after`, at most `limit` of them and `max_bytes` of payload
    (EVENTS_PAGE_MAX_BYTES), always at least one while any is left."""
    budget = int(settings.EVENTS_PAGE_MAX_BYTES) if max_bytes is None else max_bytes
    pk = session_id_parse(session_id)
    if pk is None:
        return EventsPage(events=[], more=False)
    rows = list(Event.objects.raw(_EVENTS_PAGE, [pk, after, limit + 1, budget]))
    fetched = int(getattr(rows[0], "fetched", 0)) if rows else 0
    more = fetched > len(rows) or len(rows) > limit
    return EventsPage(events=rows[:limit], more=more)


def sessions_event_seq(*, session_ids: list[str]) -> dict[str, int]:
    """The last event seq of each session (a missing one was deleted): one query for all."""
    rows = Session.objects.filter(pk__in=session_ids).values_list("pk", "event_seq")
    return {str(pk): seq for pk, seq in rows}


def checkpoints_of(*, session: Session, limit: int) -> list[Checkpoint]:
    return list(Checkpoint.objects.filter(session=session).order_by("-step")[:limit])


def agents_enabled() -> QuerySet[Agent]:
    """The agents a key may open sessions on (every enabled one; tools are gated by role)."""
    return Agent.objects.filter(enabled=True, workflow__isnull=True).order_by("slug")


def agents_listed() -> QuerySet[Agent]:
    """The enabled agents with their latest configuration version (`version`)."""
    latest = AgentVersion.objects.filter(agent=OuterRef("pk")).order_by("-number")
    return agents_enabled().annotate(version=Subquery(latest.values("number")[:1]))


TimelineKind = Literal["transition", "message", "toolcall", "event", "checkpoint"]
# The order a step writes its rows in: rows of one instant keep it on the timeline.
TIMELINE_KINDS: tuple[TimelineKind, ...] = (
    "transition",
    "message",
    "toolcall",
    "event",
    "checkpoint",
)


@dataclass(frozen=True)
class TimelineEntry:
    """One row of a session's history as stored; how it reads is the caller's business."""

    kind: TimelineKind
    pk: int
    at: datetime
    # The row's place in its own table (id, event seq or checkpoint step): breaks time ties.
    order: int
    seq: int | None
    # The state moved to (transitions) or saved (checkpoints); "" for the others.
    state: str
    row: dict[str, Any]


@dataclass(frozen=True)
class SessionTimeline:
    entries: list[TimelineEntry]
    # Older entries exist than those returned.
    truncated: bool


def session_timeline(*, session_id: UUID | str, limit: int) -> SessionTimeline:
    """The last `limit` things that happened to a session, oldest first.

    One bounded query per table (each ordered by an indexed column), then a
    merge by time; ties keep the order a step writes them in.
    """
    entries: list[TimelineEntry] = []
    truncated = False

    def bounded(rows: QuerySet[Any, Any]) -> list[dict[str, Any]]:
        nonlocal truncated
        fetched = list(rows[: limit + 1])
        truncated |= len(fetched) > limit
        return fetched[:limit]

    for r in bounded(
        Transition.objects.filter(session_id=session_id)
        .order_by("-id")
        .values(
            "id", "at", "from_state", "to_state", "trigger", "reason", "actor", "version", "turn"
        )
    ):
        entries.append(
            TimelineEntry("transition", r["id"], r["at"], r["id"], None, r["to_state"], r)
        )
    for r in bounded(
        Message.objects.filter(session_id=session_id)
        .order_by("-id")
        .values(
            "id",
            "created_at",
            "seq",
            "turn",
            "role",
            "status",
            "content",
            "tool_calls",
            "tool_call_id",
            "name",
            "data",
            "token_count",
            "archived_at",
        )
    ):
        entries.append(TimelineEntry("message", r["id"], r["created_at"], r["id"], r["seq"], "", r))
    for r in bounded(
        ToolCall.objects.filter(session_id=session_id)
        .annotate(waiting=call_waiting())
        .order_by("-id")
        .values(
            "waiting",
            "id",
            "created_at",
            "finished_at",
            "turn",
            "step",
            "position",
            "call_id",
            "tool_name",
            "input",
            "proposed_input",
            "status",
            "refusal",
            "output",
            "error",
            "elapsed_ms",
            "idempotency_key",
            "risk_level",
            "risk_reason",
        )
    ):
        entries.append(TimelineEntry("toolcall", r["id"], r["created_at"], r["id"], None, "", r))
    for r in bounded(
        Event.objects.filter(session_id=session_id)
        .order_by("-seq")
        .values("id", "created_at", "seq", "type", "data")
    ):
        entries.append(TimelineEntry("event", r["id"], r["created_at"], r["seq"], r["seq"], "", r))
    for r in bounded(
        Checkpoint.objects.filter(session_id=session_id)
        .order_by("-step")
        .values("id", "created_at", "step", "turn", "state", "message_seq", "size_bytes", "context")
    ):
        entries.append(
            TimelineEntry("checkpoint", r["id"], r["created_at"], r["step"], None, r["state"], r)
        )

    entries.sort(key=lambda e: (e.at, TIMELINE_KINDS.index(e.kind), e.order))
    if len(entries) > limit:
        truncated = True
        entries = entries[-limit:]
    return SessionTimeline(entries=entries, truncated=truncated)


def last_stop_reason(session_ref: Any) -> Subquery:
    """The stop reason of a session's last finished turn (an indexed, backwards scan)."""
    return Subquery(
        Event.objects.filter(session=session_ref, type=EventType.TURN_FINISHED)
        .order_by("-seq")
        .values("data__stop_reason")[:1]
    )


def first_message(session_ref: Any, chars: int) -> Subquery:
    """The first `chars` characters of a session's first user message (the list's column:
    one probe of the (session, seq) index per row, no more of the text than is shown)."""
    return Subquery(
        Message.objects.filter(session=session_ref, role="user")
        .order_by("seq")
        .values(text=Substr("content", 1, chars))[:1]
    )


# 'simple': no stemming and no stop words, so names, codes and order numbers match as
# written (a GIN index on this very expression: message_content_search).
SEARCH_CONFIG = "simple"


def sessions_saying(*, text: str) -> QuerySet[Message, Any]:
    """The ids of the sessions whose messages say `text` (web-search syntax: words, "a
    phrase", -word, or), by PostgreSQL full-text search on the messages' GIN index."""
    query = SearchQuery(text, config=SEARCH_CONFIG, search_type="websearch")
    return (
        Message.objects.annotate(said=SearchVector("content", config=SEARCH_CONFIG))
        .filter(said=query)
        .values("session_id")
    )


@dataclass(frozen=True)
class SessionActivity:
    """How a session's last turn ended, and how its model and tool calls went."""

    stop_reason: str | None
    stop_turn: int | None
    finished_at: datetime | None
    model_calls: int
    model_failures: int
    models: str
    tool_calls: int
    # The session's calls by status (sessions/status.py CALLS keys), all turns together.
    tool_counts: dict[str, int]


def session_activity(*, session: Session) -> SessionActivity:
    """Three small reads: the last finished turn, and the model and tool call counts."""
    last = (
        Event.objects.filter(session=session, type=EventType.TURN_FINISHED)
        .order_by("-seq")
        .values("data", "created_at")
        .first()
    )
    data = last["data"] if last and isinstance(last["data"], dict) else {}
    calls = ModelCall.objects.filter(session=session).aggregate(
        count=Count("id"),
        failures=Count("id", filter=~Q(outcome="success")),
        models=StringAgg("endpoint_name", delimiter=", ", distinct=True, default=""),
    )
    counts: dict[str, int] = {}
    for status, refusal, is_waiting, n in (
        ToolCall.objects.filter(session=session)
        .annotate(waiting=call_waiting())
        .values_list("status", "refusal", "waiting")
        .annotate(n=Count("id"))
        .order_by()
    ):
        key = call_key(status, refusal, waiting=is_waiting)
        counts[key] = counts.get(key, 0) + n
    return SessionActivity(
        stop_reason=data.get("stop_reason"),
        stop_turn=data.get("turn"),
        finished_at=last["created_at"] if last else None,
        model_calls=calls["count"],
        model_failures=calls["failures"],
        models=calls["models"],
        tool_calls=sum(counts.values()),
        tool_counts=counts,
    )


def messages_recent(*, session_ids: list[Any], per_session: int = 4) -> dict[Any, list[Message]]:
    """Each session's last few messages of the conversation, oldest first (one query): what
    the user and the assistant said, the tool calls the assistant asked for and their
    results (platform notes and summaries left out)."""
    from django.db.models import Window
    from django.db.models.functions import RowNumber

    if not session_ids:
        return {}
    rows = (
        Message.objects.filter(
            session_id__in=session_ids, role__in=["user", "assistant", "tool"], status="final"
        )
        .exclude(Q(content="") & Q(tool_calls__isnull=True))
        .exclude(Q(content="") & Q(tool_calls=[]))
        .annotate(
            recent=Window(RowNumber(), partition_by=[F("session_id")], order_by=F("id").desc())
        )
        .filter(recent__lte=per_session)
        .only("session_id", "role", "name", "content", "tool_calls", "created_at", "seq")
    )
    found: dict[Any, list[Message]] = {}
    for message in sorted(rows, key=lambda m: m.pk):
        found.setdefault(message.session_id, []).append(message)
    return found


def sessions_gauges() -> list[Gauge]:
    """Scrape-time gauges (observability/collector.py): sessions by state (an index-only
    count on `session_state`) and runs in flight (sessions whose lease is held and current)."""
    by_state = Session.objects.values_list("state").annotate(n=Count("id")).order_by()
    in_flight = (
        Session.objects.filter(lease_owner__isnull=False, lease_expires_at__gt=timezone.now())
        .exclude(lease_owner=UNDO_HOLD)  # a decision's undo window: no run in flight yet
        .count()
    )
    return [
        Gauge(
            "agent_sessions",
            "Sessions by state.",
            ("state",),
            [((str(state),), n) for state, n in by_state],
        ),
        Gauge(
            "agent_runs_in_flight",
            "Sessions a worker holds the lease of right now (a step running or about to).",
            (),
            [((), in_flight)],
        ),
    ]


def workflow_run_graph(*, session: Session) -> str:
    """A workflow run's graph as SVG, coloured by what it did (404 for a conversation)."""
    if session.workflow_version_id is None:
        raise NotFound(
            f"session {session.pk} is a conversation, not a workflow run",
            code="not_a_workflow_run",
        )
    return run_graph_svg(session)


@dataclass(frozen=True)
class RoutingFigures:
    turns: int
    small_turns: int
    escalated: int
    cost: Decimal
    cost_main_only: Decimal


def agent_routing_figures(*, agent: Agent, days: int = 30) -> RoutingFigures:
    """An agent's turns by model tier over the last `days`, and what the small model saved:
    its calls priced at the agent's own model's prices, against what they cost."""
    since = timezone.now() - timedelta(days=days)
    calls = ModelCall.objects.filter(session__agent=agent, purpose="step", created_at__gte=since)
    turns = calls.values("session_id", "turn").distinct().count()
    small = calls.filter(tier="small")
    small_turns = small.values("session_id", "turn").distinct().count()
    escalated = calls.filter(tier_reason__startswith="escalated").count()
    totals = small.aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"), c=Sum("cost"))
    cost = calls.aggregate(c=Sum("cost"))["c"] or Decimal(0)
    main = ModelEndpoint.objects.get(pk=agent.model_id)  # today's prices
    main_price = (
        Decimal(totals["i"] or 0) * main.price_input_per_1k
        + Decimal(totals["o"] or 0) * main.price_output_per_1k
    ) / 1000
    return RoutingFigures(
        turns=turns,
        small_turns=small_turns,
        escalated=escalated,
        cost=cost,
        cost_main_only=(cost - (totals["c"] or Decimal(0)) + main_price).quantize(
            Decimal("0.000001")
        ),
    )


# The states of a run in flight: a step running or about to (DESIGN.md's state machine).
RUNNING_STATES = (State.PROCESSING, State.TOOL_WAIT, State.TOOL_LOOP)


@dataclass(frozen=True)
class HomeFigures:
    """What is wrong right now, for the admin home (sessions/admin/home.py)."""

    since: datetime
    # Sessions whose last ended turn did not go well and that moved in the window, by outcome.
    not_ok: dict[str, int]
    running: int
    awaiting_approval: int
    approvals_pending: int
    approvals_oldest: datetime | None
    spend_today: Decimal
    budgets: list[OwnerDaySpend]


def home_figures(*, owner_id: int | None, hours: int = 24) -> HomeFigures:
    """Four aggregate queries (sessions by state, by outcome; approvals, spend) plus one
    for the budgets.
    `owner_id` None: the whole platform (a superuser), else one tenant's figures.

    "In the last 24 h" is the session's `updated_at` (a turn's end writes the session),
    so a session whose last turn failed long ago and that nobody touched since is not counted."""
    since = timezone.now() - timedelta(hours=hours)
    # An evaluation's replays are its own (evaluations/), not the platform's turns.
    rows = Session.objects.filter(ephemeral=False, evaluation_id__isnull=True)
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
    bad = [TurnOutcomeChoice.ERROR, TurnOutcomeChoice.STOPPED, TurnOutcomeChoice.TOOL_FAILURES]
    # Two small reads instead of one pass over every session (130 ms at 100k sessions):
    # the states in flight through `session_state`, the turns not ok of the window through
    # `session_not_ok_updated` (bench/admin_home.py).
    by_state = dict(
        rows.filter(state__in=[*RUNNING_STATES, State.AWAITING_APPROVAL])
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    by_outcome = dict(
        rows.filter(last_turn_outcome__in=bad, updated_at__gte=since)
        .values_list("last_turn_outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    figures = {
        "running": sum(by_state.get(s, 0) for s in RUNNING_STATES),
        "awaiting": by_state.get(State.AWAITING_APPROVAL, 0),
        **{f"o_{o.value}": by_outcome.get(o.value, 0) for o in bad},
    }
    pending, oldest = approvals_pending_oldest(owner_id=owner_id)
    spent, budgets = spend_today(owner_id=owner_id)
    return HomeFigures(
        since=since,
        not_ok={o.value: figures[f"o_{o.value}"] for o in bad},
        running=figures["running"],
        awaiting_approval=figures["awaiting"],
        approvals_pending=pending,
        approvals_oldest=oldest,
        spend_today=spent,
        budgets=budgets,
    )


def call_waiting() -> Exists:
    """Whether an approval of the call (the row) is pending: sessions/status.py says
    "waiting for approval" for such an open call, "running" for another."""
    return Exists(
        Approval.objects.filter(tool_call_id=OuterRef("pk"), status=ApprovalStatus.PENDING)
    )


def tool_calls_waiting_marked(calls: QuerySet[ToolCall]) -> QuerySet[ToolCall]:
    """The calls, each with `waiting` (`call_waiting`)."""
    return calls.annotate(waiting=call_waiting())


def tool_calls_in_status(calls: QuerySet[ToolCall], key: str) -> QuerySet[ToolCall]:
    """The calls whose status (sessions/status.py CALLS) is `key`; all for an unknown key."""
    pending = call_waiting()
    refused = Q(status=ToolCallStatus.REJECTED)
    match = {
        "waiting": Q(pending, status=ToolCallStatus.EXECUTING),
        "running": Q(~pending, status=ToolCallStatus.EXECUTING),
        "ok": Q(status=ToolCallStatus.SUCCESS),
        "failed": Q(status__in=[ToolCallStatus.FAILED, ToolCallStatus.TIMEOUT]),
        "rejected": refused & ~Q(refusal__in=["expired", "unpaid"]),
        "expired": refused & Q(refusal="expired"),
        "unpaid": refused & Q(refusal="unpaid"),
    }.get(key)
    return calls if match is None else calls.filter(match)

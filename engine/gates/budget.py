"""Before a model call: the degradation level, the budgets and the endpoint's rate limit.

1. Pressure (budget spent, credits against the low-water mark, the model's breaker,
   queue depth) sets the session's degradation level; from level 1 the call goes to the
   agent's cheaper model with a lower output limit.
   The figures behind them (the owner's budgets, today's rollups, the turn's spend, the
   credits) are read once and kept for the run (`KeptFigures`, in the run's context),
   advanced locally with what each step of this session spent; read again at a new turn,
   when the local estimate nears a limit, or when they are `FIGURES_MAX_AGE_S` old.
2. The call's estimate is checked against every budget of the agent and the owner: it
   runs, runs with a lower output limit, or is refused (the turn ends with
   `budget_exceeded`). It prices the endpoint the call goes to (`called_endpoint`: the
   degraded tier, the caller's choice such as the routed small model, else the agent's
   model or its rollout candidate), its tokens counted with that endpoint's tokenizer.
3. The endpoint's per-owner rate limit: a short wait sleeps, a long one parks the session
   (StepDeferred) and re-enqueues it for when the window turns, holding no worker.
4. Last before the call (`budget_hold`): its worst case is held against the owner's day,
   month, agent-day and key budgets, which the owner's other sessions spend at the same
   time; the step's commit gives it back (engine/moves/metering.step_metering).
"""

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from billing.budgets import Budget, BudgetVerdict, CallEstimate, Spent, budget_check, used_share
from billing.degradation import CHEAPER, Pressure, degradation_level
from billing.notices import notice_candidates
from billing.pressure import (
    OwnerFigures,
    owner_figures,
    owner_watched,
    queue_depth,
    worker_pressure,
)
from billing.ratelimit import RateLimit, rate_limit_take
from billing.services import budget_reserve
from engine.gates import BUDGET_NOTE, Stop, Verdict, partial_answer  # noqa: F401 (BUDGET_NOTE: tests/billing)
from engine.model.calls import (
    endpoint_tokenizer,
    first_enabled_endpoint,
    give_back_connection,
    primary_endpoint,
)
from engine.model.credits import FIGURES_NEAR_CREDITS
from engine.model.environment import GateRead
from llm.types import ChatRequest
from memory.tokens import estimate_request_tokens
from record.events import StopReason
from record.models import Agent, ModelCall, ModelEndpoint, Session
from record.states import Trigger
from runtime.breaker import model_breaker

BREAKER_TTL_S = 1.0
# Kept figures are read again once a budget is this much spent (other sessions of the
# owner spend meanwhile, unseen here), once the balance is within FIGURES_NEAR_CREDITS
# low-water marks (engine/model/credits.py), or once they are this old.
FIGURES_NEAR_SHARE = 0.8
FIGURES_MAX_AGE_S = 30.0
_breakers: dict[str, tuple[float, bool]] = {}


class StepDeferred(Exception):
    """The step cannot run before `seconds` (a rate limit): park the session meanwhile."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"deferred {seconds:.1f} s")
        self.seconds = seconds


@dataclass(frozen=True)
class ModelGate:
    level: int
    endpoint: ModelEndpoint  # where the call goes, as priced
    request: ChatRequest
    verdict: BudgetVerdict
    # The cheaper endpoint degradation chose (None: not degraded, or the caller chose).
    tier: ModelEndpoint | None = None
    # The call as priced (its output limit the request's) and the budgets it was judged by:
    # what `budget_hold` holds, and against what.
    call: CallEstimate | None = None
    budgets: tuple[tuple[Budget, Spent], ...] = ()


def degraded_tier(agent: Agent, level: int) -> ModelEndpoint | None:
    """The cheaper endpoint a degraded step goes to; None below CHEAPER or without one."""
    if level < CHEAPER:
        return None
    endpoint = first_enabled_endpoint(agent.cheap_model, agent.fallback_model, default=agent.model)
    return None if endpoint.pk == agent.model_id else endpoint


def called_endpoint(
    session: Session, agent: Agent, level: int, chosen: ModelEndpoint | None = None
) -> tuple[ModelEndpoint, ModelEndpoint | None]:
    """Where a model call goes first, and the degraded tier if that is it: `chosen` (the
    caller's: a workflow node's model, the routed small model), else the degraded tier,
    else the agent's model or its rollout candidate (engine/model/calls.call_model)."""
    tier = None if chosen is not None else degraded_tier(agent, level)
    return chosen or tier or primary_endpoint(agent, session)[0], tier


def _model_failing(endpoint: ModelEndpoint) -> bool:
    now = time.monotonic()
    seen = _breakers.get(endpoint.name)
    if seen is not None and now - seen[0] < BREAKER_TTL_S:
        return seen[1]
    failing = model_breaker().state(endpoint.name).state == "open"
    _breakers[endpoint.name] = (now, failing)
    return failing


def agent_budgets(
    agent: Agent, session: Session, turn: Spent, day: Spent
) -> list[tuple[Budget, Spent]]:
    spent = Spent(session.input_tokens + session.output_tokens, session.cost)
    return [
        (Budget("agent", "turn", agent.budget_turn_tokens, agent.budget_turn_cost), turn),
        (Budget("agent", "session", agent.budget_session_tokens, agent.budget_session_cost), spent),
        (Budget("agent", "day", agent.budget_day_tokens, agent.budget_day_cost), day),
    ]


AGENT_BUDGETS = (
    "budget_turn_tokens",
    "budget_turn_cost",
    "budget_session_tokens",
    "budget_session_cost",
    "budget_day_tokens",
    "budget_day_cost",
)


@dataclass(frozen=True)
class KeptFigures:
    """The owner's figures as one read found them, and the session's spend at that read."""

    figures: OwnerFigures
    turn: int
    agent_id: int
    session_spent: Spent
    read_at: float

    def advanced(self, spent: Spent) -> OwnerFigures:
        """The figures now, as far as this session knows: plus what it spent since the read."""
        delta = Spent(
            spent.tokens - self.session_spent.tokens, spent.cost - self.session_spent.cost
        )
        old = self.figures
        turn = _plus(old.turn, delta)
        budgets = []
        for budget, was in old.budgets:
            if budget.period == "turn":
                budgets.append((budget, turn))
            elif budget.period == "session":
                budgets.append((budget, spent))
            else:
                budgets.append((budget, _plus(was, delta)))
        return dataclasses.replace(
            old, budgets=budgets, agent_day=_plus(old.agent_day, delta), turn=turn
        )


def _plus(a: Spent, b: Spent) -> Spent:
    return Spent(a.tokens + b.tokens, a.cost + b.cost)


def _figures(session: Session, agent: Agent, keep: "FiguresKeeper | None") -> OwnerFigures:
    """The owner's figures: kept from this run's read while far from every limit, else read.

    1. Nothing to check (no agent budget, no owner budget or credit account): no query.
    2. Kept figures of the same turn and agent, younger than FIGURES_MAX_AGE_S, advanced
       with what the session spent since: used if no budget is FIGURES_NEAR_SHARE spent
       and the credits are not near the low-water mark.
    3. Otherwise one query, kept for the next steps.
    """
    session_spent = Spent(session.input_tokens + session.output_tokens, session.cost)
    if not (
        any(getattr(agent, name) is not None for name in AGENT_BUDGETS)
        or owner_watched(owner_id=session.owner_id)
    ):
        return OwnerFigures(budgets=[], agent_day=Spent(), turn=Spent(), credits_left=None)
    kept = keep.kept if keep is not None else None
    if (
        kept is not None
        and kept.turn == session.turn
        and kept.agent_id == agent.pk
        and time.monotonic() - kept.read_at < FIGURES_MAX_AGE_S
    ):
        figures = kept.advanced(session_spent)
        budgets = agent_budgets(agent, session, figures.turn, figures.agent_day) + figures.budgets
        if used_share(budgets) < FIGURES_NEAR_SHARE and (
            figures.credits_left is None or figures.credits_left >= FIGURES_NEAR_CREDITS
        ):
            return figures
    figures = owner_figures(
        owner_id=session.owner_id,
        agent_id=agent.pk,
        session_id=session.pk,
        turn=session.turn,
        session_spent=session_spent,
        model_call_table=ModelCall._meta.db_table,
        api_key_id=session.api_key_id,
    )
    if keep is not None:
        keep.points_since = 0
        keep.kept = KeptFigures(
            figures=figures,
            turn=session.turn,
            agent_id=agent.pk,
            session_spent=session_spent,
            read_at=time.monotonic(),
        )
    return figures


@dataclass
class FiguresKeeper:
    """Where a run keeps the owner's figures between its steps (RunContext holds one), and
    the credit points this run reserved or was charged since they were read (an upper
    bound: a reservation found again after a crash counts once more)."""

    kept: KeptFigures | None = None
    points_since: int = 0

    def spent_points(self, points: int) -> None:
        self.points_since += max(points, 0)


def gate_read(session: Session, agent: Agent, keep: FiguresKeeper | None = None) -> GateRead:
    """The budgets with their spend, the owner's figures and the degradation level;
    `keep` (the run's) lets later steps of a turn use the figures of an earlier read."""
    figures = _figures(session, agent, keep)
    budgets = agent_budgets(agent, session, figures.turn, figures.agent_day) + figures.budgets
    # Operators hear of a day or month budget nearing its limit, or a low balance: the
    # crossings are returned, and the model phase raises them (billing.services.notices_raise).
    notices = tuple(
        notice_candidates(
            budgets=budgets,
            owner_id=session.owner_id,
            agent_id=agent.pk,
            api_key_id=session.api_key_id,
            credits=None
            if figures.credits is None
            else (figures.credits[0], figures.low_water_mark),
        )
    )
    failing = _model_failing(agent.model)
    level = degradation_level(
        Pressure(
            budget_used=used_share(budgets),
            credits_left=figures.credits_left,
            model_failing=failing,
            queue_depth=queue_depth(),
            workers_unhealthy=worker_pressure(),
        )
    )
    return GateRead(
        budgets=budgets, figures=figures, level=level, model_failing=failing, notices=notices
    )


def model_gate(
    session: Session,
    agent: Agent,
    request: ChatRequest,
    read: GateRead | None = None,
    keep: FiguresKeeper | None = None,
    *,
    chosen: ModelEndpoint | None = None,
) -> ModelGate:
    """The degradation, and the budgets' verdict on the call priced at the endpoint it
    goes to (`called_endpoint`; `chosen`: the caller's choice of endpoint)."""
    read = read or gate_read(session, agent, keep)
    budgets, level = read.budgets, read.level
    endpoint, tier = called_endpoint(session, agent, level, chosen)
    estimate_in = estimate_request_tokens(request, endpoint_tokenizer(endpoint))
    if level >= CHEAPER:
        limit = min(request.max_tokens or agent.degraded_max_tokens, agent.degraded_max_tokens)
        request = dataclasses.replace(request, max_tokens=limit)
    call = CallEstimate(
        estimate_in,
        request.max_tokens or settings.BUDGET_OUTPUT_ESTIMATE_TOKENS,
        endpoint.price_input_per_1k,
        endpoint.price_output_per_1k,
    )
    verdict = budget_check(budgets=budgets, call=call)
    if verdict.max_tokens is not None:
        request = dataclasses.replace(request, max_tokens=verdict.max_tokens)
        call = dataclasses.replace(call, output_tokens=verdict.max_tokens)
    return ModelGate(
        level=level,
        endpoint=endpoint,
        request=request,
        verdict=verdict,
        tier=tier,
        call=call,
        budgets=tuple(budgets),
    )


def budget_hold(session: Session, gate: ModelGate) -> ModelGate:
    """Right before an allowed call is sent: hold its worst case (its input and output limit
    at the called endpoint's prices) against the owner's shared budgets (day, month, the
    agent's day, the API key's), which other sessions spend at the same time. One round
    trip, none without such a budget; the step's commit gives the hold back.

    Refused (the owner's other calls hold or spent too much meanwhile): judged again on the
    figures the refusal read, a smaller output limit is held once more; else the verdict
    refuses the call, naming the budget (the turn stops as `budget_stop` says).
    """
    call = gate.call
    if call is None or not gate.verdict.allowed or not any(b.shared for b, _ in gate.budgets):
        return gate
    for _attempt in range(2):
        held = budget_reserve(
            owner_id=session.owner_id,
            agent_id=session.agent_id,
            api_key_id=session.api_key_id,
            session_id=session.pk,
            run=session.lease_owner or "",
            call=call,
            budgets=[b for b, _ in gate.budgets],
        )
        if held.held:
            # The step's commit releases it (engine/moves/metering.step_metering).
            session.budget_held = True  # type: ignore[attr-defined]
            request = dataclasses.replace(gate.request, max_tokens=call.output_tokens)
            return dataclasses.replace(gate, request=request, call=call)
        fresh = [(b, held.spent.get(b.label, spent)) for b, spent in gate.budgets]
        verdict = budget_check(budgets=fresh, call=call)
        if not verdict.allowed or verdict.max_tokens is None:
            break
        call = dataclasses.replace(call, output_tokens=verdict.max_tokens)
    exceeded = next(b for b, _ in gate.budgets if b.label == held.exceeded)
    refused = BudgetVerdict(False, exceeded=exceeded, used=gate.verdict.used)
    return dataclasses.replace(gate, verdict=refused)


def hold_carried(fresh: Session, session: Session) -> Session:
    """The session read again (a cancel came mid-step), still knowing that its step holds a
    budget: the cancel's commit gives the hold back."""
    fresh.budget_held = getattr(session, "budget_held", False)  # type: ignore[attr-defined]
    return fresh


def model_rate_limit(session: Session, endpoint: ModelEndpoint, request: ChatRequest) -> None:
    """Wait for the endpoint's per-owner rate limit; raise StepDeferred for a long wait."""
    limit = RateLimit(endpoint.rate_limit_calls_per_min, endpoint.rate_limit_tokens_per_min)
    if not limit.active:
        return
    tokens = estimate_request_tokens(request, endpoint_tokenizer(endpoint)) + (
        request.max_tokens or 0
    )
    while True:
        wait = rate_limit_take(
            kind="model", name=endpoint.name, owner_id=session.owner_id, limit=limit, tokens=tokens
        )
        if wait is None:
            return
        if wait > settings.RATE_LIMIT_INLINE_WAIT_S:
            raise StepDeferred(wait)
        give_back_connection()
        time.sleep(wait)


def budget_stop(gate: ModelGate, history: list[Any], turn: int) -> Verdict[None]:
    """The budget's verdict: a spent budget ends the turn with what the agent has so far."""
    if gate.verdict.allowed:
        return Verdict()
    stop = Stop(
        trigger=Trigger.LIMIT_REACHED,
        stop_reason=StopReason.BUDGET_EXCEEDED,
        content=partial_answer(history, turn),
        reason=f"{StopReason.BUDGET_EXCEEDED}: {gate.verdict.message}",
        refused="budget",
    )
    return Verdict(stop=stop)

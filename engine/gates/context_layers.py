"""The context layers a model step adds to the conversation (runtime-mechanisms §2).

- Execution context (pending calls, idempotency keys, the lease, deadlines) is the
  checkpoint's: none of it is given to the model.
- Dialogue state: intent and slots from the user's new messages (memory/dialogue.py),
  written to `Session.dialogue_state` by this step's own commit.
- Environment: time and time zone, budget and credits left, degraded services, made
  from what the budget gate reads anyway (budget_gate.gate_read); the peak hour, the
  host's load and the offered tools' health (engine/model/surroundings.py, cached).
- The customer app's `extra_context` sent with this turn's message: data, in a fence.

Each layer is one short system block after the system prompt, and the same facts go to
`ChatRequest.agent_config` (`dialogue`, `environment`, `extra_context`) for policies
such as the offline rules model.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection

from engine.gates import Contribution, Verdict
from engine.model.calls import cheap_endpoint, side_call
from engine.model.credits import model_credits_check
from engine.model.environment import GateRead, seen_of
from engine.model.surroundings import Surroundings, agent_time_zone, env_clock, surroundings
from llm.types import ChatMessage, ChatRequest
from memory.dialogue import (
    Extractor,
    extract,
    extractor_for,
    model_input,
    model_instructions,
    state_from_model,
)
from memory.layers import (
    BudgetLeft,
    CreditsLeft,
    EnvironmentFacts,
    dialogue_block,
    environment_block,
    environment_facts,
    extra_context_block,
)
from record.models import Agent, Message, ModelCall, ModelEndpoint, Session
from runtime.breaker import model_breaker
from runtime.peak_hours import time_zone
from tools.execution import ToolSnapshot, tool_breaker

logger = logging.getLogger(__name__)
# A dialogue-state answer is a short JSON object.
DIALOGUE_OUTPUT_TOKENS = 300


def _user_text(message: Message) -> str | None:
    """What the user wrote in this message: a user message, or an answer to `ask_user`."""
    if message.role == "user":
        return message.content
    data = message.data
    if message.role == "tool" and isinstance(data, dict) and data.get("by") == "user":
        answer = data.get("answer")
        return answer if isinstance(answer, str) else None
    return None


@dataclass(frozen=True)
class DialogueUpdate:
    state: dict[str, Any] | None
    calls: list[ModelCall]


def dialogue_update(session: Session, agent: Agent, history: list[Message]) -> DialogueUpdate:
    """The dialogue state after the user's messages the extractor has not read yet (None if
    there are none, or the agent declares no dialogue), and the model call it took.

    1. The user's texts since the last message the extractor read.
    2. `extractor: model` (and a model that is not the offline rules model): one call
       with the declared names; its JSON becomes the state.
    3. Otherwise, or when that call fails or answers nonsense: the declared keywords,
       patterns and values. A failed extraction never fails the step.
    """
    extractor = extractor_for(agent.dialogue)
    if extractor.empty:
        return DialogueUpdate(None, [])
    previous = session.dialogue_state or {}
    read_up_to = int(previous.get("seq") or 0)
    texts = []
    # From the end back to the last message read: the cost follows the new messages, not
    # the history (a platform note at the end has no seq yet).
    for message in reversed(history):
        if message.seq is None:
            continue
        if message.seq <= read_up_to:
            break
        text = _user_text(message)
        if text is not None:
            texts.append((message.seq, text))
    if not texts:
        return DialogueUpdate(None, [])
    texts.reverse()
    calls: list[ModelCall] = []
    endpoint = cheap_endpoint(agent)
    if extractor.by_model and endpoint.api != "rules":
        state, record = _model_dialogue(session, endpoint, extractor, previous, texts)
        if record is not None:
            calls.append(record)
        if state is not None:
            return DialogueUpdate(state, calls)
    return DialogueUpdate(dict(extract(extractor, previous, texts, turn=session.turn)), calls)


def _model_dialogue(
    session: Session,
    endpoint: ModelEndpoint,
    extractor: Extractor,
    previous: dict[str, Any],
    texts: list[tuple[int, str]],
) -> tuple[dict[str, Any] | None, ModelCall | None]:
    request = ChatRequest(
        messages=(
            ChatMessage(role="system", content=model_instructions(extractor)),
            ChatMessage(role="user", content=model_input(previous, texts)),
        ),
        tool_choice="none",
        temperature=0,
        max_tokens=DIALOGUE_OUTPUT_TOKENS,
        agent_config={"task": "dialogue", "rules": [], "fallback_answer": ""},
    )
    credits = model_credits_check(session, endpoint, request, DIALOGUE_OUTPUT_TOKENS)
    if credits is not None and credits.outcome == "insufficient":
        return None, None  # the points are the turn's: the declared rules read it for free
    connection.close()  # never hold a connection across a model call
    response, record = side_call(session, endpoint, request, purpose="dialogue")
    if response is None:
        logger.warning(
            "dialogue state by %s failed for session %s: the declared rules read it instead",
            endpoint.name,
            session.pk,
        )
        return None, record
    state = state_from_model(extractor, previous, texts, response.text, turn=session.turn)
    return (dict(state) if state is not None else None), record


def turn_extra_context(history: list[Message], turn: int) -> dict[str, Any] | None:
    """The latest `extra_context` sent in this turn (with its message, or an answer)."""
    for message in reversed(history):
        if message.turn != turn:
            if message.turn < turn:
                break
            continue
        if isinstance(message.extra_context, dict):
            return message.extra_context
    return None


def session_time_zone(session: Session, agent: Agent | None = None) -> tuple[str, ZoneInfo]:
    """The session's `timezone` metadata if it names a zone, else the agent's, else
    BILLING_TIME_ZONE."""
    wanted = (session.metadata or {}).get("timezone")
    if isinstance(wanted, str) and 0 < len(wanted) <= 64:
        zone = time_zone(wanted)
        if zone is not None:
            return wanted, zone
    if agent is not None:
        return agent_time_zone(agent)
    name = str(getattr(settings, "BILLING_TIME_ZONE", "UTC"))
    return name, time_zone(name) or ZoneInfo("UTC")


def environment_now(
    session: Session,
    agent: Agent,
    read: GateRead,
    tools: dict[str, ToolSnapshot],
    world: Surroundings,
    now: datetime | None = None,
) -> EnvironmentFacts:
    name, zone = session_time_zone(session, agent)
    budgets: list[BudgetLeft] = []
    for budget, spent in read.budgets:
        if budget.tokens is None and budget.cost is None:
            continue
        budgets.append(
            {
                "budget": budget.label,
                "tokens_left": None if budget.tokens is None else budget.tokens - spent.tokens,
                "cost_left": None if budget.cost is None else str(budget.cost - spent.cost),
            }
        )
    credits: CreditsLeft | None = None
    if read.figures.credits is not None:
        balance, reserved, cap, spent_today = read.figures.credits
        credits = {
            "balance": balance,
            "reserved": reserved,
            "daily_cap": cap,
            "spent_today": spent_today,
        }
    degraded = []
    if read.model_failing:
        degraded.append(f"model {agent.model.name}: unavailable (circuit open)")
    if agent.fallback_model is not None:
        degraded += [
            f"model {n}: unavailable (circuit open)"
            for n in model_breaker().known_open([agent.fallback_model.name])
        ]
    degraded += [
        f"tool {n}: unavailable (circuit open)" for n in tool_breaker().known_open(sorted(tools))
    ]
    return environment_facts(
        now=(now or env_clock()).astimezone(zone),
        time_zone=name,
        budgets=budgets,
        credits=credits,
        degradation_level=read.level,
        degraded=degraded,
        is_peak_hour=world.is_peak_hour,
        host=world.host,
        tools=world.tools,
    )


def context_layers(
    session: Session,
    agent: Agent,
    history: list[Message],
    read: GateRead,
    tools: dict[str, ToolSnapshot],
) -> Verdict[None]:
    """The blocks (environment, dialogue state, extra context) and their facts for one step;
    what the model sees of its situation goes to `config["seen"]` for the checkpoint."""
    update = dialogue_update(session, agent, history)
    state = update.state if update.state is not None else (session.dialogue_state or {})
    world = surroundings(agent, tools)
    environment = environment_now(session, agent, read, tools, world)
    extra = turn_extra_context(history, session.turn)
    blocks = [environment_block(environment)]
    said = dialogue_block(state)
    if said is not None:
        blocks.append(said)
    if extra is not None:
        blocks.append(extra_context_block(extra))
    config = {
        "environment": environment,
        "dialogue": {"intent": state.get("intent"), "slots": dict(state.get("slots") or {})},
        "extra_context": extra,
    }
    return Verdict(
        contribution=Contribution(
            seen=seen_of(state, read.level, environment["degraded"], read, world),
            blocks=tuple(blocks),
            config=config,
            dialogue_state=update.state,
            calls=tuple(update.calls),
        )
    )

"""Fixtures of the approval tests: a refund tool that records each effect, and an agent using it."""

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from accounts.services import api_key_create, approver_grant
from record.models import Agent, ModelEndpoint, Session
from tests.factories import (
    AgentFactory,
    ModelEndpointFactory,
    SessionFactory,
    ToolFactory,
    UserFactory,
)
from tools.models import Tool
from tools.registry import tool_handler

EFFECTS: list[dict[str, Any]] = []
_effects_lock = threading.Lock()


@tool_handler("tests.approvals.refund", wants_idempotency_key=True)
def refund(order: str, amount: float, idempotency_key: str = "") -> dict[str, Any]:
    with _effects_lock:
        EFFECTS.append({"order": order, "amount": amount, "key": idempotency_key})
    return {"refunded": amount, "order": order}


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


REFUND_RULES: list[dict[str, Any]] = [
    {"when": {"last_tool": "refund", "result": '"status":"rejected"'},
     "answer": "Not refunded: {{ result.error }}"},
    {"when": {"last_tool": "refund"}, "answer": "Refunded {{ tools.refund.refunded }} on {{ tools.refund.order }}"},
    {"when": {"last_tool": "lookup"}, "answer": "Looked up"},
    {"when": {"user": "refund (\\w+) (\\d+) and look up", "last_tool": None},
     "tool_calls": [{"tool": "lookup", "args": {"order": "{{ match.1 }}"}},
                    {"tool": "refund", "args": {"order": "{{ match.1 }}", "amount": "{{ match.2 }}"}},
                    {"tool": "lookup", "args": {"order": "{{ match.1 }}x"}}]},
    {"when": {"user": "refund (\\w+) (\\d+)", "last_tool": None},
     "tool_calls": [{"tool": "refund", "args": {"order": "{{ match.1 }}", "amount": "{{ match.2 }}"}}]},
    {"answer": "?"},
]  # fmt: skip


@pytest.fixture
def rules_model(db) -> ModelEndpoint:  # type: ignore[no-untyped-def]
    return ModelEndpointFactory(name="rules", api="rules", options={})


@pytest.fixture
def refund_tool(db) -> Tool:  # type: ignore[no-untyped-def]
    tool: Tool = ToolFactory(
        name="refund",
        handler="tests.approvals.refund",
        side_effects=True,
        approval_when={"field": "amount", "op": "gt", "value": 50},
        approval_timeout_s=600,
        parameters={
            "type": "object",
            "properties": {
                "order": {"type": "string"},
                "amount": {"type": "number", "maximum": 1000},
            },
            "required": ["order", "amount"],
            "additionalProperties": False,
        },
    )
    ToolFactory(
        name="lookup",
        handler="builtin.current_time",
        parameters={"type": "object", "properties": {"order": {"type": "string"}}},
    )
    return tool


@pytest.fixture
def refund_agent(rules_model: ModelEndpoint, refund_tool: Tool) -> Agent:
    agent: Agent = AgentFactory(
        slug=f"refunds-{uuid.uuid4().hex[:8]}",
        model=rules_model,
        tools=["refund", "lookup"],
        rules=REFUND_RULES,
    )
    return agent


@pytest.fixture
def make_session(refund_agent: Agent) -> Callable[..., Session]:
    def make(**fields: Any) -> Session:
        fields.setdefault("owner", UserFactory(username="customer"))
        fields.setdefault("agent", refund_agent)
        return SessionFactory(**fields)

    return make


@pytest.fixture
def approver(db):  # type: ignore[no-untyped-def]
    """(user, raw key) of an approver in the default group."""
    issued = api_key_create(username="alice", roles=["support"])
    approver_grant(username="alice")
    return issued.api_key.owner, issued.raw

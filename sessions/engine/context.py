"""Assembling what the model sees for one step."""

from collections.abc import Iterable
from typing import Any

from llm.types import ChatMessage, ChatRequest, ToolCallRequest, ToolSpec
from tools.execution import ToolSnapshot

from ..models import Agent, Message

LIMIT_NOTE = "You have used all the tool rounds allowed for this request."
FINAL_INSTRUCTION = "Do not call tools; answer the user now with what you have found so far."


def to_chat_message(message: Message) -> ChatMessage:
    calls = tuple(
        ToolCallRequest(id=c["id"], name=c["name"], arguments=c.get("arguments") or {})
        for c in (message.tool_calls or [])
    )
    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]
        content=message.content,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        name=message.name,
        data=message.data,
    )


def build_request(
    *,
    agent: Agent,
    history: Iterable[Message],
    tools: dict[str, ToolSnapshot],
    final: bool,
    note: str = LIMIT_NOTE,
    memory_block: str = "",
) -> ChatRequest:
    messages: list[ChatMessage] = []
    if agent.system_prompt:
        messages.append(ChatMessage(role="system", content=agent.system_prompt))
    if memory_block:
        messages.append(ChatMessage(role="system", content=memory_block))
    messages.extend(to_chat_message(m) for m in history)
    specs: tuple[ToolSpec, ...] = ()
    if final:
        messages.append(ChatMessage(role="system", content=f"{note} {FINAL_INSTRUCTION}"))
    else:
        specs = tuple(
            ToolSpec(name=t.name, description=t.model_description, parameters=t.parameters)
            for name, t in sorted(tools.items())
            if name in agent.tools
        )
    config: dict[str, Any] = {"rules": agent.rules, "fallback_answer": ""}
    return ChatRequest(
        messages=tuple(messages),
        tools=specs,
        tool_choice="none" if final else "auto",
        agent_config=config,
    )


def tool_calls_json(calls: Iterable[ToolCallRequest]) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]

"""The offline `rules` model: deterministic answers and tool calls from the agent's rules.

It powers the offline demo and is the last-resort fallback. A rule is::

    {"name": "find-orders",
     "when": {"user": "(?i)logistics", "last_tool": null},
     "tool_calls": [{"tool": "query_orders", "args": {"days": 7}}],
     "for_each": "result.orders"}            # optional: one set of calls per item
    {"name": "done", "when": {"last_tool": "generate_report"},
     "answer": "Report #{{ tools.generate_report.report_id }} is ready."}

`when` keys (all optional, all must hold): `user` (regex searched in the latest
user message), `note` (regex over the latest platform note this turn, e.g. a
follow-up that came due), `last_tool` (name of the latest tool result in this turn, or
null for "no tool yet this turn"), `result` (regex over the latest result as
compact JSON), `truthy` / `falsy` (a path in the template context). Rules are
tried in order; the first that holds answers. Templates see `user`, `match`
(regex groups), `result`, `results` (the latest tool results), `tools` (latest
result per tool this turn), `calls` (number of calls per tool this turn), `ok`
and `failed` (of those, how many succeeded and how many did not: failed,
rejected, expired, unpaid; a tool absent from one has none) and, inside
`for_each`, `item`. The context layers the engine adds are there too:
`dialogue` (`intent`, `slots`), `environment` (time, budgets, credits, degraded
services) and `extra_context` (what the customer app sent with this turn), e.g.
`{"truthy": "dialogue.slots.order"}` or `{{ dialogue.slots.order }}`.

Strict mode (the endpoint option `strict: true`, or RULES_MODEL_STRICT=1 in the
environment, which the test suite sets): like a real provider, the model can only call
what it was offered. A rule that names a tool the request does not offer, calls a tool
when `tool_choice` is "none", does not call the named/required tool, or makes several
calls when `parallel_tool_calls` is false raises
`UnofferedToolCall` (and is recorded in STRICT_VIOLATIONS for the tests' teardown check)
instead of calling it. Off, a rule's call goes out as written (the demo's behaviour).
"""

import asyncio
import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from memory.tokens import count_tokens

from .base import ModelAdapter, ModelConfigError, register_adapter
from .templating import lookup, render, render_text
from .types import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallRequest,
    ToolCallStarted,
    Usage,
)

NO_RULE_ANSWER = "I'm sorry, I can't help with that request."
# How a tool result that did not succeed begins (tools/rendering.py; llm imports no tools).
FAILURE_MARKER = "[FAILED]"

# What a user says that a summary must keep: first-person facts, preferences, instructions, numbers.
_FACT = re.compile(
    r"\b(my|mine|i am|i'm|im|i prefer|i like|i love|i hate|i live|i work|i need|i want|call me|"
    r"remember|always|never|please use|don't|do not)\b|我|记住",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d")
SUMMARY_MAX_ITEMS = 12


def _keep_facts(facts: list[str]) -> list[str]:
    """Statements about the user first (all of them, up to the limit), then the latest few
    that only carry a number: a summary cut to size loses those first."""
    strong = [f for f in facts if _FACT.search(f)][: SUMMARY_MAX_ITEMS * 2]
    weak = [f[:120] for f in facts if not _FACT.search(f)][-4:]
    return strong + weak


def summarise(data: Any) -> str:
    """The offline model's summary of a conversation: a deterministic extract, as JSON.

    Facts are the user's first-person statements, preferences, instructions and
    anything with a number, oldest first after the previous summary's; actions
    are the tools called and how they ended; the intent is the latest request;
    an open item is a user message the transcript leaves unanswered. `data` is
    what the summariser attaches to its request: {"previous": sections or
    None, "messages": [{"role", "name", "content"}]}.
    """
    data = data if isinstance(data, dict) else {}
    previous = data.get("previous") if isinstance(data.get("previous"), dict) else {}
    rows = [r for r in data.get("messages") or [] if isinstance(r, dict)]
    facts = [str(f) for f in previous.get("facts") or []]
    actions = [str(a) for a in previous.get("actions") or []]
    intent = str(previous.get("intent") or "")
    for row in rows:
        content = " ".join(str(row.get("content") or "").split())
        if row.get("role") == "user" and content:
            intent = content[:200]
            if (_FACT.search(content) or _NUMBER.search(content)) and content[:300] not in facts:
                facts.append(content[:300])
        elif row.get("role") == "tool":
            failed = content.startswith(FAILURE_MARKER)
            actions.append(f"{row.get('name') or 'tool'}: {'failed' if failed else 'done'}")
    last = rows[-1] if rows else {}
    open_items = [str(last.get("content"))[:200]] if last.get("role") == "user" else []
    sections = {
        "intent": intent,
        "facts": _keep_facts(facts),
        "actions": actions[-SUMMARY_MAX_ITEMS:],
        "open_items": open_items,
    }
    return json.dumps(sections, ensure_ascii=False)


def _turn_slice(messages: tuple[ChatMessage, ...]) -> tuple[str, list[ChatMessage]]:
    """The latest user text and the messages after it (this turn's work so far)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content, list(messages[index + 1 :])
    return "", list(messages)


def build_context(messages: tuple[ChatMessage, ...]) -> dict[str, Any]:
    user, turn = _turn_slice(messages)
    tools: dict[str, Any] = {}
    calls: dict[str, int] = {}
    ok: dict[str, int] = {}
    failed: dict[str, int] = {}
    trailing: list[ChatMessage] = []
    note = ""
    for message in turn:
        if message.role == "system":
            # Platform notes (a timer that fired, a changed environment) are
            # visible as `note` but do not hide the latest tool result.
            note = message.content
            continue
        if message.role == "tool":
            result = message.data if message.data is not None else _maybe_json(message.content)
            tools[message.name] = result
            calls[message.name] = calls.get(message.name, 0) + 1
            # A result that did not succeed (failed, refused, never run) says so first.
            done = failed if message.content.startswith(FAILURE_MARKER) else ok
            done[message.name] = done.get(message.name, 0) + 1
            trailing.append(message)
        else:
            trailing = []
    results = [m.data if m.data is not None else _maybe_json(m.content) for m in trailing]
    return {
        "user": user,
        "last_tool": trailing[-1].name if trailing else None,
        "result": results[-1] if results else None,
        "results": results,
        "tools": tools,
        "calls": calls,
        "ok": ok,
        "failed": failed,
        "note": note,
        "match": {},
    }


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _rule_holds(when: dict[str, Any], context: dict[str, Any]) -> bool:
    if "user" in when:
        found = re.search(str(when["user"]), context["user"])
        if not found:
            return False
        context["match"] = {
            "0": found.group(0),
            **{str(i + 1): g for i, g in enumerate(found.groups())},
        }
        context["match"].update(found.groupdict())
    if "note" in when and not re.search(str(when["note"]), context["note"]):
        return False
    if "last_tool" in when and when["last_tool"] != context["last_tool"]:
        return False
    if "result" in when:
        text = json.dumps(context["result"], ensure_ascii=False, separators=(",", ":"))
        if not re.search(str(when["result"]), text):
            return False
    if "truthy" in when and not lookup(context, str(when["truthy"])):
        return False
    return not ("falsy" in when and lookup(context, str(when["falsy"])))


# Keys of ChatRequest.agent_config the engine's context layers fill (rule templates see them).
LAYER_KEYS = ("dialogue", "environment", "extra_context")


def decide(
    rules: list[dict[str, Any]],
    messages: tuple[ChatMessage, ...],
    fallback: str,
    layers: dict[str, Any] | None = None,
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Return (answer text, [(tool name, args)]) for the first rule that holds."""
    context = build_context(messages)
    for key in LAYER_KEYS:
        context[key] = (layers or {}).get(key)
    for rule in rules:
        if not _rule_holds(dict(rule.get("when") or {}), context):
            continue
        if rule.get("tool_calls"):
            items = lookup(context, rule["for_each"]) if rule.get("for_each") else [None]
            calls: list[tuple[str, dict[str, Any]]] = []
            for item in items or []:
                scope = {**context, "item": item}
                for spec in rule["tool_calls"]:
                    calls.append((str(spec["tool"]), render(spec.get("args") or {}, scope)))
            if calls:
                return "", calls
            continue
        return render_text(rule.get("answer", ""), context), []
    return fallback, []


class UnofferedToolCall(ModelConfigError):
    """Strict mode: a rule asked for a call a real model could not make with this request."""


# Every strict-mode refusal in this process (the test suite asserts it stays empty).
STRICT_VIOLATIONS: list[str] = []


def strict_default() -> bool:
    return os.environ.get("RULES_MODEL_STRICT", "").lower() in ("1", "true", "yes")


def offered_problem(request: ChatRequest, names: list[str]) -> str | None:
    """Why a real model given `request` could not answer with calls to `names`, or None."""
    offered = {t.name for t in request.tools}
    choice = request.tool_choice
    unoffered = sorted({n for n in names if n not in offered})
    if unoffered:
        return (
            f"the rules call {', '.join(unoffered)}, which the request does not offer "
            f"(offered: {', '.join(sorted(offered)) or 'none'})"
        )
    if names and choice == "none":
        return f"the rules call {', '.join(names)} but tool_choice is 'none'"
    if not names and offered and choice not in ("auto", "none"):
        return f"tool_choice is {choice!r} but the rules answer without a tool call"
    if choice not in ("auto", "none", "required") and any(n != choice for n in names):
        return f"tool_choice names {choice!r} but the rules call {', '.join(names)}"
    if request.parallel_tool_calls is False and len(names) > 1:
        return f"parallel tool calls are off but the rules make {len(names)} calls"
    return None


@register_adapter
class RulesAdapter(ModelAdapter):
    api = "rules"
    maps_tool_names = False

    def instant(self) -> bool:
        # Offline and deterministic: it only waits when told to (a simulated latency).
        options = self.endpoint.options
        return not (options.get("latency_s") or options.get("chunk_delay_s"))

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        if request.agent_config.get("task") == "summary":
            # A summary of the history (engine/model/summaries.py): offline and deterministic.
            users = [m for m in request.messages if m.role == "user"]
            text = summarise(users[-1].data if users else None)
            yield TextDelta(text)
            yield Usage(
                input_tokens=sum(count_tokens(m.content) for m in request.messages),
                output_tokens=count_tokens(text),
            )
            yield Finish("stop")
            return
        rules = request.agent_config.get("rules") or []
        if not isinstance(rules, list):
            raise ModelConfigError("agent rules must be a list")
        fallback = request.agent_config.get("fallback_answer") or NO_RULE_ANSWER
        answer, calls = decide(rules, request.messages, fallback, request.agent_config)
        strict = self.endpoint.options.get("strict")
        if strict if isinstance(strict, bool) else strict_default():
            problem = offered_problem(request, [name for name, _ in calls])
            if problem is not None:
                STRICT_VIOLATIONS.append(f"{self.endpoint.name}: {problem}")
                raise UnofferedToolCall(f"strict rules model: {problem}")
        delay = float(self.endpoint.options.get("latency_s", 0) or 0)
        if delay:
            await asyncio.sleep(delay)
        chunk_delay = float(self.endpoint.options.get("chunk_delay_s", 0) or 0)
        output_tokens = 0
        if calls:
            for index, (name, args) in enumerate(calls):
                # Unique per call, as providers require ids to be unique within a conversation.
                call_id = f"call_{uuid.uuid4().hex[:16]}"
                payload = json.dumps(args, ensure_ascii=False)
                output_tokens += count_tokens(payload)
                yield ToolCallStarted(index=index, id=call_id, name=name)
                yield ToolCallArgumentsDelta(index=index, fragment=payload)
                yield ToolCallFinished(
                    index=index, call=ToolCallRequest(id=call_id, name=name, arguments=args)
                )
        else:
            # Stream the answer word by word so clients see it arrive.
            for piece in re.findall(r"\S+\s*|\s+", answer):
                if chunk_delay:
                    await asyncio.sleep(chunk_delay)
                yield TextDelta(piece)
            output_tokens = count_tokens(answer)
        input_tokens = sum(count_tokens(m.content) for m in request.messages)
        yield Usage(input_tokens=input_tokens, output_tokens=output_tokens)
        yield Finish("tool_calls" if calls else "stop")

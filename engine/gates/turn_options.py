"""A client's settings for this turn's model calls (`llm.types.ModelOptions`): the
OpenAI-compatible endpoint's `response_format` and sampling parameters.

They are stored with the message that started the turn, or answered its question
(`Message.turn_options`), and read back from the turn's history, as its `extra_context`
is: every step of the turn sees them, a step re-run after a worker crash included,
without a checkpoint of their own. The latest message of the turn that carries them wins.

The client's own `tools` are offered beside the agent's; a call to one is the client's to
run (engine/gates/client_tools.py). `tool_choice` "none" holds for every step of the turn;
"required" or a tool's name forces the turn's steps until one of them calls a tool (then
"auto": a forced choice on every step would never let the turn answer); a named tool the
step does not offer leaves "auto". `parallel_tool_calls` false holds for every step (and
the model phase runs only the first call of a reply that makes several anyway). They shape the turn's main model calls only (not the
engine's own: summaries, dialogue state), within the agent's limits: `max_tokens` is capped by the endpoint's own
`max_tokens` option, and the budget gate lowers it further when it must. The answer's
form is told to the model in a context block (counted in the context budget) and sent
as the wire's structured output where it has one; the model phase checks the answer.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.gates import Contribution, Verdict
from engine.model.structured import answer_instruction
from llm.types import ChatRequest, ResponseFormat, ToolSpec
from record.models import Message, ModelEndpoint


@dataclass(frozen=True)
class TurnOptions:
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_format: ResponseFormat | None = None
    # The client's own tools (it runs them: engine/gates/client_tools.py).
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool | None = None

    @property
    def client_tools(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _format(value: Any) -> ResponseFormat | None:
    if not isinstance(value, dict):
        return None
    schema = value.get("schema")
    name = value.get("name")
    return ResponseFormat(
        schema=schema if isinstance(schema, dict) else None,
        name=name if isinstance(name, str) and name else "answer",
        strict=value.get("strict") is True,
    )


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        ToolSpec(
            name=t["name"],
            description=str(t.get("description") or ""),
            parameters=t["parameters"] if isinstance(t.get("parameters"), dict) else {},
        )
        for t in value
        if isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"]
    )


def options_read(raw: Any) -> TurnOptions | None:
    """The stored JSON, read defensively: the endpoint checked it, a stored row is data."""
    if not isinstance(raw, dict):
        return None
    stop = raw.get("stop")
    choice = raw.get("tool_choice")
    parallel = raw.get("parallel_tool_calls")
    return TurnOptions(
        tool_choice=choice if isinstance(choice, str) and choice else "auto",
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        tools=_tools(raw.get("tools")),
        temperature=_number(raw.get("temperature")),
        top_p=_number(raw.get("top_p")),
        max_tokens=_integer(raw.get("max_tokens")),
        stop=tuple(s for s in stop if isinstance(s, str) and s) if isinstance(stop, list) else (),
        seed=_integer(raw.get("seed")),
        response_format=_format(raw.get("response_format")),
    )


def turn_options(history: list[Message], turn: int) -> TurnOptions | None:
    """The latest options sent in this turn (with its message, or an answer)."""
    for message in reversed(history):
        if message.turn != turn:
            if message.turn < turn:
                break
            continue
        if isinstance(message.turn_options, dict):
            return options_read(message.turn_options)
    return None


def answer_format_block(options: TurnOptions | None) -> Verdict[None]:
    """The answer's form, told to the model (the tool calls before it stay free)."""
    if options is None or options.response_format is None:
        return Verdict()
    block = answer_instruction(options.response_format, final_only=True)
    return Verdict(contribution=Contribution(blocks=(block,)))


def turn_called_tools(history: list[Message], turn: int) -> bool:
    """Whether a step of this turn already called a tool (a forced tool_choice is spent)."""
    for message in reversed(history):
        if message.turn != turn:
            if message.turn < turn:
                return False
            continue
        if message.role == "assistant" and message.tool_calls:
            return True
    return False


def _tool_choice(options: TurnOptions, tools: tuple[ToolSpec, ...], called: bool) -> str:
    choice = options.tool_choice
    if not tools:
        return "auto"
    if choice in ("auto", "none"):
        return choice
    if called:
        return "auto"
    return choice if choice == "required" or any(t.name == choice for t in tools) else "auto"


def with_turn_options(
    request: ChatRequest,
    options: TurnOptions | None,
    endpoint: ModelEndpoint,
    *,
    final: bool,
    called: bool = False,
) -> ChatRequest:
    """The request with the client's settings, `max_tokens` within the endpoint's own, the
    client's tools beside the agent's (none once the step may call no more tools), and its
    tool_choice and parallel_tool_calls (`called`: a step of the turn called a tool)."""
    if options is None:
        return request
    tools = request.tools if final else (*request.tools, *options.tools)
    limits = [
        n
        for n in (
            options.max_tokens,
            request.max_tokens,
            _integer((endpoint.options or {}).get("max_tokens")),
        )
        if n is not None and n > 0
    ]
    return dataclasses.replace(
        request,
        temperature=options.temperature if options.temperature is not None else request.temperature,
        top_p=options.top_p if options.top_p is not None else request.top_p,
        max_tokens=min(limits) if options.max_tokens is not None and limits else request.max_tokens,
        stop=options.stop or request.stop,
        seed=options.seed if options.seed is not None else request.seed,
        response_format=options.response_format or request.response_format,
        tools=tools,
        tool_choice=request.tool_choice if final else _tool_choice(options, tools, called),
        parallel_tool_calls=(options.parallel_tool_calls if tools else request.parallel_tool_calls),
    )

"""Python callables that `python` tools name as their handler.

A registry in the Healthchecks TRANSPORTS style: a name maps to a callable;
unknown names raise a typed error at configuration time, not at call time.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

ToolResult = dict[str, Any]
Handler = Callable[..., ToolResult | Awaitable[ToolResult]]


class UnknownHandler(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        known = ", ".join(sorted(HANDLERS)) or "none"
        return f"no Python tool handler named '{self.name}' (registered: {known})"


@dataclass(frozen=True)
class RegisteredHandler:
    name: str
    func: Handler
    # Handlers that take `idempotency_key=` get the logical call's key.
    wants_idempotency_key: bool = False


HANDLERS: dict[str, RegisteredHandler] = {}


def tool_handler(name: str, *, wants_idempotency_key: bool = False) -> Callable[[Handler], Handler]:
    def register(func: Handler) -> Handler:
        HANDLERS[name] = RegisteredHandler(
            name=name, func=func, wants_idempotency_key=wants_idempotency_key
        )
        return func

    return register


def get_handler(name: str) -> RegisteredHandler:
    try:
        return HANDLERS[name]
    except KeyError:
        raise UnknownHandler(name) from None

"""The adapter interface and the registry of wire protocols."""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .types import (
    ChatRequest,
    ChatResponse,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCallFinished,
    Usage,
)
from .wire_names import WireNames


@dataclass(frozen=True)
class EndpointConfig:
    """What an adapter needs to reach a model; built from a ModelEndpoint row."""

    name: str
    api: str
    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 15.0
    total_timeout_s: float = 120.0
    options: dict[str, Any] = field(default_factory=dict)


class ModelError(Exception):
    """A model call failed. `outcome` names how (recorded on ModelCall); `retryable`
    says whether the fallback model may be tried. Messages never carry secrets."""

    retryable: bool = True
    outcome: str = "failed"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after_s: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable
        self.retry_after_s = retry_after_s
        # The provider's HTTP status, when it answered with one (for the operator's log line).
        self.status = status


class ModelConfigError(ModelError):
    """The request can never succeed as configured (bad key, unknown model, 4xx)."""

    retryable = False
    outcome = "bad_request"


class ModelKeyMissing(ModelConfigError):
    """The endpoint names a key variable that is not set: refused before sending.

    Another endpoint has its own key, so the fallback may still answer.
    """

    retryable = True


class ModelTimeout(ModelError):
    outcome = "timeout"


class ModelUnavailable(ModelError):
    """Connection refused or reset, or a 5xx."""

    outcome = "unavailable"


class ModelRateLimited(ModelError):
    outcome = "rate_limited"


class ModelProtocolError(ModelError):
    """The provider answered something we cannot use: a cut stream, bad JSON, an odd shape."""

    outcome = "protocol_error"


class ModelRequestTooLarge(ModelError):
    """Refused before sending: the request cannot fit the model's context window."""

    retryable = True  # a fallback with a larger window may still take it
    outcome = "too_large"


class ModelCircuitOpen(ModelError):
    outcome = "breaker_open"


class ModelAdapter(ABC):
    api: ClassVar[str]
    # Send tool names every wire format accepts (llm/wire_names.py); the offline rules
    # model reads the names as configured.
    maps_tool_names: ClassVar[bool] = True

    def __init__(self, endpoint: EndpointConfig) -> None:
        self.endpoint = endpoint

    def instant(self) -> bool:
        """Whether `complete` answers without I/O or waiting (never suspends): such
        an adapter may run on the caller's thread, with no hop to an event loop."""
        return False

    @abstractmethod
    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Yield typed events; the last two are Usage (if known) and Finish."""

    async def complete(
        self,
        request: ChatRequest,
        on_event: Callable[[StreamEvent], Awaitable[None] | None] | None = None,
    ) -> ChatResponse:
        """Consume the stream into one response, passing each event to `on_event`."""
        response = ChatResponse()
        parts: list[str] = []
        names = self.wire_names(request)
        if names is not None:
            request = names.outgoing(request)
        async for event in self.stream(request):
            if names is not None:
                event = names.incoming(event)
            if on_event is not None:
                maybe = on_event(event)
                if maybe is not None:
                    await maybe
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, ToolCallFinished):
                response.tool_calls.append(event.call)
            elif isinstance(event, Usage):
                response.usage = event
            elif isinstance(event, Finish):
                response.finish_reason = event.reason
        response.text = "".join(parts)
        return response

    async def respond(self, request: ChatRequest) -> ChatResponse:
        """A non-streamed call; adapters whose wire has one override this."""
        return await self.complete(request)

    def wire_names(self, request: ChatRequest) -> WireNames | None:
        """The request's tool-name map, or None when every name goes out as it is."""
        return WireNames.for_request(request) if self.maps_tool_names else None


ADAPTERS: dict[str, type[ModelAdapter]] = {}


class UnknownAdapter(ModelConfigError):
    pass


def register_adapter(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    ADAPTERS[cls.api] = cls
    return cls


def adapter_for(endpoint: EndpointConfig) -> ModelAdapter:
    try:
        cls = ADAPTERS[endpoint.api]
    except KeyError:
        raise UnknownAdapter(f"no model adapter for api '{endpoint.api}'") from None
    return cls(endpoint)

"""Python client for the agent platform: REST and the session websocket, sync and async.

from agentplatform_client import Client

with Client("http://127.0.0.1:8000", "ap_...") as client:
    session = client.create_session("order-support")
    result = client.run_turn(session.id, "where is order 1001?")
    print(result.answer)
"""

from .client import AsyncClient, Client, EventPage, TurnResult
from .errors import (
    AgentPlatformError,
    APIConnectionError,
    APIError,
    AuthenticationError,
    AuthError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    UnsupportedMediaTypeError,
    ValidationError,
)
from .events import (
    EVENT_TYPES,
    ApprovalRequested,
    ApprovalResolved,
    ErrorEvent,
    Event,
    MessageCompleted,
    MessageDelta,
    NodeFailed,
    NodeFinished,
    NodeStarted,
    Progress,
    StateChanged,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnUsage,
    parse_event,
)
from .models import (
    Agent,
    Approval,
    CancelResult,
    Checkpoint,
    Credits,
    LastTurn,
    Message,
    OwnerUsage,
    PostedMessage,
    Session,
    Tokens,
    Tool,
    TurnCalls,
    Usage,
)
from .stream import AsyncEventStream, EventStream, ReconnectPolicy

__version__ = "0.1.0"

__all__ = [
    "EVENT_TYPES",
    "APIConnectionError",
    "APIError",
    "Agent",
    "AgentPlatformError",
    "Approval",
    "ApprovalRequested",
    "ApprovalResolved",
    "AsyncClient",
    "AsyncEventStream",
    "AuthError",
    "AuthenticationError",
    "CancelResult",
    "Checkpoint",
    "Client",
    "ConflictError",
    "Credits",
    "ErrorEvent",
    "Event",
    "EventPage",
    "EventStream",
    "LastTurn",
    "Message",
    "MessageCompleted",
    "MessageDelta",
    "NotFoundError",
    "OwnerUsage",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PostedMessage",
    "Progress",
    "RateLimitError",
    "ReconnectPolicy",
    "ServerError",
    "Session",
    "StateChanged",
    "Tokens",
    "Tool",
    "ToolFinished",
    "ToolStarted",
    "TurnFinished",
    "NodeStarted",
    "NodeFinished",
    "NodeFailed",
    "TurnCalls",
    "TurnResult",
    "TurnUsage",
    "UnsupportedMediaTypeError",
    "Usage",
    "ValidationError",
    "parse_event",
]

"""`Client` (blocking) and `AsyncClient` (asyncio) for the platform's REST API and websocket.

Both are built from one table of calls (`_Calls`): each method describes its
request and how to read the answer, and the two clients only differ in how they
send it, so they cannot drift apart.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from .errors import APIConnectionError, error_from_response
from .events import Event, MessageCompleted, TurnFinished, parse_event
from .models import (
    Agent,
    Approval,
    CancelResult,
    Checkpoint,
    Message,
    OwnerUsage,
    PostedMessage,
    Session,
    SessionRef,
    Tool,
    WorkflowRun,
    session_ref,
)
from .stream import AsyncEventStream, EventStream, ReconnectPolicy

T = TypeVar("T")
EVENTS_PAGE = 1000  # the server's largest page of `GET .../events/`


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    body: Any = None
    has_body: bool = False


# A run's states once it ended (it runs again only if an operator resumes it).
RUN_ENDED = frozenset({"finished", "error", "cancelled"})


def _started_run(response: httpx.Response) -> Session:
    """The run as POST .../runs/ describes it (`workflow` its slug, `version` the
    workflow's): a Session whose `workflow` says which; nothing ran yet."""
    data = response.json()
    workflow = {"slug": data.get("workflow", ""), "version": data.get("version", 0)}
    return Session.from_dict({**data, "version": 0, "workflow": workflow})


def _run_outcome(session: Session) -> WorkflowRun | None:
    """The run's workflow once the run ended (its result or error), else None."""
    if session.state not in RUN_ENDED or session.workflow is None:
        return None
    return session.workflow


def _list(cls: Any) -> Callable[[httpx.Response], list[Any]]:
    return lambda response: [cls.from_dict(row) for row in response.json()]


def _one(cls: Any) -> Callable[[httpx.Response], Any]:
    return lambda response: cls.from_dict(response.json())


class EventPage(list[Event]):
    """One page of `GET .../events/`; `more`: events after its last one exist.

    A page ends at its `limit` or at the server's byte budget (EVENTS_PAGE_MAX_BYTES),
    so a short page is not the end: the server says `Link: <...>; rel="next"` while
    more follow. (A full page with no Link, from a server before that, counts as more.)
    """

    more: bool = False


def _events(response: httpx.Response) -> EventPage:
    page = EventPage(parse_event(row) for row in response.json())
    page.more = bool(page) and ("next" in response.links or len(page) >= EVENTS_PAGE)
    return page


class Page(list[T]):
    """One page of a list; `next_params`: the query of the page after it (from the
    server's `Link: <...>; rel="next"` header), None on the last page."""

    next_params: dict[str, Any] | None = None


def _page(kind: Any) -> Callable[[httpx.Response], Page[Any]]:
    def parse(response: httpx.Response) -> Page[Any]:
        page: Page[Any] = Page(kind.from_dict(row) for row in response.json())
        link = response.links.get("next")
        if link is not None:
            query = httpx.URL(link["url"]).params
            page.next_params = {key: query[key] for key in query}
        return page

    return parse


def _posted(response: httpx.Response) -> PostedMessage:
    return PostedMessage(
        message=Message.from_dict(response.json()), created=response.status_code == 202
    )


def _own_turn(message: Message) -> int | None:
    """The turn a posted message belongs to, once it has one: a queued message gets its
    turn when the turns before it have finished."""
    return message.turn if message.status == "final" and message.seq is not None else None


def _listed_turn(messages: list[Message], message_id: int) -> int | None:
    return next((_own_turn(m) for m in messages if m.id == message_id), None)


# How far back run_turn looks for its own message when a turn finishes.
RUN_TURN_LOOKBACK = 100


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _webhook(url: str | None) -> dict[str, Any]:
    """The body's `webhook` object: POSTed the outcome when the turn or run ends."""
    return {} if url is None else {"webhook": {"url": url}}


class _Calls:
    """Every REST operation of `/api/v1/` (the OpenAPI schema's paths)."""

    @staticmethod
    def agents() -> _Call[list[Agent]]:
        return _Call("GET", "agents/", _list(Agent))

    @staticmethod
    def create_session(
        agent: str,
        metadata: dict[str, Any] | None,
        role: str | None,
        value: float | None,
        webhook: str | None = None,
    ) -> _Call[Session]:
        body: dict[str, Any] = {
            "agent": agent,
            **_params(metadata=metadata, role=role, value=value),
            **_webhook(webhook),
        }
        return _Call("POST", "sessions/", _one(Session), body=body, has_body=True)

    @staticmethod
    def list_sessions(limit: int | None, ephemeral: bool) -> _Call[list[Session]]:
        params = _params(limit=limit, ephemeral="true" if ephemeral else None)
        return _Call("GET", "sessions/", _list(Session), params=params)

    @staticmethod
    def sessions_page(params: dict[str, Any]) -> _Call[Page[Session]]:
        return _Call("GET", "sessions/", _page(Session), params=params)

    @staticmethod
    def messages_page(session_id: SessionRef, params: dict[str, Any]) -> _Call[Page[Message]]:
        return _Call(
            "GET", f"sessions/{session_ref(session_id)}/messages/", _page(Message), params=params
        )

    @staticmethod
    def start_workflow(
        slug: str,
        input: Any,
        idempotency_key: str | None,
        metadata: dict[str, Any] | None,
        webhook: str | None = None,
    ) -> _Call[Session]:
        body = {
            "input": input,
            **_params(idempotency_key=idempotency_key),
            **({"metadata": metadata} if metadata else {}),
            **_webhook(webhook),
        }
        return _Call(
            "POST",
            f"workflows/{quote(slug, safe='')}/runs/",
            _started_run,
            body=body,
            has_body=True,
        )

    @staticmethod
    def get_session(session_id: SessionRef) -> _Call[Session]:
        return _Call("GET", f"sessions/{session_ref(session_id)}/", _one(Session))

    @staticmethod
    def send_message(
        session_id: SessionRef,
        content: str,
        idempotency_key: str | None,
        webhook: str | None = None,
    ) -> _Call[PostedMessage]:
        body = {"content": content, **_params(idempotency_key=idempotency_key), **_webhook(webhook)}
        return _Call(
            "POST",
            f"sessions/{session_ref(session_id)}/messages/",
            _posted,
            body=body,
            has_body=True,
        )

    @staticmethod
    def list_messages(session_id: SessionRef, limit: int | None) -> _Call[list[Message]]:
        return _Call(
            "GET",
            f"sessions/{session_ref(session_id)}/messages/",
            _list(Message),
            params=_params(limit=limit),
        )

    @staticmethod
    def list_events(session_id: SessionRef, after: int, limit: int | None) -> _Call[EventPage]:
        return _Call(
            "GET",
            f"sessions/{session_ref(session_id)}/events/",
            _events,
            params=_params(after=after, limit=limit),
        )

    @staticmethod
    def cancel(session_id: SessionRef) -> _Call[CancelResult]:
        return _Call("POST", f"sessions/{session_ref(session_id)}/cancel/", _one(CancelResult))

    @staticmethod
    def fork(session_id: SessionRef, checkpoint: int, role: str | None = None) -> _Call[Session]:
        return _Call(
            "POST",
            f"sessions/{session_ref(session_id)}/fork/",
            _one(Session),
            body={"checkpoint": checkpoint, **_params(role=role)},
            has_body=True,
        )

    @staticmethod
    def resume(session_id: SessionRef) -> _Call[Session]:
        return _Call("POST", f"sessions/{session_ref(session_id)}/resume/", _one(Session))

    @staticmethod
    def checkpoints(session_id: SessionRef, limit: int | None) -> _Call[list[Checkpoint]]:
        return _Call(
            "GET",
            f"sessions/{session_ref(session_id)}/checkpoints/",
            _list(Checkpoint),
            params=_params(limit=limit),
        )

    @staticmethod
    def tools() -> _Call[list[Tool]]:
        return _Call("GET", "tools/", _list(Tool))

    @staticmethod
    def usage() -> _Call[OwnerUsage]:
        return _Call("GET", "usage/", _one(OwnerUsage))

    @staticmethod
    def approvals(status: str | None, limit: int | None) -> _Call[list[Approval]]:
        return _Call(
            "GET", "approvals/", _list(Approval), params=_params(status=status, limit=limit)
        )

    @staticmethod
    def approve(
        approval_id: str, arguments: dict[str, Any] | None, comment: str | None
    ) -> _Call[Approval]:
        body = _params(arguments=arguments, comment=comment)
        return _Call(
            "POST", f"approvals/{approval_id}/approve/", _one(Approval), body=body, has_body=True
        )

    @staticmethod
    def reject(approval_id: str, comment: str) -> _Call[Approval]:
        return _Call(
            "POST",
            f"approvals/{approval_id}/reject/",
            _one(Approval),
            body={"comment": comment},
            has_body=True,
        )

    @staticmethod
    def review(approval_id: str, answer: str, result: Any, comment: str | None) -> _Call[Approval]:
        body = {"answer": answer, **_params(result=result, comment=comment)}
        return _Call(
            "POST", f"approvals/{approval_id}/review/", _one(Approval), body=body, has_body=True
        )


@dataclass(frozen=True)
class TurnResult:
    """What `run_turn` saw: every event, in order (a turn that was running when the message
    was sent included), and the end of the message's own turn."""

    events: list[Event]
    finished: TurnFinished

    @property
    def answer(self) -> str:
        """The turn's last assistant message ("" when it ended without one)."""
        for event in reversed(self.events):
            if (
                isinstance(event, MessageCompleted)
                and event.role == "assistant"
                and event.turn == self.finished.turn
            ):
                return event.content
        return ""

    @property
    def tool_calls(self) -> list[str]:
        """The tools the turn ran, in order (from its `tool.finished` events)."""
        return [
            e.data.get("tool", "")
            for e in self.events
            if e.type == "tool.finished" and e.data.get("turn") == self.finished.turn
        ]


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, str, str]:
    """(REST root ending in /api/v1/, websocket root, key), from arguments or the environment."""
    base = base_url or os.environ.get("AGENTPLATFORM_URL") or "http://127.0.0.1:8000"
    key = api_key or os.environ.get("AGENTPLATFORM_API_KEY")
    if not key:
        raise ValueError("an API key is required: pass api_key= or set AGENTPLATFORM_API_KEY")
    root = base.rstrip("/")
    if root.endswith("/api/v1"):
        root = root[: -len("/api/v1")]
    if root.startswith("https://"):
        ws_root = "wss://" + root[len("https://") :]
    elif root.startswith("http://"):
        ws_root = "ws://" + root[len("http://") :]
    else:
        raise ValueError(f"base_url must start with http:// or https://; got {base!r}")
    return root + "/api/v1/", ws_root, key


def _request_kwargs(call: _Call[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"params": call.params}
    if call.has_body:
        kwargs["json"] = call.body
    return kwargs


class Client:
    """Blocking client. `Client(base_url, api_key)`; both default to the environment
    (`AGENTPLATFORM_URL`, `AGENTPLATFORM_API_KEY`). Use as a context manager or call `close()`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        reconnect: ReconnectPolicy | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        rest_root, self._ws_root, self._key = _settings(base_url, api_key)
        self.reconnect = reconnect or ReconnectPolicy()
        self._http = http or httpx.Client(timeout=timeout)
        self._rest_root = rest_root
        self._headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json"}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: _Call[T]) -> T:
        try:
            response = self._http.request(
                call.method,
                self._rest_root + call.path,
                headers=self._headers,
                **_request_kwargs(call),
            )
        except httpx.TransportError as exc:
            raise APIConnectionError(f"{call.method} {call.path}: {exc!r}") from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return call.read(response)

    # Sessions -------------------------------------------------------------------

    def agents(self) -> list[Agent]:
        return self._run(_Calls.agents())

    def create_session(
        self,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        role: str | None = None,
        value: float | None = None,
        webhook: str | None = None,
    ) -> Session:
        """Open a session; `webhook` (a URL) is POSTed each turn's outcome when it ends."""
        return self._run(_Calls.create_session(agent, metadata, role, value, webhook))

    def list_sessions(self, *, limit: int | None = None, ephemeral: bool = False) -> list[Session]:
        """Your sessions, newest first (with `ephemeral`, those of stateless OpenAI-compatible
        requests too)."""
        return self._run(_Calls.list_sessions(limit, ephemeral))

    def start_workflow(
        self,
        slug: str,
        input: Any,
        *,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        webhook: str | None = None,
    ) -> Session:
        """Start a run of the workflow `slug` with `input`; the run is a Session. `webhook`
        (a URL) is POSTed the run's outcome, result and usage when it ends."""
        return self._run(_Calls.start_workflow(slug, input, idempotency_key, metadata, webhook))

    def wait_for_run(
        self, run: SessionRef, *, timeout: float = 60.0, poll: float = 0.5
    ) -> WorkflowRun:
        """Poll the run until it ended; its `WorkflowRun` has the `result` or the `error`.
        TimeoutError past `timeout` seconds (a run waiting on a person stays unended)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = _run_outcome(self.get_session(run))
            if ended is not None:
                return ended
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {session_ref(run)} did not end within {timeout} s")
            time.sleep(poll)

    def get_session(self, session_id: SessionRef) -> Session:
        return self._run(_Calls.get_session(session_id))

    def cancel(self, session_id: SessionRef) -> CancelResult:
        return self._run(_Calls.cancel(session_id))

    def fork(self, session_id: SessionRef, *, checkpoint: int, role: str | None = None) -> Session:
        """A new session from checkpoint step `checkpoint` (see `checkpoints`), with the
        session's role or `role`; the key must hold it (PermissionDeniedError otherwise)."""
        return self._run(_Calls.fork(session_id, checkpoint, role))

    def resume(self, session_id: SessionRef) -> Session:
        """Continue a run that stopped in `error` (ConflictError otherwise)."""
        return self._run(_Calls.resume(session_id))

    def checkpoints(self, session_id: SessionRef, *, limit: int | None = None) -> list[Checkpoint]:
        return self._run(_Calls.checkpoints(session_id, limit))

    # Messages and events ----------------------------------------------------------

    def send_message(
        self,
        session_id: SessionRef,
        content: str,
        *,
        idempotency_key: str | None = None,
        webhook: str | None = None,
    ) -> PostedMessage:
        """Post a message; `webhook` (a URL) is POSTed its turn's outcome when it ends."""
        return self._run(_Calls.send_message(session_id, content, idempotency_key, webhook))

    def list_messages(self, session_id: SessionRef, *, limit: int | None = None) -> list[Message]:
        """History, oldest first (the last `limit`, server default 20)."""
        return self._run(_Calls.list_messages(session_id, limit))

    def iter_sessions(self, *, ephemeral: bool = False, page: int = 200) -> Iterator[Session]:
        """Every one of your sessions, newest first, page by page (the server's cursors)."""
        params: dict[str, Any] | None = _params(limit=page, ephemeral="true" if ephemeral else None)
        while params is not None:
            found = self._run(_Calls.sessions_page(params))
            yield from found
            params = found.next_params

    def iter_messages(self, session_id: SessionRef, *, page: int = 1000) -> Iterator[Message]:
        """A session's whole history, newest first, page by page (older pages as asked for)."""
        params: dict[str, Any] | None = {"limit": page}
        while params is not None:
            found = self._run(_Calls.messages_page(session_id, params))
            yield from reversed(found)
            params = found.next_params

    def list_events(
        self, session_id: SessionRef, *, after: int = 0, limit: int | None = None
    ) -> EventPage:
        """One page of persisted events after `after` (server default 500, at most 1000,
        fewer when they are large); `page.more` says whether more follow."""
        return self._run(_Calls.list_events(session_id, after, limit))

    def iter_events(self, session_id: SessionRef, *, after: int = 0) -> Iterator[Event]:
        """Every persisted event after `after`, page by page."""
        while True:
            page = self.list_events(session_id, after=after, limit=EVENTS_PAGE)
            yield from page
            if not page.more:
                return
            after = page[-1].seq or after

    def stream(self, session_id: SessionRef, *, after: int = 0) -> EventStream:
        """The session's events over the websocket from `after` on, reconnecting as needed."""
        return EventStream(
            ws_base=self._ws_root,
            session_id=session_id,
            api_key=self._key,
            after=after,
            policy=self.reconnect,
            fetch_after=lambda seq: list(self.iter_events(session_id, after=seq)),
        )

    def last_seq(self, session_id: SessionRef) -> int:
        """The seq of the session's newest persisted event (0 for none)."""
        last = 0
        for event in self.iter_events(session_id):
            last = event.seq or last
        return last

    def run_turn(
        self,
        session_id: SessionRef,
        content: str,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        on_event: Callable[[Event], None] | None = None,
        webhook: str | None = None,
    ) -> TurnResult:
        """Send `content` and wait for the turn that answers it to finish.

        1. Open the stream after the session's newest event.
        2. Post the message over REST: it says the turn it belongs to, or that it is
           queued behind a running turn (the session's double-texting policy decides).
        3. Collect events until the `turn.finished` of the message's own turn (TimeoutError
           after `timeout` seconds). A turn already running finishes first: its events
           are among `events`, but its answer is not returned; a queued message's turn is
           read from REST once a turn finishes, and the wait goes on until its own does.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.stream(session_id, after=self.last_seq(session_id)) as events:
            own = self.send_message(
                session_id, content, idempotency_key=idempotency_key, webhook=webhook
            ).message
            turn = _own_turn(own)
            seen: list[Event] = []
            while True:
                left = None if deadline is None else max(deadline - time.monotonic(), 0)
                event = events.receive(timeout=left)
                seen.append(event)
                if on_event is not None:
                    on_event(event)
                if isinstance(event, TurnFinished):
                    if turn is None:
                        listed = self.list_messages(session_id, limit=RUN_TURN_LOOKBACK)
                        turn = _listed_turn(listed, own.id)
                    if turn is not None and event.turn >= turn:
                        return TurnResult(events=seen, finished=event)

    # Tools, usage, approvals ----------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The tools your key's roles may use."""
        return self._run(_Calls.tools())

    def usage(self) -> OwnerUsage:
        return self._run(_Calls.usage())

    def approvals(
        self, *, status: str | None = "pending", limit: int | None = None
    ) -> list[Approval]:
        """Approvals of your approver groups (PermissionDeniedError for a non-approver key)."""
        return self._run(_Calls.approvals(status, limit))

    def approve(
        self,
        approval_id: str,
        *,
        arguments: dict[str, Any] | None = None,
        comment: str | None = None,
    ) -> Approval:
        """Approve (optionally with edited `arguments`, validated against the tool's schema)."""
        return self._run(_Calls.approve(approval_id, arguments, comment))

    def reject(self, approval_id: str, *, comment: str) -> Approval:
        """Reject; the model receives `comment`."""
        return self._run(_Calls.reject(approval_id, comment))

    def review(
        self, approval_id: str, *, answer: str, result: Any = None, comment: str | None = None
    ) -> Approval:
        """Answer a recovery review: `took_effect` (with `result`), `not_taken` or `send_again`."""
        return self._run(_Calls.review(approval_id, answer, result, comment))


class AsyncClient:
    """The asyncio twin of `Client`: the same methods, awaited; `stream()` is an async
    context manager and iterator."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        reconnect: ReconnectPolicy | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        rest_root, self._ws_root, self._key = _settings(base_url, api_key)
        self.reconnect = reconnect or ReconnectPolicy()
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._rest_root = rest_root
        self._headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json"}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: _Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method,
                self._rest_root + call.path,
                headers=self._headers,
                **_request_kwargs(call),
            )
        except httpx.TransportError as exc:
            raise APIConnectionError(f"{call.method} {call.path}: {exc!r}") from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return call.read(response)

    async def agents(self) -> list[Agent]:
        return await self._run(_Calls.agents())

    async def create_session(
        self,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        role: str | None = None,
        value: float | None = None,
        webhook: str | None = None,
    ) -> Session:
        """Open a session; `webhook` (a URL) is POSTed each turn's outcome when it ends."""
        return await self._run(_Calls.create_session(agent, metadata, role, value, webhook))

    async def list_sessions(
        self, *, limit: int | None = None, ephemeral: bool = False
    ) -> list[Session]:
        return await self._run(_Calls.list_sessions(limit, ephemeral))

    async def start_workflow(
        self,
        slug: str,
        input: Any,
        *,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        webhook: str | None = None,
    ) -> Session:
        """Start a run of the workflow `slug` with `input`; the run is a Session. `webhook`
        (a URL) is POSTed the run's outcome, result and usage when it ends."""
        return await self._run(
            _Calls.start_workflow(slug, input, idempotency_key, metadata, webhook)
        )

    async def wait_for_run(
        self, run: SessionRef, *, timeout: float = 60.0, poll: float = 0.5
    ) -> WorkflowRun:
        """Poll the run until it ended; its `WorkflowRun` has the `result` or the `error`.
        TimeoutError past `timeout` seconds (a run waiting on a person stays unended)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = _run_outcome(await self.get_session(run))
            if ended is not None:
                return ended
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {session_ref(run)} did not end within {timeout} s")
            await asyncio.sleep(poll)

    async def get_session(self, session_id: SessionRef) -> Session:
        return await self._run(_Calls.get_session(session_id))

    async def cancel(self, session_id: SessionRef) -> CancelResult:
        return await self._run(_Calls.cancel(session_id))

    async def fork(
        self, session_id: SessionRef, *, checkpoint: int, role: str | None = None
    ) -> Session:
        return await self._run(_Calls.fork(session_id, checkpoint, role))

    async def resume(self, session_id: SessionRef) -> Session:
        return await self._run(_Calls.resume(session_id))

    async def checkpoints(
        self, session_id: SessionRef, *, limit: int | None = None
    ) -> list[Checkpoint]:
        return await self._run(_Calls.checkpoints(session_id, limit))

    async def send_message(
        self,
        session_id: SessionRef,
        content: str,
        *,
        idempotency_key: str | None = None,
        webhook: str | None = None,
    ) -> PostedMessage:
        """Post a message; `webhook` (a URL) is POSTed its turn's outcome when it ends."""
        return await self._run(_Calls.send_message(session_id, content, idempotency_key, webhook))

    async def list_messages(
        self, session_id: SessionRef, *, limit: int | None = None
    ) -> list[Message]:
        return await self._run(_Calls.list_messages(session_id, limit))

    async def iter_sessions(
        self, *, ephemeral: bool = False, page: int = 200
    ) -> AsyncIterator[Session]:
        """See `Client.iter_sessions`."""
        params: dict[str, Any] | None = _params(limit=page, ephemeral="true" if ephemeral else None)
        while params is not None:
            found = await self._run(_Calls.sessions_page(params))
            for session in found:
                yield session
            params = found.next_params

    async def iter_messages(
        self, session_id: SessionRef, *, page: int = 1000
    ) -> AsyncIterator[Message]:
        """See `Client.iter_messages`."""
        params: dict[str, Any] | None = {"limit": page}
        while params is not None:
            found = await self._run(_Calls.messages_page(session_id, params))
            for message in reversed(found):
                yield message
            params = found.next_params

    async def list_events(
        self, session_id: SessionRef, *, after: int = 0, limit: int | None = None
    ) -> EventPage:
        return await self._run(_Calls.list_events(session_id, after, limit))

    async def iter_events(self, session_id: SessionRef, *, after: int = 0) -> AsyncIterator[Event]:
        while True:
            page = await self.list_events(session_id, after=after, limit=EVENTS_PAGE)
            for event in page:
                yield event
            if not page.more:
                return
            after = page[-1].seq or after

    async def _all_after(self, session_id: SessionRef, after: int) -> list[Event]:
        return [event async for event in self.iter_events(session_id, after=after)]

    def stream(self, session_id: SessionRef, *, after: int = 0) -> AsyncEventStream:
        return AsyncEventStream(
            ws_base=self._ws_root,
            session_id=session_id,
            api_key=self._key,
            after=after,
            policy=self.reconnect,
            fetch_after=lambda seq: self._all_after(session_id, seq),
        )

    async def last_seq(self, session_id: SessionRef) -> int:
        last = 0
        async for event in self.iter_events(session_id):
            last = event.seq or last
        return last

    async def run_turn(
        self,
        session_id: SessionRef,
        content: str,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        on_event: Callable[[Event], None] | None = None,
        webhook: str | None = None,
    ) -> TurnResult:
        """See `Client.run_turn`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self.stream(session_id, after=await self.last_seq(session_id)) as events:
            posted = await self.send_message(
                session_id, content, idempotency_key=idempotency_key, webhook=webhook
            )
            own = posted.message
            turn = _own_turn(own)
            seen: list[Event] = []
            while True:
                left = None if deadline is None else max(deadline - time.monotonic(), 0)
                event = await events.receive(timeout=left)
                seen.append(event)
                if on_event is not None:
                    on_event(event)
                if isinstance(event, TurnFinished):
                    if turn is None:
                        listed = await self.list_messages(session_id, limit=RUN_TURN_LOOKBACK)
                        turn = _listed_turn(listed, own.id)
                    if turn is not None and event.turn >= turn:
                        return TurnResult(events=seen, finished=event)

    async def tools(self) -> list[Tool]:
        return await self._run(_Calls.tools())

    async def usage(self) -> OwnerUsage:
        return await self._run(_Calls.usage())

    async def approvals(
        self, *, status: str | None = "pending", limit: int | None = None
    ) -> list[Approval]:
        return await self._run(_Calls.approvals(status, limit))

    async def approve(
        self,
        approval_id: str,
        *,
        arguments: dict[str, Any] | None = None,
        comment: str | None = None,
    ) -> Approval:
        return await self._run(_Calls.approve(approval_id, arguments, comment))

    async def reject(self, approval_id: str, *, comment: str) -> Approval:
        return await self._run(_Calls.reject(approval_id, comment))

    async def review(
        self, approval_id: str, *, answer: str, result: Any = None, comment: str | None = None
    ) -> Approval:
        return await self._run(_Calls.review(approval_id, answer, result, comment))

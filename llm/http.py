"""HTTP plumbing shared by the wire-protocol adapters: one pooled client per
event loop, the three timeouts, status mapping and a Server-Sent Events parser."""

import asyncio
import codecs
import json
import os
import weakref
from collections.abc import AsyncIterator
from json.scanner import make_scanner
from typing import Any

import httpx

from runtime import egress
from runtime.retry import parse_retry_after as retry_after_seconds

from .base import (
    EndpointConfig,
    ModelAdapter,
    ModelConfigError,
    ModelProtocolError,
    ModelRateLimited,
    ModelTimeout,
    ModelUnavailable,
)

RETRY_AFTER_CAP_S = 60.0
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]" = (
    weakref.WeakKeyDictionary()
)


def shared_client() -> httpx.AsyncClient:
    """One connection pool per event loop (the worker has one long-lived loop); its
    connections pass the egress policy (runtime/egress.py)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = egress.async_client(
            limits=httpx.Limits(max_connections=500, max_keepalive_connections=100)
        )
        _clients[loop] = client
    return client


def parse_retry_after(value: str | None) -> float | None:
    """A `Retry-After` header in seconds, capped (what a breaker's cool-down may follow)."""
    seconds = retry_after_seconds(value)
    return None if seconds is None else min(seconds, RETRY_AFTER_CAP_S)


REDACTED = "[redacted]"
SECRET_HEADERS = ("authorization", "x-api-key", "api-key")


def redact(text: str, secrets: "list[str] | tuple[str, ...]") -> str:
    """Remove secrets from text that may end up in an error, a log line or an event."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def header_secrets(headers: dict[str, str]) -> list[str]:
    """The credential values among request headers (with and without a `Bearer ` prefix)."""
    found: list[str] = []
    for name, value in headers.items():
        if name.lower() in SECRET_HEADERS and value:
            found.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                found.append(token)
    return sorted(found, key=len, reverse=True)


def _status_error(
    status: int, body: bytes, headers: httpx.Headers, secrets: tuple[str, ...] | list[str] = ()
) -> Exception:
    # A provider may echo the key it refused: never let it into a message.
    snippet = redact(body[:4000].decode("utf-8", errors="replace"), secrets).strip()[:300]
    # As the server said (uncapped): a retry policy's own cap decides (runtime/retry.py).
    retry_after = retry_after_seconds(headers.get("retry-after"))
    if status == 429:
        return ModelRateLimited(
            f"rate limited (HTTP 429): {snippet}", retry_after_s=retry_after, status=status
        )
    if status >= 500 or status == 408:
        return ModelUnavailable(
            f"provider error (HTTP {status}): {snippet}", retry_after_s=retry_after, status=status
        )
    return ModelConfigError(f"request refused (HTTP {status}): {snippet}", status=status)


async def post_stream(
    endpoint: EndpointConfig, url: str, headers: dict[str, str], payload: dict[str, Any]
) -> AsyncIterator[bytes]:
    """POST and yield the body's bytes, enforcing connect, first-byte and total timeouts.

    The timeouts wrap only our own awaits (never a `yield`), so a slow consumer
    is not mistaken for a slow provider and cancellation stays local.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + endpoint.total_timeout_s
    first_deadline = min(deadline, start + endpoint.first_token_timeout_s)
    client = shared_client()
    request = client.build_request(
        "POST",
        url,
        headers=headers,
        json=payload,
        timeout=httpx.Timeout(
            connect=endpoint.connect_timeout_s,
            read=None,
            write=endpoint.connect_timeout_s,
            pool=endpoint.connect_timeout_s,
        ),
    )
    try:
        response = await asyncio.wait_for(
            client.send(request, stream=True), timeout=max(first_deadline - loop.time(), 0.001)
        )
    except TimeoutError:
        raise ModelTimeout(
            f"no answer from '{endpoint.name}' within {endpoint.first_token_timeout_s:g} s"
        ) from None
    except httpx.TimeoutException:
        raise ModelTimeout(
            f"could not connect to '{endpoint.name}' within {endpoint.connect_timeout_s:g} s"
        ) from None
    except httpx.HTTPError as exc:
        raise ModelUnavailable(f"cannot reach '{endpoint.name}': {type(exc).__name__}") from None
    except egress.EgressRefused as exc:
        # The same answer on every attempt: a configuration error, not an outage.
        raise ModelConfigError(f"endpoint '{endpoint.name}': {exc}") from None
    try:
        chunks = response.aiter_bytes()
        if response.status_code >= 400:
            try:
                body = await asyncio.wait_for(
                    response.aread(), timeout=max(deadline - loop.time(), 0.001)
                )
            except (TimeoutError, httpx.HTTPError):
                body = b""
            raise _status_error(
                response.status_code, body, response.headers, header_secrets(headers)
            )
        first = True
        while True:
            until = first_deadline if first else deadline
            if until <= loop.time():
                raise _timeout(endpoint, first)
            try:
                # timeout_at costs a third of wait_for per read (no extra task),
                # and it wraps only this await, never the `yield` below.
                async with asyncio.timeout_at(until):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise _timeout(endpoint, first) from None
            except httpx.HTTPError as exc:
                raise ModelProtocolError(
                    f"'{endpoint.name}' broke off the answer: {type(exc).__name__}"
                ) from None
            first = False
            yield chunk
    finally:
        await response.aclose()


def _timeout(endpoint: EndpointConfig, first: bool) -> ModelTimeout:
    if first:
        return ModelTimeout(
            f"no first token from '{endpoint.name}' within {endpoint.first_token_timeout_s:g} s"
        )
    return ModelTimeout(f"'{endpoint.name}' did not finish within {endpoint.total_timeout_s:g} s")


async def post_json(
    endpoint: EndpointConfig, url: str, headers: dict[str, str], payload: dict[str, Any]
) -> Any:
    """A non-streamed call: the whole body, parsed as JSON, under the same timeouts."""
    body = b"".join([chunk async for chunk in post_stream(endpoint, url, headers, payload)])
    try:
        return json.loads(body)
    except ValueError:
        raise ModelProtocolError(
            f"'{endpoint.name}' answered with something that is not JSON"
        ) from None


# json.loads re-checks its argument and runs two whitespace regexes around the
# C scanner on every call: 1 us of a 2.5 us parse of a typical stream chunk.
# typeshed wants a `make_scanner` as the context; at run time it is any JSONDecoder.
_scan_json = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def json_value(text: str) -> Any:
    """`json.loads(text)`, the same result and the same errors, faster on a bare document."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)  # leading whitespace, or not JSON: let loads decide or raise
    if end != len(text):
        return json.loads(text)  # trailing whitespace is fine, anything else is an error
    return value


class _SSELines:
    """The general line-by-line Server-Sent Events state machine (comments, `\\r\\n`,
    multi-line data, other fields); `sse_batches` uses it when its fast path cannot."""

    __slots__ = ("data", "event")

    def __init__(self) -> None:
        self.event = ""
        self.data: list[str] = []

    def take(self, lines: list[str], out: list[tuple[str, str]]) -> None:
        for line in lines:
            line = line.rstrip("\r")
            if not line:
                if self.data:
                    out.append((self.event or "message", "\n".join(self.data)))
                    self.data = []
                self.event = ""
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self.data.append(value)
            elif name == "event":
                self.event = value


async def sse_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[tuple[str, str]]]:
    """Yield the (event, data) pairs of the complete Server-Sent Events in each network
    read, as one list per read (one generator hop per read instead of per event).

    Bytes are decoded incrementally, so a UTF-8 character split across two
    network chunks is reassembled; invalid bytes become U+FFFD instead of
    failing the stream.
    """
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    general = _SSELines()
    buffer = ""
    async for chunk in chunks:
        # A blank line can only end in the new text (or its first character).
        seen = len(buffer) - 1
        buffer += decode(chunk)
        batch: list[tuple[str, str]] = []
        if general.data or general.event or "\r" in buffer:
            # Mid-event in the general parser, or CRLF line ends: line by line.
            if "\n" not in buffer:
                continue
            lines = buffer.split("\n")
            buffer = lines.pop()
            general.take(lines, batch)
        else:
            # Every provider's events are `data: ...` or `event: ...` + `data: ...`
            # separated by blank lines: cut the buffer at its last blank line and
            # take those two shapes without looking at every line.
            end = buffer.rfind("\n\n", max(seen, 0))
            if end < 0:
                continue
            blocks = buffer[:end].split("\n\n")
            buffer = buffer[end + 2 :]
            for block in blocks:
                if block[:6] == "data: " and "\n" not in block:
                    batch.append(("message", block[6:]))
                    continue
                if block[:7] == "event: ":
                    cut = block.find("\n")
                    if block[cut + 1 : cut + 7] == "data: " and block.find("\n", cut + 1) < 0:
                        batch.append((block[7:cut] or "message", block[cut + 7 :]))
                        continue
                general.take([*block.split("\n"), ""], batch)
        if batch:
            yield batch
    buffer += decode(b"", final=True)
    batch = []
    general.take([*buffer.split("\n"), ""], batch)
    if batch:
        yield batch


class HttpAdapter(ModelAdapter):
    """Base for adapters that speak HTTP: the key comes from the environment only."""

    def api_key(self) -> str:
        name = self.endpoint.api_key_env
        return os.environ.get(name, "") if name else ""

    def scrub(self, text: str) -> str:
        """Text from the provider, safe to put into an error message."""
        return redact(text, [self.api_key()])

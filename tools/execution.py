"""Executing the model's tool calls: validate, run with limits, report clearly.

Every outcome is data the model can act on (DESIGN.md invariant 6): an unknown
tool, bad arguments, a timeout, an open breaker or an exception all come back
as a failed result that starts with a failure marker and says what to do,
never as an exception.
"""

import asyncio
import hashlib
import inspect
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from django.conf import settings
from django.db import connection
from django.db.models import Q
from jsonschema import Draft202012Validator

from llm.wire_names import wire_name
from observability.redaction import scrub, scrub_value
from runtime import egress
from runtime.breaker import CircuitBreaker
from runtime.faults import fault_point
from runtime.retry import TOOL_DEFAULT, RetryPolicy, parse_retry_after, retry_policy

from . import builtin
from .env_access import HeaderEnvRefused, header_env_rule, refused_header_envs
from .mcp import McpEndpoint, McpToolError, McpUnreachable, call_tool
from .models import Tool
from .registry import UnknownHandler, get_handler
from .rendering import FAILURE_MARKER, MAX_CHARS, render_failure, render_success
from .result_limits import cut_form, http_read_limit, text_cut, tool_result_cut
from .validation import check_arguments, compile_validator

MAX_RESULT_CHARS = MAX_CHARS
logger = logging.getLogger(__name__)
__all__ = [
    "FAILURE_MARKER",
    "MAX_RESULT_CHARS",
    "ToolInvocation",
    "ToolOutcome",
    "ToolSnapshot",
    "execute_all",
    "execute_one",
    "outcome_within_limit",
    "tools_for_agent",
    "validator_for",
]


@dataclass(frozen=True)
class ToolSnapshot:
    """A tool definition read before the database connection is given back."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: str
    handler: str
    url: str
    method: str
    headers: dict[str, Any]
    timeout_s: float
    side_effects: bool
    roles: tuple[str, ...]
    version: str
    status_url: str = ""
    probe_handler: str = ""
    # Business-rule prechecks before a resumed or forked run continues (tools/prechecks.py).
    precheck_url: str = ""
    precheck_handler: str = ""
    idempotent: bool = True
    requires_approval: bool = False
    # None: not declared, assessed per call (tools/risk.py).
    risk_level: int | None = None
    result_description: str = ""
    approval_when: dict[str, Any] | None = None
    approval_timeout_s: int = 1800
    approval_on_timeout: str = "reject"
    approval_escalate_to: str = ""
    credit_cost: int = 0
    # CEL estimates for its credit pool request ('' : the session's value, credit_cost),
    # (tools/estimates.py; evaluated in engine/gates/credit_pool.py).
    value: str = ""
    cost: str = ""
    # A workflow's human node (workflows/node_tools.py): the approvers group asked, and the
    # argument whose text is the approval's reason (the node's rendered summary).
    approval_group: str = ""
    approval_reason_argument: str = ""
    critical: bool = False
    rate_limit_calls_per_min: int = 0
    rate_limit_tokens_per_min: int = 0
    # The service's declared health (engine/gates/surroundings.py): a success rate it
    # promises, and calls it allows per minute, hour or day (0: no quota).
    sla_rate: float | None = None
    quota_calls: int = 0
    quota_per: str = ""
    # MCP tools: the server and the tool's name there.
    mcp: McpEndpoint | None = None
    mcp_tool: str = ""
    retry: RetryPolicy = TOOL_DEFAULT

    @classmethod
    def from_model(cls, tool: Tool) -> "ToolSnapshot":
        return cls(
            name=tool.name,
            description=tool.description,
            parameters=tool.parameters or {"type": "object", "properties": {}},
            kind=tool.kind,
            handler=tool.handler,
            url=tool.url,
            method=(tool.method or "POST").upper(),
            headers=dict(tool.headers or {}),
            timeout_s=tool.timeout_s,
            side_effects=tool.side_effects,
            roles=tuple(tool.roles or ()),
            # The schema's own hash: the compiled validator follows any change to it.
            version=hashlib.sha256(
                json.dumps(tool.parameters or {}, sort_keys=True).encode()
            ).hexdigest()[:16],
            status_url=tool.status_url,
            probe_handler=tool.probe_handler,
            precheck_url=tool.precheck_url,
            precheck_handler=tool.precheck_handler,
            idempotent=tool.idempotent,
            requires_approval=tool.requires_approval,
            risk_level=tool.risk_level,
            result_description=tool.result_description,
            approval_when=tool.approval_when or None,
            approval_timeout_s=tool.approval_timeout_s,
            approval_on_timeout=tool.approval_on_timeout,
            approval_escalate_to=tool.approval_escalate_to,
            credit_cost=tool.credit_cost,
            value=tool.value,
            cost=tool.cost,
            critical=tool.critical,
            rate_limit_calls_per_min=tool.rate_limit_calls_per_min,
            rate_limit_tokens_per_min=tool.rate_limit_tokens_per_min,
            sla_rate=tool.sla_rate,
            quota_calls=int((tool.quota or {}).get("calls") or 0),
            quota_per=str((tool.quota or {}).get("per") or ""),
            mcp=(
                McpEndpoint.from_model(tool.mcp_server)
                if getattr(tool, "mcp_server_id", None) and tool.mcp_server is not None
                else None
            ),
            mcp_tool=getattr(tool, "mcp_tool", ""),
            retry=retry_policy(tool.retry, TOOL_DEFAULT),
        )

    @property
    def model_description(self) -> str:
        """The description the model receives: what the tool does, then what it returns."""
        result = " ".join(self.result_description.split())
        if not result:
            return self.description
        # One line, so it reads the same in every wire format (the prompt-mode list included).
        description = self.description.rstrip()
        joint = " " if description.endswith((".", "!", "?", ":")) else ". "
        return f"{description}{joint}Returns: {result}"

    @property
    def paid(self) -> bool:
        """Its calls cost points: the owner's account (credit_cost) or a pool's (cost)."""
        return self.credit_cost > 0 or bool(self.cost)

    def allows(self, role: str) -> bool:
        return not self.roles or role in self.roles


@dataclass(frozen=True)
class ToolInvocation:
    call_id: str
    name: str
    arguments: dict[str, Any]
    idempotency_key: str
    arguments_error: str | None = None
    # This call's own time limit instead of the tool's (a workflow node's timeout_s).
    timeout_s: float | None = None
    # Attempts made in earlier steps (a retry whose wait parked the session).
    attempts_before: int = 0


@dataclass
class ToolOutcome:
    status: str  # success | failed | timeout | rejected
    output: dict[str, Any] | None
    error: str = ""
    elapsed_ms: int = 0
    content: str = ""
    coercions: list[str] = field(default_factory=list)
    attempts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


_validators: dict[tuple[str, str], Draft202012Validator] = {}


def _builtin_tool(
    *,
    name: str,
    description: str,
    parameters: dict[str, object],
    handler: str,
    timeout_s: float,
    result_description: str,
) -> ToolSnapshot:
    """A tool the engine handles itself: listed by name in an agent, with no row.
    None has side effects the engine cannot repeat safely (a re-run step finds its
    own write), and every role may use it."""
    return ToolSnapshot(
        name=name,
        description=description,
        parameters=parameters,
        kind="python",
        handler=handler,
        url="",
        method="",
        headers={},
        timeout_s=timeout_s,
        side_effects=False,
        roles=(),
        version="builtin-1",
        risk_level=0,
        result_description=result_description,
    )


ASK_USER_TOOL = _builtin_tool(
    name=builtin.ASK_USER,
    description=(
        "Ask the user a question and wait for the answer (their next message). "
        "Give options when the answer is one of a few; deadline_s and default_answer "
        "answer for them if they do not reply in time."
    ),
    parameters=builtin.ASK_USER_PARAMETERS,
    handler=builtin.ASK_USER_HANDLER,
    timeout_s=1.0,
    result_description="The user's answer, as {answer, by}.",
)
REMEMBER_TOOL = _builtin_tool(
    name=builtin.REMEMBER,
    description=(
        "Store something worth knowing in later conversations with this user (a preference, "
        "a fact about them, an agreement, a conclusion). tag: preference, fact, agreement or "
        "business conclusion. subject (optional, short): what it is about, e.g. "
        "'favourite colour'; a new value for a subject already remembered updates that "
        "memory, the old value kept as its history. Do not use it for what matters only now."
    ),
    parameters=builtin.REMEMBER_PARAMETERS,
    handler=builtin.REMEMBER_HANDLER,
    timeout_s=10.0,
    result_description=(
        "{stored: true, action: created|updated|unchanged, id, subject, replaces?: the "
        "previous text}."
    ),
)
RECALL_TOOL = _builtin_tool(
    name=builtin.RECALL,
    description=(
        "Search what you remember about this user and this conversation's earlier, "
        "summarised-away messages (for example what they said at the start)."
    ),
    parameters=builtin.RECALL_PARAMETERS,
    handler=builtin.RECALL_HANDLER,
    timeout_s=10.0,
    result_description="{memories: [...], archived_messages: [{seq, role, content}]}.",
)
BUILTIN_TOOLS = {
    builtin.ASK_USER: ASK_USER_TOOL,
    builtin.REMEMBER: REMEMBER_TOOL,
    builtin.RECALL: RECALL_TOOL,
}


def validator_for(tool: ToolSnapshot) -> Draft202012Validator:
    """Compile each tool's schema once per definition version (59 µs vs 3.1 ms a call)."""
    key = (tool.name, tool.version)
    found = _validators.get(key)
    if found is None:
        found = compile_validator(tool.parameters)
        _validators[key] = found
    return found


def tool_breaker() -> CircuitBreaker:
    return CircuitBreaker(
        "tool",
        threshold=settings.TOOL_BREAKER_THRESHOLD,
        cooldown_s=settings.TOOL_BREAKER_COOLDOWN_S,
    )


def _failure(
    status: str,
    message: str,
    started: float,
    *,
    output: dict[str, Any] | None = None,
    shown: str | None = None,
    **kwargs: Any,
) -> ToolOutcome:
    """Every failed outcome of a call is built here (`shown`: what the model reads, when it
    says more than `message`).

    A failure quotes what came from outside: an API's error body, an MCP server's error,
    a handler's exception, a business error. Those texts pass the logs' scrubber here,
    once, so no credential, e-mail address or card number a tool echoed reaches the
    call's row, its tool message, its event, the admin or the API, whoever ran the call
    (the engine, an operator by hand). A success is the owner's own data and stays whole.
    """
    return ToolOutcome(
        status=status,
        output=scrub_value(output),
        error=scrub(message),
        elapsed_ms=int((time.perf_counter() - started) * 1000),
        content=render_failure(status, scrub(message if shown is None else shown)),
        **kwargs,
    )


def _call_python_sync(
    handler_name: str, arguments: dict[str, Any], idempotency_key: str, *, always_key: bool = False
) -> Any:
    handler = get_handler(handler_name)
    kwargs = dict(arguments)
    if handler.wants_idempotency_key or always_key:
        kwargs["idempotency_key"] = idempotency_key
    try:
        return handler.func(**kwargs)
    finally:
        # This runs on a helper thread: give its connection back to the pool.
        connection.close()


async def _run_python(tool: ToolSnapshot, arguments: dict[str, Any], key: str) -> Any:
    handler = get_handler(tool.handler)
    if inspect.iscoroutinefunction(handler.func):
        kwargs = dict(arguments)
        if handler.wants_idempotency_key:
            kwargs["idempotency_key"] = key
        return await handler.func(**kwargs)
    return await asyncio.to_thread(_call_python_sync, tool.handler, arguments, key)


_http_clients: dict[int, httpx.AsyncClient] = {}


def _client() -> httpx.AsyncClient:
    """One pool per event loop; its connections pass the egress policy (runtime/egress.py)."""
    loop_id = id(asyncio.get_running_loop())
    client = _http_clients.get(loop_id)
    if client is None or client.is_closed:
        client = egress.async_client(
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50)
        )
        _http_clients[loop_id] = client
    return client


class ToolMisconfigured(Exception):
    """The tool's definition cannot be used as stored (checked at call time too: the admin can edit it)."""


def http_headers(tool: ToolSnapshot, key: str) -> dict[str, str]:
    refused = refused_header_envs(tool.headers)
    if refused:
        names = ", ".join(f"{header} reads {name}" for header, name in refused)
        raise ToolMisconfigured(f"header {names}, but {header_env_rule()}")
    headers = {"Idempotency-Key": key}
    for name, value in tool.headers.items():
        # `{"env": "NAME"}` takes a secret from the environment, never from the database.
        headers[name] = (
            os.environ.get(str(value.get("env", "")), "") if isinstance(value, dict) else str(value)
        )
    return headers


def url_with_arguments(url: str, arguments: dict[str, Any]) -> tuple[httpx.URL, httpx.QueryParams]:
    """The URL without its query, and its own query followed by the arguments.

    httpx replaces a URL's query with `params`, so a configured `?fixed=1` would
    be lost; an argument never overrides a configured parameter.
    """
    parsed = httpx.URL(url)
    configured = parsed.params
    extra = {name: value for name, value in arguments.items() if name not in configured}
    return parsed.copy_with(query=None), configured.merge(extra)


class ToolHttpError(Exception):
    """The business API answered with an error status; its body is the model's to read."""

    def __init__(self, status: int, body: Any, retry_after_s: float | None = None) -> None:
        detail = body.get("error") if isinstance(body, dict) and body.get("error") else body
        # Scrubbed before it is cut: a cut first could leave half an address the scrubber misses.
        super().__init__(f"HTTP {status}: {scrub(str(detail))[:500]}")
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class _HttpAnswer:
    """An HTTP tool's answer, its body read no further than `http_read_limit()`."""

    status: int
    body: Any  # the JSON body, {"text": ...} for another body, or a result's cut form
    request: httpx.Request
    response: httpx.Response  # closed; its status and headers only


async def _http_send(
    method: str, url: httpx.URL | str, headers: dict[str, str], **kwargs: Any
) -> _HttpAnswer:
    """Send one request and read its body streaming, stopping past the read limit.

    A body over the limit is never held whole (a 50 MB answer costs the limit's
    bytes of memory, not 50 MB): what was read becomes the result's cut form, and
    closing the unread response drops its connection.
    """
    limit = http_read_limit()
    # A compressed body could inflate far past what was read; ask for it as is.
    headers = {"Accept-Encoding": "identity", **headers}
    async with _client().stream(method, url, headers=headers, **kwargs) as response:
        chunks: list[bytes] = []
        size = 0
        complete = True
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                complete = False
                break
    data = b"".join(chunks)
    del chunks
    if not complete:
        declared = response.headers.get("content-length", "")
        body: Any = cut_form(
            data,
            original_bytes=int(declared) if declared.isdigit() else None,
            sha256=None,
        )
    else:
        try:
            body = json.loads(data)
        except ValueError:
            text = data.decode(response.encoding or "utf-8", errors="replace")
            body = {"text": text[:2000]}
    return _HttpAnswer(response.status_code, body, response.request, response)


async def _run_http(tool: ToolSnapshot, arguments: dict[str, Any], key: str) -> Any:
    headers = http_headers(tool, key)
    if tool.method in ("GET", "DELETE"):
        url, params = url_with_arguments(tool.url, arguments)
        answer = await _http_send(tool.method, url, headers, params=params)
    else:
        answer = await _http_send(tool.method, tool.url, headers, json=arguments)
    # Crash tests: the request took effect but its result is not recorded yet.
    fault_point("after_tool_sent")
    body = answer.body
    if answer.status >= 500:
        raise httpx.HTTPStatusError(
            f"HTTP {answer.status}", request=answer.request, response=answer.response
        )
    if answer.status >= 300:
        if answer.status < 400:
            # Redirects are never followed (the configured URL is the only one called), so
            # a 3xx did not do what was asked. Its Location stays out of the model's view.
            body = {
                "ok": False,
                "error": "the API answered with a redirect, which is not followed;"
                " the tool's URL must be the final one",
            }
        raise ToolHttpError(
            answer.status, body, parse_retry_after(answer.response.headers.get("retry-after"))
        )
    return body


def _transport_error(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError | httpx.HTTPStatusError | McpUnreachable)


@dataclass(frozen=True)
class RetrySignal:
    """What a failed attempt says about trying again (runtime/retry.py's error kinds)."""

    kind: str | None  # timeout | connect | 5xx | 429; None: not worth another attempt
    # The error proves the request did not take effect, so even a call with side
    # effects may go again (with its idempotency key): the connection was never made
    # (nothing was sent), or the server refused it unprocessed (429; 503 with Retry-After).
    not_done: bool = False
    retry_after_s: float | None = None


def retry_signal(exc: BaseException) -> RetrySignal:
    if egress_refusal(exc) is not None:
        return RetrySignal(None)  # the policy says the same on every attempt
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return RetrySignal("connect", not_done=True)
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return RetrySignal("timeout")
    if isinstance(exc, httpx.TransportError | McpUnreachable):
        return RetrySignal("connect")  # broke off after sending: it may have taken effect
    if isinstance(exc, httpx.HTTPStatusError):
        after = parse_retry_after(exc.response.headers.get("retry-after"))
        status = exc.response.status_code
        return RetrySignal("5xx", not_done=status == 503 and after is not None, retry_after_s=after)
    if isinstance(exc, ToolHttpError) and exc.status == 429:
        return RetrySignal("429", not_done=True, retry_after_s=exc.retry_after_s)
    return RetrySignal(None)


def retry_wait(
    tool: ToolSnapshot, invocation: "ToolInvocation", signal: RetrySignal, failed: int
) -> float | None:
    """The wait before the next attempt after `failed` failed ones, or None: no retry.

    A tool without side effects is retried on any error its policy names; one with
    side effects only when the call carries an idempotency key, goes over HTTP (the
    only kind whose errors say what happened) and the error proves it did not take
    effect (`RetrySignal.not_done`).
    """
    if not tool.retry.retries(signal.kind):
        return None
    if tool.side_effects and not (
        signal.not_done and invocation.idempotency_key and tool.kind == "http"
    ):
        return None
    return tool.retry.wait_s(failed, signal.retry_after_s)


async def _run_mcp(tool: ToolSnapshot, arguments: dict[str, Any], key: str) -> Any:
    if tool.mcp is None or not tool.mcp_tool:
        raise ToolMisconfigured("its MCP server is not recorded; refresh the server")
    return await call_tool(tool.mcp, tool.mcp_tool, arguments, key)


async def _invoke(tool: ToolSnapshot, arguments: dict[str, Any], key: str) -> Any:
    if tool.kind == "python":
        runner = _run_python(tool, arguments, key)
    elif tool.kind == "mcp":
        runner = _run_mcp(tool, arguments, key)
    else:
        runner = _run_http(tool, arguments, key)
    return await asyncio.wait_for(runner, timeout=tool.timeout_s)


def _reject_unknown(
    invocation: ToolInvocation, tools: dict[str, ToolSnapshot], role: str, started: float
) -> ToolOutcome:
    name = invocation.name
    # Named as the model sees them: a wire that needs it spells `parcels.track_parcel` as
    # `parcels__track_parcel`; a model that wrote a dotted name sees them as stored.
    spell = (lambda n: n) if "." in name else wire_name
    allowed = ", ".join(sorted(spell(t.name) for t in tools.values() if t.allows(role))) or "none"
    if name.replace("_", "").replace("-", "").isalnum() and len(name) <= 64:
        shown = f"'{name}'"
    else:
        # Odd characters are shown escaped and a long name cut, so the list of usable tools stays in view.
        shown = json.dumps(name[:64] + ("…" if len(name) > 64 else ""))
    return _failure("rejected", f"unknown tool {shown}. Tools you may use: {allowed}.", started)


def outcome_within_limit(outcome: ToolOutcome) -> ToolOutcome:
    """The outcome with its result within TOOL_RESULT_MAX_BYTES (tools/result_limits.py:
    cut, with a marker the model reads) and its error text bounded."""
    output = outcome.output
    cut = tool_result_cut(output) if isinstance(output, dict) else output
    error = text_cut(outcome.error, MAX_CHARS, "error")
    if cut is output and error == outcome.error:
        return outcome
    content = outcome.content
    if cut is not output and cut is not None and outcome.status == "success":
        content = render_success(cut, cached=bool(outcome.extra.get("cached")))
    return replace(outcome, output=cut, error=error, content=content)


async def execute_one(
    invocation: ToolInvocation, tools: dict[str, ToolSnapshot], role: str
) -> ToolOutcome:
    """Run one call; never raises for anything the model or the tool did wrong.
    Its result is within TOOL_RESULT_MAX_BYTES (`outcome_within_limit`)."""
    return outcome_within_limit(await _execute_one(invocation, tools, role))


async def _execute_one(
    invocation: ToolInvocation, tools: dict[str, ToolSnapshot], role: str
) -> ToolOutcome:
    """Run one call; never raises for anything the model or the tool did wrong.

    1. Refuse unknown tools and tools the session's role may not use (alike).
    2. Check arguments: safe coercions, then every remaining problem at once.
    3. Fail fast while the tool's breaker is open.
    4. Run under the call's timeout, retried as the tool's retry policy says
       (`retry_wait`): a short wait here, a longer one marked on the outcome
       (`extra["retry_in_s"]`) for the tool step to park the session.
    """
    started = time.perf_counter()
    tool = tools.get(invocation.name)
    if tool is None or not tool.allows(role):
        return _reject_unknown(invocation, tools, role, started)
    if invocation.timeout_s is not None:
        tool = replace(tool, timeout_s=invocation.timeout_s)
    if invocation.arguments_error:
        return _failure(
            "failed",
            f"arguments are not valid JSON ({invocation.arguments_error}); send a JSON object.",
            started,
        )
    checked = check_arguments(validator_for(tool), invocation.arguments)
    if checked.errors:
        problems = "; ".join(checked.errors)
        return _failure(
            "failed",
            f"invalid arguments for {tool.name}: {problems}. Fix them and call again.",
            started,
            coercions=checked.coercions,
        )
    breaker = tool_breaker()
    if not breaker.allow(tool.name):
        log_tool_failure(tool, "breaker_open", "cooling down after repeated failures")
        return _failure(
            "failed",
            f"{tool.name} is temporarily unavailable after repeated failures; continue without it or try later.",
            started,
            coercions=checked.coercions,
        )
    attempts = 0
    output: Any = None
    while True:
        attempts += 1
        try:
            output = await _invoke(tool, checked.arguments, invocation.idempotency_key)
            break
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's data, not the run's crash
            failed = invocation.attempts_before + attempts
            wait = retry_wait(tool, invocation, retry_signal(exc), failed)
            if wait is not None and wait <= settings.RETRY_INLINE_WAIT_S:
                await asyncio.sleep(wait)
                continue
            if isinstance(exc, TimeoutError):
                outcome = _timeout_outcome(tool, started, checked.coercions, attempts, breaker)
            else:
                outcome = _exception_outcome(
                    tool, exc, started, checked.coercions, attempts, breaker
                )
            if wait is not None:
                # Too long to wait here: the tool step parks the session and sends it again
                # then (engine/phases/tools.py), or, when it cannot, the model is told.
                outcome.extra["retry_in_s"] = round(wait, 3)
            return outcome
    breaker.record_success(tool.name)
    if not isinstance(output, dict):
        output = {"result": output}
    if output.get("ok") is False:
        # A business error ("order not found") is a normal result to reason about.
        message = str(output.get("error") or "the tool reported a failure")
        log_tool_failure(tool, "business_error", message)
        return _failure(
            "failed",
            message,
            started,
            output=output,
            coercions=checked.coercions,
            attempts=attempts,
        )
    return ToolOutcome(
        status="success",
        output=output,
        elapsed_ms=int((time.perf_counter() - started) * 1000),
        content=render_success(output),
        coercions=checked.coercions,
        attempts=attempts,
    )


def _timeout_outcome(
    tool: ToolSnapshot, started: float, coercions: list[str], attempts: int, breaker: CircuitBreaker
) -> ToolOutcome:
    breaker.record_failure(tool.name)
    # What the caller waited in all, not one attempt's limit.
    waited = (
        f"{tool.timeout_s:g} s"
        if attempts == 1
        else f"{tool.timeout_s:g} s, {attempts} times ({tool.timeout_s * attempts:g} s in all)"
    )
    log_tool_failure(tool, "timeout", f"no answer within {waited}")
    return _failure(
        "timeout",
        f"{tool.name} did not answer within {waited}.",
        started,
        coercions=coercions,
        attempts=attempts,
    )


def egress_refusal(exc: BaseException) -> egress.EgressRefused | None:
    """The egress policy's refusal behind a failure, if that is what it was: raised as is by an
    HTTP tool's client, or inside the MCP SDK's task groups behind McpUnreachable."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, egress.EgressRefused):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _failure_status(exc: BaseException) -> str:
    if egress_refusal(exc) is not None:
        return "egress_refused"
    if isinstance(exc, ToolHttpError):
        return str(exc.status)
    if isinstance(exc, httpx.HTTPStatusError):
        return str(exc.response.status_code)
    if isinstance(exc, UnknownHandler | ToolMisconfigured | HeaderEnvRefused):
        return "misconfigured"
    if isinstance(exc, httpx.TransportError | McpUnreachable):
        return "unreachable"
    if isinstance(exc, McpToolError):
        return "tool_error"
    return "exception"


def log_tool_failure(tool: ToolSnapshot, status: str, reason: str) -> None:
    """One WARNING line per failed call, for the operator: tool, URL, status, reason.

    The URL is the configured one (arguments may hold personal data), and the
    values of the tool's secret headers are cut out of the reason.
    """
    if tool.mcp is not None:
        where = f"mcp:{tool.mcp.name}:{tool.mcp.where}"
    else:
        where = tool.url if tool.kind == "http" else f"python:{tool.handler}"
    headers = {**tool.headers, **(tool.mcp.headers if tool.mcp is not None else {})}
    secrets = [
        os.environ.get(str(v.get("env", "")), "") for v in headers.values() if isinstance(v, dict)
    ] + [str(v) for v in headers.values() if not isinstance(v, dict)]
    for secret in secrets:
        if secret and len(secret) >= 4:
            reason = reason.replace(secret, "[redacted]")
    reason = " ".join(reason.split())[:300]
    logger.warning(
        "tool call failed: tool=%s url=%s status=%s reason=%s", tool.name, where, status, reason
    )


def _exception_outcome(
    tool: ToolSnapshot,
    exc: Exception,
    started: float,
    coercions: list[str],
    attempts: int,
    breaker: CircuitBreaker,
) -> ToolOutcome:
    refused = egress_refusal(exc)
    log_tool_failure(tool, _failure_status(exc), str(refused or exc) or type(exc).__name__)
    if refused is not None:
        # The platform's own policy, not the tool's health: no breaker count, and nothing
        # was sent. The model reads the host refused, never a URL's path or secrets.
        return _failure(
            "failed",
            str(refused),
            started,
            output={"ok": False, "error": "egress_refused", "host": refused.host},
            shown=(
                f"{tool.name} cannot be called: {refused}. Tell the user it is unavailable; "
                "calling it again will not help."
            ),
            coercions=coercions,
            attempts=attempts,
        )
    if isinstance(exc, UnknownHandler | ToolMisconfigured | HeaderEnvRefused):
        message = f"{tool.name} is misconfigured ({exc}); tell the user it is unavailable."
    elif isinstance(exc, McpToolError):
        # The server answered: the tool's own error is the model's to read, not an outage.
        breaker.record_success(tool.name)
        return _failure(
            "failed",
            str(exc)[:2000],
            started,
            output={"ok": False, "error": str(exc)[:2000]},
            shown=f"{tool.name} reported an error: {str(exc)[:2000]}",
            coercions=coercions,
            attempts=attempts,
        )
    elif isinstance(exc, McpUnreachable):
        breaker.record_failure(tool.name)
        server = tool.mcp.name if tool.mcp is not None else "?"
        message = (
            f"{tool.name} could not be reached: its MCP server '{server}' is down or "
            "not answering; continue without it or tell the user it is unavailable."
        )
    elif isinstance(exc, ToolHttpError):
        # The API understood and refused: business data, not an outage (it also ends a half-open trial).
        breaker.record_success(tool.name)
        return _failure(
            "failed",
            str(exc),
            started,
            output=exc.body if isinstance(exc.body, dict) else {"body": exc.body},
            shown=f"{tool.name} refused the call: {exc}",
            coercions=coercions,
            attempts=attempts,
        )
    elif _transport_error(exc):
        breaker.record_failure(tool.name)
        message = f"{tool.name} could not be reached: {type(exc).__name__}"
    elif isinstance(exc, TypeError):
        message = f"{tool.name} rejected the arguments: {exc}"
    else:
        breaker.record_failure(tool.name)
        message = f"{tool.name} failed: {type(exc).__name__}: {exc}"
    return _failure("failed", message, started, coercions=coercions, attempts=attempts)


async def execute_all(
    invocations: list[ToolInvocation],
    tools: dict[str, ToolSnapshot],
    role: str,
    *,
    step_timeout_s: float | None = None,
) -> list[ToolOutcome]:
    """Run one response's calls concurrently; results come back in the model's order.

    The step's time limit bounds them all: a call still running when it ends
    is reported as a timeout of the step.
    """
    tasks = [asyncio.ensure_future(execute_one(i, tools, role)) for i in invocations]
    if not tasks:
        return []
    started = time.perf_counter()
    done, pending = await asyncio.wait(tasks, timeout=step_timeout_s)
    for task in pending:
        task.cancel()
    outcomes: list[ToolOutcome] = []
    for task, invocation in zip(tasks, invocations, strict=True):
        if task in done:
            outcomes.append(task.result())
        else:
            outcomes.append(
                _failure(
                    "timeout",
                    f"{invocation.name} was stopped: the step's time limit of {step_timeout_s:g} s ran out.",
                    started,
                )
            )
    return outcomes


def tools_for_agent(names: list[str], role: str | None = None) -> dict[str, ToolSnapshot]:
    """The agent's enabled tools; with a role, only those that role may use."""
    rows = (
        Tool.objects.filter(name__in=names, enabled=True)
        .filter(Q(mcp_server__isnull=True) | Q(mcp_server__enabled=True))
        .select_related("mcp_server")
    )
    snapshots = (ToolSnapshot.from_model(t) for t in rows)
    found = {t.name: t for t in snapshots if role is None or t.allows(role)}
    for name, snapshot in BUILTIN_TOOLS.items():
        if name in names and name not in found:
            found[name] = snapshot  # built in: listed by name, no row
    return found


# A probe's detail when the tool has none: asking again cannot help.
NO_PROBE = "the tool has no probe"


@dataclass(frozen=True)
class ProbeResult:
    """What a probe learned about an uncertain side-effecting call."""

    verdict: str  # done | not_done | unknown
    output: dict[str, Any] | None = None
    detail: str = ""


async def probe(tool: ToolSnapshot, idempotency_key: str) -> ProbeResult:
    """Ask the tool whether a call with this key took effect, without repeating it.

    HTTP tools answer at `status_url?idempotency_key=K` (200 with
    {"status": "done", "result": {...}}, or 404 when nothing happened; 200 with
    {"status": "unknown"} or any other answer: it cannot tell);
    Python tools through their registered probe (a dict when done, None when not).
    """
    try:
        if tool.kind == "http" and tool.status_url:
            url, params = url_with_arguments(tool.status_url, {"idempotency_key": idempotency_key})
            answer = await asyncio.wait_for(
                _http_send("GET", url, http_headers(tool, idempotency_key), params=params),
                timeout=tool.timeout_s,
            )
            if answer.status == 404:
                return ProbeResult("not_done")
            body = answer.body if answer.status == 200 else None
            if isinstance(body, dict) and body.get("status") == "done":
                result = body.get("result")
                return ProbeResult(
                    "done", result if isinstance(result, dict) else {"result": result}
                )
            if isinstance(body, dict) and body.get("status") in ("not_found", "none"):
                return ProbeResult("not_done")
            if isinstance(body, dict) and body.get("status") == "unknown":
                # The service itself cannot tell yet (a replica behind, a ledger being
                # written): not a "no", so the call is not sent again on it.
                return ProbeResult("unknown", detail="the status URL answered: unknown")
            return ProbeResult("unknown", detail=f"status URL answered HTTP {answer.status}")
        if tool.kind == "python" and tool.probe_handler:
            handler = get_handler(tool.probe_handler)
            if inspect.iscoroutinefunction(handler.func):
                found = await asyncio.wait_for(
                    handler.func(idempotency_key=idempotency_key), timeout=tool.timeout_s
                )
            else:
                # A probe is asked about a key, so it always gets it (as the async path does).
                found = await asyncio.wait_for(
                    asyncio.to_thread(
                        _call_python_sync, tool.probe_handler, {}, idempotency_key, always_key=True
                    ),
                    timeout=tool.timeout_s,
                )
            if found is None:
                return ProbeResult("not_done")
            return ProbeResult("done", found if isinstance(found, dict) else {"result": found})
    except Exception as exc:  # noqa: BLE001 - a probe that fails cannot tell
        return ProbeResult("unknown", detail=f"probe failed: {type(exc).__name__}")
    return ProbeResult("unknown", detail=NO_PROBE)

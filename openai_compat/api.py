"""The OpenAI-compatible edge: `POST /openai/v1/chat/completions`, `GET /openai/v1/models`.

Views translate and delegate. The request's thread does the checks and the
writes (a session seeded with the request's history, the turn's message) and
returns at once a DeferredResponse; its status and body are decided on the event
loop by `relay.TurnAnswer`, which waits on the session's frames holding no thread
and no connection. So every error a request can be refused for (401, 400, 404,
429, 503) has its own status, and so has a turn that failed (502 when no model
could answer, 503 when it is overloaded, 429 when the budget ran out); how a turn
that answered or paused ended is told in the answer itself (`finish_reason` and
the `agentplatform` key).
"""

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.throttling import ApiKeyRateThrottle
from billing.selectors import credits_cover
from record.errors import DomainError, InvalidInput, NotFound
from record.json_limits import JsonRejected
from restapi.errors import SHOULD_RETRY, retry_advice
from restapi.schema import (
    ERROR_DESCRIPTIONS,
    IDEMPOTENCY_KEY_PARAMETER,
    ErrorDocumentingAutoSchema,
    operation_text_trim,
)
from runtime.deferred_response import DeferredResponse
from sessions.selectors import session_get_for_owner
from sessions.services import (
    IDEMPOTENCY_DERIVED_PREFIX,
    IDEMPOTENCY_HEADER,
    KeyedRequest,
    request_fingerprint,
    request_key_parse,
)

from . import api_docs, selectors, services
from .relay import Turn, TurnAnswer, TurnFrames
from .wire import ErrorBody, RequestInvalid, chat_request_parse, error_body

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"
# A busy session is worth retrying soon: the SDKs honour Retry-After on a 503.
BUSY_RETRY_AFTER_S = 2


# Errors --------------------------------------------------------------------------------


def _type_for(code: int, error_code: str | None) -> str:
    if error_code == "insufficient_quota":
        return "insufficient_quota"  # as OpenAI's own
    if code == 401:
        return "authentication_error"
    if code == 429:
        return "rate_limit_error"
    if code >= 500:
        return "server_error"
    return "invalid_request_error"


def _error(message: str, code_status: int, code: str | None, param: str | None = None) -> Response:
    return Response(
        error_body(message, _type_for(code_status, code), code, param), status=code_status
    )


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Every refusal in OpenAI's error shape, with the status OpenAI would give; a final one
    says `x-should-retry: false` (the SDKs retry 409 and 429 by default): a 4xx that the
    same request would meet again, and no credits left (429 `insufficient_quota`)."""
    response = retry_advice(_openai_error(exc, context))
    if isinstance(exc, services.CreditsExhausted):
        response[SHOULD_RETRY] = "false"
    return response


def _openai_error(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, RequestInvalid):
        return _error(exc.message, 400, "invalid_request", exc.param)
    if isinstance(exc, services.SessionBusy):
        response = _error(exc.message, exc.status, exc.code)
        response["Retry-After"] = str(BUSY_RETRY_AFTER_S)
        return response
    if isinstance(exc, DomainError):
        param = exc.details.get("field") if isinstance(exc.details, dict) else None
        return _error(exc.message, exc.status, exc.code, param)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _error(f"request body is larger than {limit} bytes", 413, "request_too_large")
    if isinstance(exc, JsonRejected):
        return _error(exc.message, 413 if exc.too_large else 400, "invalid_request")
    if isinstance(exc, Http404):
        return _error("not found", 404, "not_found")
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response = _error(
            "Incorrect API key provided: use 'Authorization: Bearer <api key>' with a valid key.",
            401,
            "invalid_api_key",
        )
        response["WWW-Authenticate"] = "Bearer"
        return response
    if isinstance(exc, exceptions.Throttled):
        wait = math.ceil(exc.wait) if exc.wait is not None else None
        response = _error(str(exc.detail), 429, "rate_limit_exceeded")
        if wait is not None:
            response["Retry-After"] = str(wait)
        return response
    if isinstance(exc, exceptions.ParseError):
        return _error("We could not parse the JSON body of your request.", 400, "invalid_json")
    if isinstance(exc, exceptions.APIException):
        return _error(str(exc.detail), exc.status_code, exc.default_code)
    logger.exception("unhandled error in %s", type(context.get("view")).__name__)
    return _error("The server had an error processing your request.", 500, "internal_error")


# Schema --------------------------------------------------------------------------------


class OpenAIErrorObjectSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField(help_text="invalid_request_error, authentication_error, ...")
    param = serializers.CharField(allow_null=True)
    code = serializers.CharField(allow_null=True)


class OpenAIErrorSerializer(serializers.Serializer):
    """OpenAI's error shape (not the platform's: these endpoints speak OpenAI's protocol)."""

    error = OpenAIErrorObjectSerializer()


class OpenAISchema(ErrorDocumentingAutoSchema):
    """The platform's error rules (restapi/schema.py), in OpenAI's error shape."""

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = AutoSchema.get_operation(self, *args, **kwargs)
        if operation is None:
            return None
        operation_text_trim(operation)
        responses = operation.setdefault("responses", {})
        ref = self.resolve_serializer(OpenAIErrorSerializer, "response").ref
        statuses = self._error_statuses(operation)
        if self.method == "POST":
            statuses += [404, 409, 429, 500, 502, 503]
        for code in sorted(set(statuses)):
            description = {
                404: "No agent has this model name, or X-Session-Id names no session of yours.",
                409: "The session's turn waits for the results of your tools' calls "
                "(client_tools_pending): send them as tool messages; or the Idempotency-Key "
                "was used with another request (idempotency_key_reused).",
                429: "The key's request rate, or the owner's credits or budget (insufficient_quota).",
                500: "The turn failed inside the platform (turn_failed).",
                502: "No model could answer (model_unavailable, model_refused), or its answer "
                "is not valid for response_format (invalid_json).",
                503: "The session's turn is still running (session_busy), or the model is "
                "overloaded (model_overloaded); retry after Retry-After seconds.",
            }.get(code) or ERROR_DESCRIPTIONS.get(code, "")
            response: dict[str, Any] = {
                "description": description,
                "content": {"application/json": {"schema": ref}},
            }
            if code in (429, 503):
                response["headers"] = {
                    "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds."}
                }
            responses.setdefault(str(code), response)
        return operation


class OpenAIChatMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(
        choices=["system", "developer", "user", "assistant", "tool", "function"]
    )
    content = serializers.JSONField(help_text="A string or an array of text parts.")
    tool_call_id = serializers.CharField(
        required=False, help_text="A tool message: the call of your own tool it answers."
    )


class OpenAIFunctionSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[a-zA-Z0-9_-]{1,64}$")
    description = serializers.CharField(required=False)
    parameters = serializers.JSONField(required=False, help_text="A JSON Schema object.")


class OpenAIToolSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["function"])
    function = OpenAIFunctionSerializer()


class OpenAIStreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(required=False)
    include_obfuscation = serializers.BooleanField(
        required=False, help_text="Accepted; no padding is added."
    )


class OpenAIJsonSchemaSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[a-zA-Z0-9_-]{1,64}$")
    schema = serializers.JSONField(help_text="A JSON Schema (draft 2020-12) the answer must meet.")
    strict = serializers.BooleanField(required=False)
    description = serializers.CharField(required=False)


class OpenAIResponseFormatSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = OpenAIJsonSchemaSerializer(required=False)


class ChatCompletionRequestSerializer(serializers.Serializer):
    # For the schema only: the body is read by `wire.chat_request_parse`.
    """Any parameter not listed here is refused (400, naming it in `param`), except the
    defaults client libraries send (`n: 1`, penalties of 0, `logprobs: false`,
    `service_tier: "auto"`, `modalities: ["text"]`) and nulls."""

    model = serializers.CharField(help_text="An agent's slug (GET /openai/v1/models).")
    messages = OpenAIChatMessageSerializer(many=True)
    stream = serializers.BooleanField(required=False, default=False)
    stream_options = OpenAIStreamOptionsSerializer(required=False)
    tools = OpenAIToolSerializer(
        many=True,
        required=False,
        help_text="Your own tools, offered beside the agent's; a call of one comes back as "
        "tool_calls (finish_reason tool_calls), and your tool messages resume the turn.",
    )
    tool_choice = serializers.JSONField(
        required=False,
        help_text='none, auto, required, or {"type": "function", "function": {"name"}} naming '
        "one of your tools or the agent's; a forced choice holds until the turn's first tool call.",
    )
    parallel_tool_calls = serializers.BooleanField(
        required=False, help_text="false: at most one tool call per model reply."
    )
    response_format = OpenAIResponseFormatSerializer(
        required=False,
        help_text="json_object or json_schema: the answer is JSON, valid against the schema "
        "(else 502 invalid_json).",
    )
    temperature = serializers.FloatField(required=False, min_value=0, max_value=2)
    top_p = serializers.FloatField(required=False, min_value=0, max_value=1)
    max_tokens = serializers.IntegerField(
        required=False, min_value=1, help_text="Capped by the agent's model settings."
    )
    max_completion_tokens = serializers.IntegerField(required=False, min_value=1)
    stop = serializers.JSONField(required=False, help_text="A string or up to 4 strings.")
    seed = serializers.IntegerField(
        required=False, help_text="Sent where the model's wire format has it."
    )
    user = serializers.CharField(required=False, help_text="Accepted, not used.")
    safety_identifier = serializers.CharField(required=False, help_text="Accepted, not used.")
    prompt_cache_key = serializers.CharField(required=False, help_text="Accepted, not used.")
    store = serializers.BooleanField(required=False, help_text="Accepted, not used.")
    metadata = serializers.DictField(required=False, help_text="Accepted, not used.")


class OpenAIToolCallFunctionSerializer(serializers.Serializer):
    name = serializers.CharField()
    arguments = serializers.CharField(help_text="JSON text.")


class OpenAIToolCallSerializer(serializers.Serializer):
    id = serializers.CharField()
    type = serializers.CharField()
    function = OpenAIToolCallFunctionSerializer()


class OpenAIChatCompletionMessageSerializer(serializers.Serializer):
    role = serializers.CharField()
    content = serializers.CharField(allow_null=True)
    refusal = serializers.CharField(allow_null=True)
    tool_calls = OpenAIToolCallSerializer(many=True, required=False)


class OpenAIChatCompletionChoiceSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    message = OpenAIChatCompletionMessageSerializer()
    logprobs = serializers.JSONField(allow_null=True)
    finish_reason = serializers.CharField(
        help_text="stop, length (the wait ran out) or tool_calls (your own tools')"
    )


class OpenAIUsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()


class OpenAIExtensionSerializer(serializers.Serializer):
    session_id = serializers.CharField()
    status = serializers.CharField(
        help_text="finished | awaiting_approval | awaiting_user | awaiting_tool_results | "
        "waiting_timer | timeout"
    )
    stop_reason = serializers.CharField(required=False)
    approval_id = serializers.CharField(required=False)
    question = serializers.CharField(required=False)
    options = serializers.ListField(child=serializers.CharField(), required=False)


class ChatCompletionSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    created = serializers.IntegerField()
    model = serializers.CharField()
    system_fingerprint = serializers.CharField(allow_null=True)
    choices = OpenAIChatCompletionChoiceSerializer(many=True)
    usage = OpenAIUsageSerializer()
    agentplatform = OpenAIExtensionSerializer()


class OpenAIModelSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    created = serializers.IntegerField()
    owned_by = serializers.CharField()


class OpenAIModelListSerializer(serializers.Serializer):
    object = serializers.CharField()
    data = OpenAIModelSerializer(many=True)


# Views ---------------------------------------------------------------------------------


class AnyAccept(DefaultContentNegotiation):
    """OpenAI's clients send `Accept: application/json` and streaming ones
    `text/event-stream`; the answer's type follows the body's `stream`, never Accept."""

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        renderer = renderers[0]
        return renderer, renderer.media_type


class OpenAIView(APIView):
    schema = OpenAISchema()
    content_negotiation_class = AnyAccept

    def get_exception_handler(self) -> Any:
        return openai_exception_handler


def _model_object(agent: Any) -> dict[str, Any]:
    return {
        "id": agent.slug,
        "object": "model",
        "created": int(agent.created_at.timestamp()),
        "owned_by": "agentplatform",
    }


class ModelListView(OpenAIView):
    @api_docs.model_list
    @extend_schema(
        tags=["openai"], operation_id="openai_models_list", responses=OpenAIModelListSerializer
    )
    def get(self, request: Request) -> Response:
        return Response(
            {"object": "list", "data": [_model_object(a) for a in selectors.agents_for_key()]}
        )


class ModelDetailView(OpenAIView):
    @api_docs.model_retrieve
    @extend_schema(
        tags=["openai"], operation_id="openai_models_retrieve", responses=OpenAIModelSerializer
    )
    def get(self, request: Request, model: str) -> Response:
        return Response(_model_object(selectors.agent_for_model(model=model)))


# The openai SDK numbers each attempt of a call (0 first) and says how long it waits for an
# answer; it sends no key of its own, so its retries are known by these and the body.
RETRY_COUNT_HEADER = "X-Stainless-Retry-Count"
READ_TIMEOUT_HEADER = "X-Stainless-Read-Timeout"
# The SDK's longest pause between attempts (it honours a Retry-After up to 60 s).
RETRY_PAUSE_MAX_S = 60.0


def _chat_keyed(request: Request, session_id: str) -> KeyedRequest | None:
    """The request's key: the client's `Idempotency-Key`, else, from a client library that
    numbers its attempts (the openai SDK, under LangChain and the Agents SDK too), one
    derived from the body, so that its own retries find their first attempt's turn. A
    derived key matches only a first attempt recent enough to be this call's: within the
    attempts' waits and pauses since."""
    fingerprint = request_fingerprint(request.method, request.path, request.data, session_id)
    key = request_key_parse(request.headers.get(IDEMPOTENCY_HEADER))
    if key is not None:
        return KeyedRequest(key=key, fingerprint=fingerprint)
    count = (request.headers.get(RETRY_COUNT_HEADER) or "").strip()
    if not count.isdigit():
        return None
    try:
        read_timeout = float(request.headers.get(READ_TIMEOUT_HEADER) or "")
    except ValueError:
        read_timeout = settings.OPENAI_MAX_WAIT_S
    if not 0 < read_timeout <= settings.OPENAI_MAX_WAIT_S:
        read_timeout = settings.OPENAI_MAX_WAIT_S
    retries = min(int(count), 100)
    return KeyedRequest(
        key=f"{IDEMPOTENCY_DERIVED_PREFIX}{fingerprint}",
        fingerprint=fingerprint,
        window_s=retries * (read_timeout + RETRY_PAUSE_MAX_S),
        first=retries == 0,
    )


class ChatCompletionView(OpenAIView):
    key_grants_checked = ("POST",)  # a session's role the key does not hold (403)

    # A request without X-Session-Id is stateless, as OpenAI's API is: its session is
    # ephemeral and not counted as one created, so clients that never send the header
    # (LangChain, the Agents SDK) are limited by the request rate alone.
    throttle_classes = [ApiKeyRateThrottle]

    @api_docs.chat_completion_create
    @extend_schema(
        tags=["openai"],
        request=ChatCompletionRequestSerializer,
        parameters=[
            OpenApiParameter(
                SESSION_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="Continue this session (the response always names its session here).",
            ),
            IDEMPOTENCY_KEY_PARAMETER,
        ],
        operation_id="openai_chat_completions_create",
        responses={
            (200, "application/json"): OpenApiResponse(
                ChatCompletionSerializer,
                description="A chat.completion; with stream=true, text/event-stream of "
                "`data: <chat.completion.chunk>` events ending with `data: [DONE]`.",
            ),
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR, description="stream=true: server-sent events."
            ),
        },
    )
    def post(self, request: Request) -> DeferredResponse:
        """One turn of an agent: the last user message is its input; or the client's
        results of its own tools' calls (trailing `tool` messages), and the turn that
        made them goes on.

        1. Read the body (400), find the agent named by `model` (404) and, with
           X-Session-Id, the caller's session (404; 400 when it runs another agent,
           unless the request brings the results of its open calls to another agent: the
           client's own handoff); tool results without it find the session whose turn
           waits for those calls.
           The client's own tools may not take the name of one of the agent's (400).
        2. Refuse when the owner's credits cannot pay for a model call (429).
        3. Without X-Session-Id, open a session seeded with the earlier messages.
        4. Join the session's channel group, then post the turn or the results (503
           while a turn runs). A request with a key (`Idempotency-Key`, or the openai
           SDK's attempt numbers: `_chat_keyed`) whose first request's turn stands joins
           that turn instead (`services.chat_request_claim`): a retry runs nothing again.
        5. Answer from the loop once the turn's outcome decides the status (relay.TurnAnswer).
        """
        chat = chat_request_parse(request.data)
        agent = selectors.agent_for_model(model=chat.model)
        owner = request.user
        key_roles = list(getattr(request.auth, "roles", None) or [])
        session_id = request.headers.get(SESSION_HEADER, "").strip()
        keyed = _chat_keyed(request, session_id)
        handoff_to = ""
        if not session_id and chat.tool_results:
            waiting = selectors.session_waiting_for(
                owner_id=owner.pk, call_ids=[r.call_id for r in chat.tool_results]
            )
            if waiting is None:
                raise InvalidInput(
                    "no turn of yours waits for the results of these tool calls "
                    "(send X-Session-Id to name its session)",
                    details={"field": "messages"},
                    code="invalid_request",
                )
            session_id = str(waiting)
        if session_id:
            try:
                session = session_get_for_owner(session_id=session_id, owner_id=owner.pk)
            except NotFound:
                raise NotFound(
                    f"session {session_id} not found", code="session_not_found"
                ) from None
            if session.agent_id != agent.pk:
                # After a handoff the client may name any agent the conversation went through.
                chain = selectors.session_agent_chain(session=session)
                if chat.model in chain:
                    agent = session.agent  # the agent that answers now
                elif chat.tool_results:
                    # The client's own handoff (the Agents SDK's between two platform
                    # agents): its results go to the turn, and the agent it names goes on.
                    handoff_to = agent.slug
                else:
                    raise InvalidInput(
                        f"session {session.pk} runs the model '{session.agent.slug}' (its "
                        f"handoffs: {', '.join(sorted(chain))}), not '{chat.model}'",
                        details={"field": "model"},
                    )
        choice = services.client_tools_check(
            agent_id=agent.pk,
            tools=chat.options.get("tools", []),
            tool_choice=chat.options.get("tool_choice"),
        )
        if choice is not None:
            chat.options["tool_choice"] = choice
        check = credits_cover(owner_id=owner.pk, points=1)
        if check.outcome == "insufficient":
            raise services.CreditsExhausted(
                f"You exceeded your credits ({check.reason}): {check.points_left} points left."
            )
        joined: list[TurnFrames] = []
        known = session.pk if session_id else None

        def start() -> services.TurnPosted:
            target = known
            if target is None:
                target = services.chat_session_create(
                    owner=owner,
                    key_roles=key_roles,
                    agent_slug=agent.slug,
                    history=chat.history,
                    content=chat.content,
                    ephemeral=True,
                    api_key_id=getattr(request.auth, "pk", None),
                ).pk
            frames = TurnFrames.join(target)
            joined.append(frames)
            if chat.tool_results:
                return services.chat_tool_results_post(
                    session_id=target,
                    owner_id=owner.pk,
                    key_roles=key_roles,
                    results=chat.tool_results,
                    options=chat.options,
                    handoff_to=handoff_to,
                )
            return services.chat_turn_post(
                session_id=target,
                owner_id=owner.pk,
                key_roles=key_roles,
                content=chat.content,
                options=chat.options,
            )

        claim: services.ChatClaim | None = None
        try:
            if keyed is None:
                posted = start()
            else:
                claim = services.chat_request_claim(owner_id=owner.pk, keyed=keyed, start=start)
                posted = claim.posted
                if claim.reattached:
                    joined.append(TurnFrames.join(posted.session_id))
        except BaseException:
            for frames in joined:
                frames.leave_sync()
            raise
        frames = joined[-1]
        turn = Turn(
            posted=posted,
            chat=chat,
            owner_id=owner.pk,
            model=agent.slug,
            actor=f"openai:{owner}",
            wait_s=min(agent.turn_timeout_s + 30, settings.OPENAI_MAX_WAIT_S),
            claim=claim,
        )
        # The status waits for the turn (200, or 502/503 when no model could answer),
        # decided on the event loop: the request's thread and connection are free meanwhile.
        response = DeferredResponse(
            TurnAnswer(frames, turn),
            content_type="text/event-stream" if chat.stream else "application/json",
        )
        response[SESSION_HEADER] = str(posted.session_id)
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass chunks on as they come
        return response


__all__ = ["ChatCompletionView", "ErrorBody", "ModelDetailView", "ModelListView"]

"""REST edge: translate HTTP into service calls and back; no business logic here."""

from typing import Any
from urllib.parse import urlencode

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.throttling import ApiKeyRateThrottle, SessionCreateThrottle
from record.errors import InvalidInput
from restapi.renderers import SvgRenderer

from .. import selectors, services
from . import docs
from .serializers import (
    AgentSerializer,
    CancelResultSerializer,
    CheckpointSerializer,
    EventSerializer,
    ForkSerializer,
    MessageCreateSerializer,
    MessageSerializer,
    SessionCreateSerializer,
    SessionDetailSerializer,
    SessionSerializer,
)


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(
            f"{name} must be an integer; got {raw!r}", details={"field": name}
        ) from None
    if not low <= value <= high:
        raise InvalidInput(
            f"{name} must be between {low} and {high}; got {value}", details={"field": name}
        )
    return value


def _bool_param(request: Request, name: str) -> bool:
    raw = (request.query_params.get(name) or "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidInput(f"{name} must be true or false; got {raw!r}", details={"field": name})
    return raw in ("true", "1")


def _key_roles(request: Request) -> list[str]:
    return list(getattr(request.auth, "roles", None) or [])


def _key_prefix(request: Request) -> str:
    """The presenting key's prefix, for the audit trail."""
    return str(getattr(request.auth, "prefix", "") or "")


def _key_value_max(request: Request) -> float | None:
    """The highest session value an operator granted the caller's key (None: none granted)."""
    return getattr(request.auth, "max_value", None)


def _keyed(request: Request, key: str | None, *body: Any) -> "services.KeyedRequest | None":
    """The request's key with the fingerprint of what it asks (its path and body)."""
    if key is None:
        return None
    return services.KeyedRequest(
        key=key, fingerprint=services.request_fingerprint(request.method, request.path, *body)
    )


def _keyed_response(answer: "services.KeyedResponse") -> Response:
    """A retry's answer is the first one's body, with 200 (nothing new was done)."""
    if not answer.replayed:
        return Response(answer.body, status=answer.status)
    response = Response(answer.body, status=status.HTTP_200_OK)
    response["Idempotent-Replayed"] = "true"
    return response


class SessionListView(APIView):
    throttle_classes = [ApiKeyRateThrottle, SessionCreateThrottle]  # POST only: creating sessions
    key_grants_checked = ("POST",)  # a value above the key's grant (403, schema.py)

    @docs.session_list
    @extend_schema(
        responses=SessionSerializer(many=True),
        parameters=[
            OpenApiParameter("limit", int),
            OpenApiParameter(
                "ephemeral",
                bool,
                description="Include the ephemeral sessions of stateless OpenAI-compatible "
                "requests (left out by default).",
            ),
            OpenApiParameter(
                "before",
                str,
                description='The next page: the cursor a `Link: <...>; rel="next"` header '
                "gave (sessions older than the last one of the page before).",
            ),
        ],
    )
    def get(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 20, 1, 200)
        ephemeral = _bool_param(request, "ephemeral")
        rows = list(
            selectors.session_list_for_owner(
                owner_id=request.user.pk,
                ephemeral=ephemeral,
                before=request.query_params.get("before") or None,
            )[: limit + 1]
        )
        response = Response(SessionSerializer(rows[:limit], many=True).data)
        if len(rows) > limit:
            params = {"limit": limit, "before": selectors.session_cursor(rows[limit - 1])}
            if ephemeral:
                params["ephemeral"] = "true"
            response["Link"] = f'<{request.path}?{urlencode(params)}>; rel="next"'
        return response

    @docs.session_create
    @extend_schema(request=SessionCreateSerializer, responses={201: SessionSerializer})
    def post(self, request: Request) -> Response:
        payload = SessionCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = payload.validated_data
        session = services.session_create(
            owner=request.user,
            agent_slug=data["agent"],
            key_roles=_key_roles(request),
            role=data.get("role") or None,
            metadata=data.get("metadata") or {},
            value=data.get("value"),
            value_max=_key_value_max(request),
            api_key_id=getattr(request.auth, "pk", None),
            webhook=data.get("webhook"),
        )
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @docs.session_retrieve
    @extend_schema(responses=SessionDetailSerializer)
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        return Response(SessionDetailSerializer(session).data)


class SessionMessagesView(APIView):
    key_grants_checked = ("POST",)  # a session's role the key does not hold (403, schema.py)

    @docs.message_list
    @extend_schema(
        responses=MessageSerializer(many=True),
        parameters=[
            OpenApiParameter("limit", int),
            OpenApiParameter(
                "before",
                int,
                description="Messages before this seq (the older page a "
                '`Link: <...>; rel="next"` header names).',
            ),
        ],
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        limit = _int_param(request, "limit", 20, 1, 1000)
        before = _int_param(request, "before", 0, 1, 2**31 - 1) or None
        rows = selectors.message_history(session=session, limit=limit + 1, before=before)
        page = rows[-limit:]
        response = Response(MessageSerializer(page, many=True).data)
        if len(rows) > limit:
            # Oldest first within a page; the next page holds the older messages (a page of
            # messages still waiting for their turn is followed by every numbered one).
            seqs = [m.seq for m in page if m.seq is not None]
            first = min(seqs) if seqs else session.message_seq + 1
            response["Link"] = f'<{request.path}?before={first}&limit={limit}>; rel="next"'
        return response

    @docs.message_create
    @extend_schema(
        request=MessageCreateSerializer, responses={202: MessageSerializer, 200: MessageSerializer}
    )
    def post(self, request: Request, session_id: str) -> Response:
        try:
            payload = MessageCreateSerializer(data=request.data)
            payload.is_valid(raise_exception=True)
        except Exception:
            # A missing session is a 404 whatever the body, as it always was.
            selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
            raise
        data = payload.validated_data
        key = services.request_key_parse(
            request.headers.get(services.IDEMPOTENCY_HEADER), data.get("idempotency_key")
        )

        def post() -> tuple[int, Any]:
            # The ownership check is the service's locking SELECT: one query, not two.
            posted = services.message_post_for_owner(
                session_id=session_id,
                owner_id=request.user.pk,
                key_roles=_key_roles(request),
                content=data["content"],
                idempotency_key=key,
                extra_context=data.get("extra_context"),
                webhook=data.get("webhook"),
            )
            code = status.HTTP_202_ACCEPTED if posted.created else status.HTTP_200_OK
            return code, MessageSerializer(posted.message).data

        # A webhook is part of what is asked (the fingerprint without one is as it was).
        hook = [data["webhook"]] if "webhook" in data else []
        keyed = _keyed(request, key, data["content"], data.get("extra_context"), *hook)
        return _keyed_response(
            services.request_keyed_respond(owner_id=request.user.pk, keyed=keyed, run=post)
        )


class SessionEventsView(APIView):
    @docs.event_list
    @extend_schema(
        responses=EventSerializer(many=True),
        parameters=[OpenApiParameter("after", int), OpenApiParameter("limit", int)],
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        after = _int_param(request, "after", 0, 0, 2**31 - 1)
        limit = _int_param(request, "limit", 500, 1, 1000)
        page = selectors.events_page(session_id=session.pk, after=after, limit=limit)
        response = Response(EventSerializer(page.events, many=True).data)
        if page.more:
            # A page ends at `limit` events or EVENTS_PAGE_MAX_BYTES: a short page is not
            # the end, this link is (the cursor is the last seq, as always).
            next_after = page.events[-1].seq
            response["Link"] = f'<{request.path}?after={next_after}&limit={limit}>; rel="next"'
        return response


class SessionCancelView(APIView):
    @docs.session_cancel
    @extend_schema(request=None, responses=CancelResultSerializer)
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        cancelled = services.session_cancel(
            session=session, actor=f"api:{request.user}", key_prefix=_key_prefix(request)
        )
        session.refresh_from_db()
        return Response({"cancelled": cancelled, "session": SessionSerializer(session).data})


class SessionForkView(APIView):
    throttle_classes = [ApiKeyRateThrottle, SessionCreateThrottle]  # a fork is a new session
    key_grants_checked = ("POST",)  # a session's role the key does not hold (403, schema.py)

    @docs.session_fork
    @extend_schema(request=ForkSerializer, responses={201: SessionSerializer})
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        payload = ForkSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        fork = services.session_fork(
            session=session,
            step=payload.validated_data["checkpoint"],
            actor=f"api:{request.user}",
            role=payload.validated_data.get("role") or None,
            key_roles=_key_roles(request),
            key_prefix=_key_prefix(request),
        )
        return Response(SessionSerializer(fork).data, status=status.HTTP_201_CREATED)


class SessionResumeView(APIView):
    key_grants_checked = ("POST",)  # a session's role the key does not hold (403, schema.py)

    @docs.session_resume
    @extend_schema(request=None, responses=SessionSerializer)
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        resumed = services.session_resume(
            session=session,
            actor=f"api:{request.user}",
            key_roles=_key_roles(request),
            key_prefix=_key_prefix(request),
        )
        resumed.refresh_from_db()
        return Response(SessionSerializer(resumed).data)


class SessionCheckpointsView(APIView):
    @docs.checkpoint_list
    @extend_schema(
        responses=CheckpointSerializer(many=True), parameters=[OpenApiParameter("limit", int)]
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        limit = _int_param(request, "limit", 100, 1, 1000)
        rows = selectors.checkpoints_of(session=session, limit=limit)
        return Response(CheckpointSerializer(rows, many=True).data)


class SessionGraphView(APIView):
    # The drawing for a client that asks for SVG (or anything), JSON for one that asks for it.
    renderer_classes = [SvgRenderer, JSONRenderer]

    @docs.session_graph
    @extend_schema(
        responses={(200, "image/svg+xml"): OpenApiTypes.STR},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get_for_owner(session_id=session_id, owner_id=request.user.pk)
        return Response(selectors.workflow_run_graph(session=session))


class AgentListView(APIView):
    @docs.agent_list
    @extend_schema(responses=AgentSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(AgentSerializer(selectors.agents_listed(), many=True).data)

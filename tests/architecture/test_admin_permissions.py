"""View permission never changes anything, and never shows what people said.

The walk is driven by the admin site's registry, so a page registered later is walked too:
every ModelAdmin's actions (its own and the site's), and every URL of `get_urls()` (Django's
pages and the custom ones: the approvals queue, a session's cancel and operator controls, a
credit account's points). A staff user holding only view permissions (and approver rights,
so that only the permission stands between them and a decision) GETs and POSTs each one
against rows of their own tenant; the database and the breakers must be as they were, no
action is offered, and a custom URL answers POST with 403 (or 405).
"""

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.contrib.sessions.models import Session as DjangoSession
from django.db import connection
from django.db.models import Model
from django.test import Client, RequestFactory
from django.urls import URLPattern, reverse
from django.utils import timezone

from accounts.models import Role
from accounts.services import api_key_create, approver_grant
from approvals.models import Approval
from audit.models import AuditEntry
from billing.models import CreditPool, KeyBudget, OwnerBudget, PoolRequest, SpendNotice
from billing.notices import billing_today
from billing.services import credits_grant
from demo.models import Customer, Notification, Order, Report
from engine import session_run
from hooks.models import Schedule, ScheduleFire, WebhookDelivery
from llm.types import ChatMessage, ChatRequest, ChatResponse
from memory.models import EmbeddingEndpoint, MemoryItem, MemoryOwnerIndex
from observability.prompts import prompt_sample_record
from record.models import Session
from runtime.breaker import model_breaker
from sessions.services import approval_decide, message_post
from tests.factories import (
    AgentFactory,
    EvaluationFactory,
    ModelEndpointFactory,
    StaffUserFactory,
    ToolFactory,
)
from tests.fakes.mcp_fixtures import free_port
from tools.models import McpServer
from tools.registry import tool_handler
from workflows.selectors import definition_check
from workflows.services import workflow_apply

# The engine runs the tools on helper threads with their own connections: they must see commits.
pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "SECRET-4711"
# Values for the parameters of admin URLs; a URL with any other parameter fails the walk
# until it is named here (so that a new page is walked with real values, not skipped).
OBJECT_PARAMS = {"object_id", "pk", "id"}
WORD_PARAMS = {"action": ["grant", "adjust"]}
# What a POST handler of the admin may read as its "action"; each is sent to every custom URL.
ACTION_WORDS = [
    "approve", "reject", "reject_selected", "review", "withdraw", "change", "resume",
    "force_finish", "reply", "run_tool", "hand_back", "fork", "grant", "adjust", "cancel",
]  # fmt: skip
STANDARD_PAGES = ("changelist", "add", "history", "delete", "change")
# Pages that show what people said by design, to rights other than a model permission.
SHOWS_CONTENT_BY_DESIGN = {
    # An approver decides on the call's arguments and the last messages (approver rights).
    "approvals_approval_queue",
}

GATE_EFFECTS: list[str] = []


@tool_handler("tests.admin_walk.gate")
def gate(code: str) -> dict[str, str]:
    GATE_EFFECTS.append(code)
    return {"code": code}


RULES = [
    {"when": {"user": "^gate (\\S+)", "last_tool": None},
     "tool_calls": [{"tool": "gate", "args": {"code": "{{ match.1 }}"}}]},
    {"when": {"last_tool": "gate"}, "answer": "Gated"},
    {"answer": "Noted: {{ user }}"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)


def _ran(agent: Any, owner: Any, content: str) -> Session:
    session = Session.objects.create(agent=agent, owner=owner, role="support")
    message_post(session=session, content=content)
    session_run(session_id=session.pk)
    return Session.objects.get(pk=session.pk)


@pytest.fixture
def world(settings) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A row of every model the admin lists, the sessions in the states each control acts
    on, all owned by the viewer's tenant; the model endpoint's breaker open."""
    # Open for the whole walk: with the default 30 s cooldown a slow machine saw it turn
    # half-open by itself before the end, which is not a change the viewer made.
    settings.MODEL_BREAKER_COOLDOWN_S = 3600
    # The viewer owns the sessions and approves for their group: with four eyes on, that
    # alone would refuse their decisions; off, only the permission stands in the way.
    settings.APPROVAL_FOUR_EYES = False
    viewer = StaffUserFactory(username="viewer")
    endpoint = ModelEndpointFactory(name="rules", api="rules", options={})
    ToolFactory(
        name="gate", handler="tests.admin_walk.gate", requires_approval=True, side_effects=True,
        parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    )  # fmt: skip
    agent = AgentFactory(slug="walk", model=endpoint, tools=["gate"], rules=RULES)
    waiting = _ran(agent, viewer, f"gate {SECRET}")
    # A decision another approver made, its call not run yet: one a viewer must not take back.
    decided = _ran(agent, viewer, "gate later")
    boss = StaffUserFactory(username="boss")
    approver_grant(username=boss.username)
    approval_decide(
        approval_id=Approval.objects.get(session=decided).pk, approve=True, user=boss,
        groups=["approvers"],
    )  # fmt: skip
    assert Session.objects.get(pk=decided.pk).state == "tool_wait"
    finished = _ran(agent, viewer, f"hello {SECRET}")
    failed = _ran(agent, viewer, f"hello again {SECRET}")
    Session.objects.filter(pk=failed.pk).update(state="error", last_error="boom")
    assert (waiting.state, finished.state) == ("awaiting_approval", "finished")

    api_key_create(username=viewer.username, roles=["support"])
    Role.objects.get_or_create(name="support")
    approver_grant(username=viewer.username)
    MemoryItem.objects.create(owner=viewer, subject=f"pin {SECRET}", content=f"My PIN is {SECRET}")
    MemoryOwnerIndex.objects.create(owner=viewer, dims=16, name="memory_owner_walk", state="ready")
    EmbeddingEndpoint.objects.create(
        name="walk", base_url="http://127.0.0.1:9/v1", model="m", dimension=16
    )
    prompt_sample_record(
        session_id=waiting.pk, owner_id=viewer.pk, turn=1, iteration=1, endpoint="rules", model="m", trace_id="",
        request=ChatRequest(messages=(ChatMessage(role="user", content=f"prompt {SECRET}"),)),
        response=ChatResponse(text=f"answer {SECRET}"), input_tokens=1, output_tokens=1,
    )  # fmt: skip
    McpServer.objects.create(name="down", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=1)
    credits_grant(owner_id=viewer.pk, points=100, actor="test")
    OwnerBudget.objects.create(owner=viewer, turn_tokens=1000)
    KeyBudget.objects.create(
        api_key=api_key_create(username=viewer.username, roles=["support"]).api_key,
        owner=viewer,
        cost=1,
    )
    SpendNotice.objects.create(
        kind="budget", subject=f"owner:{viewer.pk}:day", threshold=80, owner=viewer,
        period_start=billing_today(), period_end=billing_today() + timedelta(days=1),
        message=f"owner day budget of owner {viewer.pk}: 80 % reached",
    )  # fmt: skip
    pool = CreditPool.objects.create(name="walk", owner=viewer, size=10)
    PoolRequest.objects.create(
        key="pool:walk", pool=pool, owner=viewer, session_id=waiting.pk, action="gate",
        value=2.0, cost=5, roi=0.4, status="waiting",
    )  # fmt: skip
    customer = Customer.objects.create(name="Ann", email="ann@example.com")
    order = Order.objects.create(
        number="A1", customer=customer, placed_at="2026-01-01T00:00:00Z", amount=10
    )
    Notification.objects.create(customer=customer, order=order, message="hi", idempotency_key="n1")
    Report.objects.create(title="t", body="b", idempotency_key="r1")
    Group.objects.create(name="ops")
    EvaluationFactory(owner=viewer, agent=agent, candidate={"model": "rules"})
    workflow_raw = {
        "slug": "walk-flow", "role": "support", "start": "look",
        "nodes": {"look": {"kind": "tool", "tool": "gate", "args": {"code": "'x'"}, "next": "end"}},
    }  # fmt: skip
    workflow_apply(
        definition=definition_check(workflow_raw, where="walk"), where="walk", default_model="rules"
    )

    schedule = Schedule.objects.create(
        name="walk", cron="0 2 * * *", agent="walk", message="hi", owner=viewer,
        next_due_at=timezone.now() + timedelta(days=1),
    )  # fmt: skip
    ScheduleFire.objects.create(
        schedule=schedule, due=timezone.now(), status="started", session=finished
    )
    WebhookDelivery.objects.create(session=finished, turn=1, url="https://app.example/h")

    # The walk reaches the viewer's own rows: the audit entries about another user (the
    # boss's approver rights) are that user's and a superuser's.
    AuditEntry.objects.exclude(owner=viewer).exclude(user=viewer).delete()

    breaker = model_breaker()
    for _ in range(breaker.threshold):
        breaker.record_failure(endpoint.name)
    assert breaker.state(endpoint.name).state == "open"
    GATE_EFFECTS.clear()
    try:
        yield {"viewer": viewer, "sessions": [waiting, finished, failed], "endpoint": endpoint}
    finally:
        breaker.reset(endpoint.name)


def _view_permissions(*, content: bool) -> list[Permission]:
    """Every model's view permission; with `content`, also every other view_* one (the
    content permissions)."""
    every = Permission.objects.filter(codename__startswith="view_").select_related("content_type")
    return [p for p in every if content or p.codename == f"view_{p.content_type.model}"]


def _tables() -> list[str]:
    """The table of every managed model, with the many-to-many tables Django makes (Django's
    own session table aside: logging in writes it)."""
    tables = {
        model._meta.db_table
        for model in apps.get_models(include_auto_created=True)
        if model._meta.managed and not model._meta.proxy and model is not DjangoSession
    }
    return sorted(tables)


def _snapshot() -> dict[str, str]:
    """A digest of every row of every table, per table, in one round trip: the walk compares
    it after each handler, so it must be cheap (the rows themselves took 7 s a walk)."""
    quote = connection.ops.quote_name
    tables = _tables()
    parts = [
        f"SELECT %s, md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), '')) "
        f"FROM {quote(table)} r"
        for table in tables
    ]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), tables)
        return dict(cursor.fetchall())


def _pks(model: type[Model]) -> list[str]:
    # An unmanaged model (the workers page) has no table: its page reads Redis.
    if not model._meta.managed:
        return []
    return [str(pk) for pk in model._base_manager.order_by("pk").values_list("pk", flat=True)]


def _registry() -> list[tuple[type[Model], admin.ModelAdmin]]:
    return sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)


def _secret_pks(model: type[Model]) -> set[str]:
    """The rows that hold what people said (the SECRET), in one query."""
    if not model._meta.managed:
        return set()
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.{quote(model._meta.pk.column)}::text FROM {quote(model._meta.db_table)} r "
            "WHERE r::text LIKE %s",
            [f"%{SECRET}%"],
        )
        return {row[0] for row in cursor.fetchall()}


def _pattern_urls(model: type[Model], model_admin: admin.ModelAdmin) -> list[tuple[str, str, bool]]:
    """(name, url, custom) for each URL of the ModelAdmin, each parameter filled.

    A custom page is walked on every row (it acts on a row by its state: a session waiting,
    finished, failed); so are Django's pages of a model that has custom ones. The other
    models' rows differ in their data only: Django's pages are walked on the first row and
    on each row that holds the SECRET (what the leak check reads). Walking every row of
    every model was 1,241 requests, most of them the same page of another event or
    checkpoint."""
    opts = model._meta
    base = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    pks = _pks(model)
    patterns = []
    for pattern in model_admin.get_urls():
        assert isinstance(pattern, URLPattern), pattern
        name = pattern.name or ""
        custom = bool(name) and not any(
            name == f"{opts.app_label}_{opts.model_name}_{page}" for page in STANDARD_PAGES
        )
        patterns.append((pattern, name, custom))
    if any(custom for _, _, custom in patterns):
        standard_pks = pks
    else:
        secret = _secret_pks(model)
        standard_pks = [pk for i, pk in enumerate(pks) if i == 0 or pk in secret]
    urls = []
    for pattern, name, custom in patterns:
        route = str(pattern.pattern)
        params = re.findall(r"<(?:\w+:)?(\w+)>", route)
        unknown = set(params) - OBJECT_PARAMS - set(WORD_PARAMS)
        assert not unknown, f"{name or route}: tell the walk how to fill {unknown}"
        fillings: list[dict[str, str]] = [{}]
        for param in params:
            if param in OBJECT_PARAMS:
                values = pks if custom else standard_pks
            else:
                values = WORD_PARAMS[param]
            fillings = [{**f, param: v} for f in fillings for v in values]
        for filling in fillings:
            path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m, f=filling: f[m.group(1)], route)
            urls.append((name or route, base + path, custom))
    return urls


def _post_bodies() -> list[dict[str, Any]]:
    approvals = [str(pk) for pk in Approval.objects.values_list("pk", flat=True)]
    decided = [
        str(pk) for pk in Approval.objects.exclude(status="pending").values_list("pk", flat=True)
    ]
    common = {
        "id": approvals[0], "ids": approvals, "content": "x", "tool": "gate",
        "arguments": '{"code": "x"}', "answer": "took_effect", "result": "{}", "comment": "x",
        "points": "5", "note": "x", "confirm": "yes", "post": "yes", "_save": "Save",
    }  # fmt: skip
    # A decision is taken back from a decided approval; the others act on a pending one.
    taken_back = {"withdraw", "change"}
    return [
        {},
        *(
            {**common, "action": word, **({"id": decided[0]} if word in taken_back else {})}
            for word in ACTION_WORDS
        ),
    ]


def _viewer_request(viewer: Any) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = viewer
    return request


@pytest.mark.parametrize("content", [False, True], ids=["model-views", "every-view"])
def test_a_view_only_staff_user_changes_nothing_anywhere_in_the_admin(
    world: dict[str, Any], content: bool
) -> None:
    """With every view permission (`every-view`) the viewer GETs and POSTs everything; with
    the models' view permissions alone (`model-views`, a subset of those) it GETs every page,
    for what a page shows. The subset does not POST again: a handler that would let the
    smaller set of view permissions write lets the larger one write too, and the POSTs are
    two thirds of the walk's time."""
    viewer = world["viewer"]
    viewer.user_permissions.set(_view_permissions(content=content))
    viewer = type(viewer).objects.get(pk=viewer.pk)  # no cached permissions
    client = Client()
    client.force_login(viewer)
    request = _viewer_request(viewer)
    before = _snapshot()
    missing = [
        m._meta.label for m, _ in _registry() if m._meta.managed and not m._base_manager.exists()
    ]
    assert not missing, f"give the walk a row of {missing}"

    walked, leaks, changed_by = 0, [], []

    def check(what: str) -> None:
        if _snapshot() != before:
            changed_by.append(what)

    assert client.get("/admin/").status_code == 200
    for model, model_admin in _registry():
        # No action is offered to view permissions alone, nor may they add, change or delete.
        assert model_admin.get_actions(request) == {}, (model, model_admin.get_actions(request))
        pks = _pks(model)
        row = model._base_manager.get(pk=pks[0]) if pks else None
        for may in ("add", "change", "delete"):
            args = () if may == "add" else (row,)
            assert not getattr(model_admin, f"has_{may}_permission")(request, *args), (model, may)

        changelist = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for _func, name, _label in model_admin._get_base_actions() if content else ():
            response = client.post(
                changelist,
                {"action": name, "_selected_action": pks, "index": 0, "confirm": "yes", "post": "yes"},
            )  # fmt: skip
            assert response.status_code in (200, 302, 403), (name, response.status_code)
            walked += 1
        check(f"the actions of {model._meta.label}")

        for name, url, custom in _pattern_urls(model, model_admin):
            response = client.get(url)
            assert response.status_code < 500, (url, response.status_code)
            change_page = f"{model._meta.app_label}_{model._meta.model_name}_change"
            if name == change_page and model_admin.has_view_permission(request):
                # The walk reaches the rows (its own tenant's): not a walk of 404s.
                assert response.status_code == 200, (url, response.status_code)
            body = response.content.decode(errors="replace")
            shown = response.status_code == 200 and name not in SHOWS_CONTENT_BY_DESIGN
            if shown and not content and SECRET in body:
                leaks.append(url)
            walked += 1
            bodies = _post_bodies() if custom else [{"post": "yes", "_save": "Save"}]
            for data in bodies if content else ():
                response = client.post(url, data)
                if custom:
                    assert response.status_code in (403, 405), (url, data, response.status_code)
                assert response.status_code < 500, (url, data, response.status_code)
                walked += 1
            # Custom handlers one by one (each may write); Django's pages per model.
            if custom:
                check(f"{name} {url}")
        check(f"the pages of {model._meta.label}")

    assert not changed_by, f"first changed by {changed_by[0] if changed_by else ''}"
    assert GATE_EFFECTS == []  # no tool ran by hand, no approved call ran
    assert model_breaker().state(world["endpoint"].name).state == "open"
    assert not leaks, leaks
    assert walked > 200, walked


def test_every_admin_action_declares_a_permission_beyond_view() -> None:
    """Django offers an action that declares no permission to anyone who may view the list."""
    undeclared = []
    for model, model_admin in _registry():
        for func, name, _label in model_admin._get_base_actions():
            needs = set(getattr(func, "allowed_permissions", ()))
            if not needs or needs <= {"view"}:
                undeclared.append(f"{model._meta.label}.{name}")
            for perm in needs:
                assert callable(getattr(model_admin, f"has_{perm}_permission", None)), (name, perm)
    assert undeclared == []


def test_the_walk_would_catch_an_action_without_a_permission(world: dict[str, Any]) -> None:
    """The check above is not vacuous: an action declared the old way is offered to a viewer."""
    viewer = world["viewer"]
    viewer.user_permissions.set(_view_permissions(content=False))
    viewer = type(viewer).objects.get(pk=viewer.pk)
    model_admin = admin.site._registry[MemoryItem]

    @admin.action(description="Erase (no permission declared)")
    def erase_undeclared(modeladmin: Any, request: Any, queryset: Any) -> None:
        queryset.delete()

    model_admin.actions = (*model_admin.actions, erase_undeclared)
    try:
        offered = model_admin.get_actions(_viewer_request(viewer))
        assert set(offered) == {"erase_undeclared"}
        client = Client()
        client.force_login(viewer)
        pks = [str(pk) for pk in MemoryItem.objects.values_list("pk", flat=True)]
        client.post(
            reverse("admin:memory_memoryitem_changelist"),
            {"action": "erase_undeclared", "_selected_action": pks, "index": 0},
        )
        assert not MemoryItem.objects.exists()  # what the walk's snapshot would catch
    finally:
        del model_admin.actions  # the class's own again


def test_the_owner_filter_names_owners_only_to_who_may_view_users(world: dict[str, Any]) -> None:
    viewer = world["viewer"]
    other = StaffUserFactory(username=f"bystander-{uuid.uuid4().hex[:6]}")
    viewer.user_permissions.set(_view_permissions(content=False))
    client = Client()
    client.force_login(viewer)
    url = reverse("admin:agent_sessions_session_changelist")
    viewer.user_permissions.remove(Permission.objects.get(codename="view_user"))
    page = client.get(url).content.decode()
    assert "By owner" not in page and other.username not in page
    # The filter still works from a link.
    assert client.get(url, {"owner__id__exact": viewer.pk}).status_code == 200

    # Who may view users (a superuser here, who sees every tenant) gets the owners of the
    # sessions they see, and no one else.
    Session.objects.create(
        agent=world["sessions"][0].agent, owner=StaffUserFactory(username="second")
    )
    root = StaffUserFactory(username="root", is_superuser=True)
    client.force_login(root)
    page = client.get(url).content.decode()
    assert "By owner" in page and "second" in page and other.username not in page

"""Tool definitions as data: the read-only listing for the caller's roles, checks when saved."""

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from configuration.services import config_apply
from tests.demo_setup import DEMO_CONFIG
from tests.factories import ToolFactory, api_key_for
from tools.models import Tool
from tools.selectors import tools_for_roles

pytestmark = pytest.mark.django_db

URL = "/api/v1/tools/"
FIELDS = {
    "name", "description", "parameters", "result_description", "kind", "timeout_s",
    "side_effects", "requires_approval", "risk_level", "roles", "credit_cost",
}  # fmt: skip


def _client(roles: tuple[str, ...], username: str = "caller") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_for(username, roles)}")
    return client


@pytest.fixture
def tools() -> None:
    ToolFactory(name="open_to_all", roles=[])
    ToolFactory(name="support_only", roles=["support"])
    ToolFactory(name="analyst_only", roles=["analyst"])
    ToolFactory(name="shared", roles=["support", "analyst"])
    ToolFactory(name="admin_only", roles=["admin"])
    ToolFactory(name="switched_off", roles=["support"], enabled=False)


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        (("support",), ["open_to_all", "shared", "support_only"]),
        (("analyst",), ["analyst_only", "open_to_all", "shared"]),
        (("support", "analyst"), ["analyst_only", "open_to_all", "shared", "support_only"]),
        ((), ["open_to_all"]),
        (("guest",), ["open_to_all"]),
    ],
)
def test_the_listing_shows_only_the_callers_roles_tools_and_open_ones(tools, roles, expected):
    response = _client(roles).get(URL)
    assert response.status_code == 200, response.content
    assert [t["name"] for t in response.json()] == expected
    assert [t.name for t in tools_for_roles(roles=list(roles))] == expected


def test_the_listing_describes_each_tool_without_how_it_runs(tools):
    ToolFactory(
        name="issue_coupon", kind="http", handler="", url="http://127.0.0.1:9/coupons", roles=["support"],
        headers={"Authorization": {"env": "TOOL_SECRET_COUPON_API_TOKEN"}}, side_effects=True, requires_approval=True,
        risk_level=2, credit_cost=100, timeout_s=4, result_description="The coupon code.",
    )  # fmt: skip
    (coupon,) = [t for t in _client(("support",)).get(URL).json() if t["name"] == "issue_coupon"]
    assert set(coupon) == FIELDS  # no URL, headers or handler: those are the platform's business
    assert coupon == {
        "name": "issue_coupon",
        "description": "A test tool.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "result_description": "The coupon code.",
        "kind": "http",
        "timeout_s": 4.0,
        "side_effects": True,
        "requires_approval": True,
        "risk_level": 2,
        "roles": ["support"],
        "credit_cost": 100,
    }


def test_the_listing_is_read_only_and_needs_a_key(tools):
    client = _client(("support",))
    for method in ("post", "put", "patch", "delete"):
        response = getattr(client, method)(URL, {"name": "mine"}, format="json")
        assert response.status_code == 405, (method, response.content)
    assert Tool.objects.filter(name="mine").count() == 0
    response = APIClient().get(URL)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_the_demo_tools_by_role():
    config_apply(document=yaml.safe_load(DEMO_CONFIG.read_text()))
    support = {t["name"] for t in _client(("support",), "s").get(URL).json()}
    analyst = {t["name"] for t in _client(("analyst",), "a").get(URL).json()}
    assert {
        "query_orders",
        "send_notification",
        "generate_report",
        "issue_coupon",
        "get_order",
    } <= support
    assert "get_order" in analyst
    assert not {"issue_coupon", "send_notification", "query_orders"} & analyst


# checks when a definition is saved ----------------------------------------------------------------


def _tool(**fields) -> Tool:  # type: ignore[no-untyped-def]
    values = {
        "name": "lookup", "description": "Look up.", "kind": "python", "handler": "builtin.current_time",
        "parameters": {"type": "object", "properties": {}},
    }  # fmt: skip
    values.update(fields)
    return Tool(**values)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"parameters": {"type": "object", "properties": {"n": {"type": "integr"}}}}, "parameters", "not a valid JSON Schema"),
        ({"parameters": {"type": "array"}}, "parameters", 'the top level must be {"type": "object"}'),
        ({"kind": "http", "handler": "", "url": ""}, "url", "required for HTTP tools"),
        ({"handler": ""}, "handler", "required for Python tools"),
    ],
)  # fmt: skip
def test_a_definition_is_checked_when_saved(fields, field, message):
    with pytest.raises(ValidationError) as info:
        _tool(**fields).clean()
    assert field in info.value.message_dict
    assert message in info.value.message_dict[field][0]


def test_a_valid_definition_passes_and_has_the_documented_defaults():
    tool = _tool()
    tool.clean()
    tool.save()
    tool.refresh_from_db()
    assert (tool.timeout_s, tool.side_effects, tool.requires_approval, tool.risk_level) == (
        10.0,
        False,
        False,
        None,  # not declared: assessed per call (tools/risk.py)
    )
    assert (tool.roles, tool.credit_cost, tool.enabled, tool.method) == ([], 0, True, "POST")


def test_the_name_is_unique():
    from django.db import IntegrityError, transaction

    _tool().save()
    with pytest.raises(IntegrityError), transaction.atomic():
        _tool(description="another").save()


# the admin form -------------------------------------------------------------------------------------


@pytest.fixture
def operator(client):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_superuser(
        "operator", "operator@example.com", "pw-not-used"
    )
    client.force_login(user)
    return user


def _http_post(**overrides: str) -> dict[str, str]:
    data = {
        "name": "issue_coupon",
        "description": "Issue a coupon.",
        "result_description": "",
        "parameters": '{"type": "object", "properties": {"amount": {"type": "number"}}}',
        "kind": "http",
        "handler": "",
        "url": "http://127.0.0.1:8765/coupons",
        "method": "post",
        "headers": '{"Authorization": {"env": "TOOL_SECRET_COUPON_API_TOKEN"}, "X-Team": "support"}',
        "timeout_s": "10",
        "risk_level": "2",
        "approval_timeout_s": "1800",
        "approval_on_timeout": "reject",
        "roles": "support",
        "credit_cost": "100",
        "side_effects": "on",
        "idempotent": "on",
        "enabled": "on",
    }
    data.update(overrides)
    return data


def test_the_admin_saves_an_http_tool_whose_secret_header_comes_from_the_environment(
    client, operator
):
    response = client.post(reverse("admin:tools_tool_add"), _http_post())
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool = Tool.objects.get(name="issue_coupon")
    assert tool.headers == {
        "Authorization": {"env": "TOOL_SECRET_COUPON_API_TOKEN"},
        "X-Team": "support",
    }
    assert tool.method == "POST" and tool.side_effects and tool.roles == ["support"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"headers": '{"Authorization": {"evn": "TOKEN"}}'}, "headers"),
        ({"headers": '{"X-Count": 5}'}, "headers"),
        ({"headers": '["Authorization"]'}, "headers"),
        ({"url": ""}, "url"),
        ({"method": "FETCH"}, "method"),
        ({"risk_level": "4"}, "risk_level"),
        ({"headers": '{"X-Env-Leak": {"env": "DATABASE_URL"}}'}, "headers"),
        ({"value": "double(args.amount) *"}, "value"),
        ({"cost": "order.total"}, "cost"),
        ({"cost": "[1].map(a, [1].map(b, [1].map(c, [1].map(d, a))))"}, "cost"),
        ({"value": "x" * 1001}, "value"),
    ],
)
def test_the_admin_refuses_a_wrong_http_tool(client, operator, overrides, field):
    response = client.post(reverse("admin:tools_tool_add"), _http_post(**overrides))
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Tool.objects.filter(name="issue_coupon").exists()


def test_the_admin_says_which_variable_a_header_may_not_read(client, operator):
    response = client.post(
        reverse("admin:tools_tool_add"),
        _http_post(headers='{"X-Env-Leak": {"env": "DATABASE_URL"}}'),
    )
    assert response.context["adminform"].form.errors["headers"] == [
        "X-Env-Leak reads DATABASE_URL, but tool headers may read only names starting with TOOL_SECRET_"
    ]


def test_the_admin_saves_a_tools_credit_pool_estimates_and_names_a_wrong_one(client, operator):
    response = client.post(
        reverse("admin:tools_tool_add"),
        _http_post(value="double(args.amount) * 3.0", cost="  double(args.amount)  "),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool = Tool.objects.get(name="issue_coupon")
    assert (tool.value, tool.cost) == ("double(args.amount) * 3.0", "double(args.amount)")
    response = client.post(
        reverse("admin:tools_tool_change", args=[tool.pk]), _http_post(cost="session.owner + x")
    )
    assert response.context["adminform"].form.errors["cost"] == [
        "names x; it may read args, session"
    ]

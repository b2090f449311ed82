"""`apply_config`: the demo file applies, re-applies unchanged, updates by name; a wrong file changes nothing."""

import copy
import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from accounts.models import Role
from accounts.services import api_key_create
from configuration.documents import DocumentInvalid, document_load
from configuration.services import ConfigInvalid, config_apply
from record.models import Agent, ModelEndpoint
from tests.demo_setup import DEMO_CONFIG
from tests.stack import free_port
from tools.models import Tool
from workflows.models import Workflow

pytestmark = pytest.mark.django_db

DEMO = yaml.safe_load(DEMO_CONFIG.read_text())


def _apply(path: Path, *options: str) -> list[str]:
    out = io.StringIO()
    call_command("apply_config", str(path), *options, stdout=out)
    return out.getvalue().splitlines()


def _write(tmp_path: Path, document, name: str = "config.yaml") -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(json.dumps(document) if name.endswith(".json") else yaml.safe_dump(document))
    return path


def _state() -> tuple:
    """Everything apply_config may write, to prove a failed apply wrote nothing."""
    return (
        sorted(Role.objects.values_list("name", "description")),
        sorted(ModelEndpoint.objects.values_list("name", "api", "options", "updated_at")),
        sorted(Tool.objects.values_list("name", "description", "parameters", "updated_at")),
        sorted(
            Agent.objects.values_list(
                "slug", "model__name", "max_iterations", "tools", "updated_at"
            )
        ),
    )


def _base() -> dict:
    return {
        "models": [{"name": "main", "api": "rules"}],
        "tools": [
            {
                "name": "clock",
                # Says what, when and when not, and what comes back (no description warnings).
                "description": "The current date and time in UTC. Use when the user asks what "
                "time or day it is; do not use it for other time zones.",
                "result_description": "The time as {now: ISO 8601 timestamp}.",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
        "agents": [
            {"slug": "support", "name": "Support desk", "model": "main", "tools": ["clock"]}
        ],
    }


DEMO_URL_NOTES = {
    "issue_coupon": "; url http://127.0.0.1:8765/coupons (DEMO_API_URL not set: default)"
    "; status_url http://127.0.0.1:8765/coupons/status (DEMO_API_URL not set: default)",
    "get_order": "; url http://127.0.0.1:8765/orders/lookup (DEMO_API_URL not set: default)",
}


def test_the_demo_file_applies_then_reapplies_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("DEMO_API_URL", raising=False)
    # The demo business API may not be running: its HTTP tools' URLs are not checked here.
    lines = _apply(DEMO_CONFIG, "--no-url-check")
    assert lines == [
        *[f"role {r['name']}: created" for r in DEMO["roles"]],
        *[f"model {m['name']}: created" for m in DEMO["models"]],
        *[f"tool {t['name']}: created{DEMO_URL_NOTES.get(t['name'], '')}" for t in DEMO["tools"]],
        *[f"agent {a['slug']}: created" for a in DEMO["agents"]],
        *[f"workflow {w['slug']}: created (version 1)" for w in DEMO["workflows"]],
    ]
    assert lines[:3] == ["role support: created", "role analyst: created", "model rules: created"]
    for name in (
        "query_orders",
        "send_notification",
        "generate_report",
        "issue_coupon",
        "get_order",
    ):
        assert f"tool {name}: created{DEMO_URL_NOTES.get(name, '')}" in lines
    agent = Agent.objects.get(slug="order-support")
    assert agent.model.name == "rules" and agent.max_iterations == 8
    assert agent.tools == DEMO["agents"][0]["tools"]
    assert {
        "query_orders",
        "send_notification",
        "generate_report",
        "issue_coupon",
        "get_order",
    } <= set(agent.tools)
    assert Tool.objects.get(name="send_notification").side_effects is True
    coupon = Tool.objects.get(name="issue_coupon")
    assert (coupon.kind, coupon.method, coupon.url) == (
        "http",
        "POST",
        "http://127.0.0.1:8765/coupons",
    )
    assert (coupon.side_effects, coupon.risk_level, coupon.credit_cost, coupon.roles) == (
        True,
        2,
        100,
        ["support"],
    )
    assert coupon.status_url == "http://127.0.0.1:8765/coupons/status"
    assert Tool.objects.get(name="get_order").roles == ["support", "analyst"]
    assert ModelEndpoint.objects.get(name="rules").options == {"chunk_delay_s": 0.02}
    assert list(Role.objects.values_list("name", flat=True)) == ["analyst", "support"]

    before = _state()
    assert _apply(DEMO_CONFIG, "--no-url-check") == [
        line.replace("created", "unchanged") for line in lines
    ]
    assert _state() == before


def test_the_demo_tools_follow_demo_api_url(tmp_path, monkeypatch):
    monkeypatch.delenv("DEMO_API_URL", raising=False)
    _apply(DEMO_CONFIG, "--no-url-check")
    monkeypatch.setenv("DEMO_API_URL", "http://127.0.0.1:9911/")  # a trailing slash is fine

    lines = _apply(DEMO_CONFIG, "--no-url-check")

    assert (
        "tool issue_coupon: updated (url, status_url)"
        "; url http://127.0.0.1:9911/coupons (from DEMO_API_URL)"
        "; status_url http://127.0.0.1:9911/coupons/status (from DEMO_API_URL)"
    ) in lines
    assert (
        "tool get_order: updated (url); url http://127.0.0.1:9911/orders/lookup (from DEMO_API_URL)"
    ) in lines
    coupon = Tool.objects.get(name="issue_coupon")
    assert (coupon.url, coupon.status_url) == (
        "http://127.0.0.1:9911/coupons",
        "http://127.0.0.1:9911/coupons/status",
    )
    assert Tool.objects.get(name="get_order").url == "http://127.0.0.1:9911/orders/lookup"


def test_a_change_is_reported_as_updated_with_the_field_names(tmp_path):
    _apply(DEMO_CONFIG, "--no-url-check")
    changed = copy.deepcopy(DEMO)
    changed["agents"][0]["max_iterations"] = 4
    changed["agents"][0]["system_prompt"] = "Be brief."
    changed["tools"][0]["timeout_s"] = 3

    lines = _apply(_write(tmp_path, changed), "--no-url-check")

    assert "agent order-support: updated (system_prompt, max_iterations)" in lines
    assert "tool query_orders: updated (timeout_s)" in lines
    assert "tool send_notification: unchanged" in lines
    assert Agent.objects.get(slug="order-support").max_iterations == 4
    assert Tool.objects.get(name="query_orders").timeout_s == 3


def test_json_files_apply_too(tmp_path):
    assert _apply(_write(tmp_path, _base(), "config.json")) == [
        "model main: created",
        "tool clock: created",
        "agent support: created",
    ]


def test_an_agent_may_reference_rows_that_already_exist(tmp_path):
    _apply(_write(tmp_path, _base()))
    lines = _apply(
        _write(tmp_path, {"agents": [{"slug": "second", "model": "main", "tools": ["clock"]}]})
    )
    assert lines == ["agent second: created"]


def test_config_apply_service_returns_the_same_report():
    assert config_apply(document=_base()) == [
        "model main: created",
        "tool clock: created",
        "agent support: created",
    ]


def _mutations():  # type: ignore[no-untyped-def]
    def unknown_model(d):  # type: ignore[no-untyped-def]
        d["agents"][0]["model"] = "gpt-9"

    def unknown_fallback(d):  # type: ignore[no-untyped-def]
        d["agents"][0]["fallback_model"] = "backup"

    def unknown_tool(d):  # type: ignore[no-untyped-def]
        d["agents"][0]["tools"] = ["clock", "teleport"]

    def bad_schema(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["parameters"] = {"type": "object", "properties": {"days": {"type": "integr"}}}

    def schema_not_object(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["parameters"] = {"type": "array"}

    def unknown_handler(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["handler"] = "nowhere.nothing"

    def missing_handler(d):  # type: ignore[no-untyped-def]
        del d["tools"][0]["handler"]

    def http_without_url(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["kind"] = "http"
        del d["tools"][0]["handler"]

    def duplicate_model(d):  # type: ignore[no-untyped-def]
        d["models"].append({"name": "main", "api": "rules"})

    def duplicate_tool(d):  # type: ignore[no-untyped-def]
        d["tools"].append(dict(d["tools"][0]))

    def duplicate_agent(d):  # type: ignore[no-untyped-def]
        d["agents"].append({"slug": "support", "model": "main"})

    def wrong_type(d):  # type: ignore[no-untyped-def]
        d["agents"][0]["max_iterations"] = "eight"

    def wrong_type_tool(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["timeout_s"] = "soon"

    def unknown_field(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["colour"] = "blue"

    def unknown_top_level(d):  # type: ignore[no-untyped-def]
        d["plugins"] = []

    def bad_api(d):  # type: ignore[no-untyped-def]
        d["models"][0]["api"] = "telepathy"

    def remote_model_without_url(d):  # type: ignore[no-untyped-def]
        d["models"][0]["api"] = "openai"

    def bad_rule(d):  # type: ignore[no-untyped-def]
        d["agents"][0]["rules"] = [{"when": {"user": "x"}}]

    def unknown_role(d):  # type: ignore[no-untyped-def]
        d["roles"] = [{"name": "support"}]
        d["tools"][0]["roles"] = ["support", "suport"]

    def duplicate_role(d):  # type: ignore[no-untyped-def]
        d["roles"] = [{"name": "support"}, {"name": "support", "description": "again"}]

    def bad_role_name(d):  # type: ignore[no-untyped-def]
        d["roles"] = [{"name": "Support Staff"}]

    def unreachable_url(d):  # type: ignore[no-untyped-def]
        d["tools"][0].update(kind="http", url=f"http://127.0.0.1:{free_port()}/coupons")
        del d["tools"][0]["handler"]

    def url_not_http(d):  # type: ignore[no-untyped-def]
        d["tools"][0].update(kind="http", url="ftp://127.0.0.1/coupons")
        del d["tools"][0]["handler"]

    def bad_risk_level(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["risk_level"] = 4

    def bad_tool_name(d):  # type: ignore[no-untyped-def]
        d["tools"][0]["name"] = "clock; rm -rf"
        d["agents"][0]["tools"] = []

    return [
        (unknown_model, "agents[0] (support).model: unknown model 'gpt-9'"),
        (unknown_fallback, "agents[0] (support).fallback_model: unknown model 'backup'"),
        (unknown_tool, "agents[0] (support).tools[1]: unknown tool 'teleport'"),
        (bad_schema, "tools[0] (clock).parameters: not a valid JSON Schema"),
        (schema_not_object, "tools[0] (clock).parameters: the top level must be {type: object}"),
        (
            unknown_handler,
            "tools[0] (clock).handler: no registered Python handler 'nowhere.nothing'",
        ),
        (missing_handler, "tools[0] (clock).handler: required for python tools"),
        (http_without_url, "tools[0] (clock).url: required for http tools"),
        (duplicate_model, "models[2] (main).name: duplicate name 'main'"),
        (duplicate_tool, "tools[1] (clock).name: duplicate name 'clock'"),
        (duplicate_agent, "agents[1] (support).slug: duplicate slug 'support'"),
        (wrong_type, "agents[0] (support).max_iterations: 'eight' is not of type 'integer'"),
        (wrong_type_tool, "tools[0] (clock).timeout_s: 'soon' is not of type 'number'"),
        (
            unknown_field,
            "tools[0] (clock): Additional properties are not allowed ('colour' was unexpected)",
        ),
        (
            unknown_top_level,
            "file: Additional properties are not allowed ('plugins' was unexpected)",
        ),
        (bad_api, "models[0] (main).api: 'telepathy' is not one of"),
        (remote_model_without_url, "models[0] (main).base_url: required for api 'openai'"),
        (bad_rule, "agents[0] (support).rules[0]"),
        (
            unknown_role,
            "tools[0] (clock).roles[1]: unknown role 'suport' (known: support; declare it under roles:)",
        ),
        (duplicate_role, "roles[1] (support).name: duplicate name 'support'"),
        (bad_role_name, "roles[0] (Support Staff).name: 'Support Staff' does not match"),
        (unreachable_url, "tools[0] (clock).url: unreachable: cannot connect to 127.0.0.1:"),
        (url_not_http, "tools[0] (clock).url: 'ftp://127.0.0.1/coupons' does not match"),
        (bad_risk_level, "tools[0] (clock).risk_level: 4 is greater than the maximum of 3"),
        (bad_tool_name, "tools[0] (clock; rm -rf).name: 'clock; rm -rf' does not match"),
    ]


@pytest.mark.parametrize(
    ("mutate", "expected"), _mutations(), ids=lambda v: getattr(v, "__name__", "")
)
def test_a_wrong_file_changes_nothing_and_names_entry_and_field(tmp_path, mutate, expected):
    # Something already applied, which the wrong file would otherwise change.
    _apply(_write(tmp_path, _base(), "first.yaml"))
    before = _state()
    document = _base()
    document["models"].append({"name": "extra", "api": "rules"})  # valid on its own
    document["agents"][0]["max_iterations"] = 3  # a valid change to an existing row
    mutate(document)

    with pytest.raises(CommandError) as info:
        _apply(_write(tmp_path, document))

    message = str(info.value)
    assert "nothing was changed" in message
    assert expected in message, message
    assert _state() == before
    assert not ModelEndpoint.objects.filter(name="extra").exists()


def test_every_problem_is_listed_not_just_the_first():
    document = _base()
    document["agents"][0]["model"] = "gpt-9"
    document["agents"][0]["tools"] = ["teleport"]
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert len(info.value.errors) == 2


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "models: [name: x\n  - : :", "not valid YAML"),
        ("bad.json", '{"models": [', "not valid JSON"),
        ("list.yaml", "- a\n- b\n", "file: the top level must be a mapping"),
    ],
)
def test_unreadable_files_are_refused(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CommandError, match=expected):
        _apply(path)
    assert _state() == ([], [], [], [])


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    lines = ['lol: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 7)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(CommandError, match="more than 100,000 values once its aliases"):
        _apply(path)
    assert time.monotonic() - started < 2
    assert _state() == ([], [], [], [])


def test_anchors_and_merges_written_by_hand_are_read(tmp_path):
    text = "defaults: &d {max_iterations: 3}\nmodels: []\nsame: [*d, *d]\nmerged: {<<: *d, x: 1}\n"
    assert document_load(text)["merged"] == {"max_iterations": 3, "x": 1}
    with pytest.raises(DocumentInvalid, match="line 1: an alias"):
        document_load("a: &a [1, *a]\n")


def test_a_file_over_the_size_limit_is_refused(tmp_path, settings):
    settings.DEFINITION_MAX_BYTES = 1000
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"models": [], "pad": "x" * 1000}))
    with pytest.raises(CommandError, match=r"at most 1,000 \(DEFINITION_MAX_BYTES\)"):
        _apply(path)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        _apply(tmp_path / "nope.yaml")


# roles ----------------------------------------------------------------------------------------


def _with_roles() -> dict:
    document = _base()
    document["roles"] = [
        {"name": "support", "description": "Support staff"},
        {"name": "analyst"},
    ]
    document["tools"][0]["roles"] = ["support", "analyst"]
    return document


def test_the_roles_section_creates_roles_that_tools_may_name():
    assert config_apply(document=_with_roles()) == [
        "role support: created",
        "role analyst: created",
        "model main: created",
        "tool clock: created",
        "agent support: created",
    ]
    assert list(Role.objects.values_list("name", "description")) == [
        ("analyst", ""),
        ("support", "Support staff"),
    ]
    assert Tool.objects.get(name="clock").roles == ["support", "analyst"]

    changed = _with_roles()
    changed["roles"][1]["description"] = "Read-only reporting"
    changed["tools"][0]["roles"] = ["analyst"]
    report = config_apply(document=changed)
    assert "role analyst: updated (description)" in report
    assert "role support: unchanged" in report
    assert "tool clock: updated (roles)" in report


def test_a_role_already_in_the_database_may_be_named_without_declaring_it():
    api_key_create(username="ops", roles=["billing"])  # creates the role
    document = _base()
    document["tools"][0]["roles"] = ["billing"]
    assert "tool clock: created" in config_apply(document=document)


def test_a_tool_with_an_unknown_role_changes_nothing():
    document = _with_roles()
    document["tools"][0]["roles"] = ["support", "admins"]
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "tools[0] (clock).roles[1]: unknown role 'admins' (known: analyst, support; declare it under roles:)"
    ]
    assert _state() == ([], [], [], [])


# URL reachability -------------------------------------------------------------------------------


@pytest.fixture
def listening_url() -> Iterator[str]:
    """A URL on which something accepts TCP connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/coupons"


def _http_tool(url: str, **fields: str) -> dict:
    document = _base()
    tool = document["tools"][0]
    del tool["handler"]
    tool.update(kind="http", url=url, method="POST", **fields)
    return document


def test_http_tool_urls_are_checked_when_asked(listening_url):
    dead = f"http://127.0.0.1:{free_port()}"
    assert "tool clock: created" in config_apply(
        document=_http_tool(listening_url), check_urls=True
    )

    with pytest.raises(ConfigInvalid) as info:
        config_apply(
            document=_http_tool(listening_url, status_url=f"{dead}/status"), check_urls=True
        )
    (error,) = info.value.errors
    assert error.startswith(
        f"tools[0] (clock).status_url: unreachable: cannot connect to {dead[7:]} ("
    )
    assert Tool.objects.get(name="clock").status_url == ""  # unchanged

    # Not asked: an unreachable URL is accepted (its service may start later).
    report = config_apply(document=_http_tool(f"{dead}/coupons"))
    assert "tool clock: updated (url)" in report


def test_the_url_check_names_an_address_the_egress_policy_refuses(listening_url, settings):
    settings.EGRESS_ALLOW = []
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=_http_tool(listening_url), check_urls=True)
    assert info.value.errors == [
        "tools[0] (clock).url: unreachable: egress refused: 127.0.0.1 is a loopback address "
        "that EGRESS_ALLOW does not list"
    ]
    assert _state() == ([], [], [], [])


def test_the_command_checks_urls_unless_told_not_to(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/coupons"
    path = _write(tmp_path, _http_tool(dead))

    with pytest.raises(CommandError) as info:
        _apply(path)
    message = str(info.value)
    assert "nothing was changed" in message
    assert "tools[0] (clock).url: unreachable: cannot connect to 127.0.0.1:" in message
    assert "Connection refused" in message
    assert _state() == ([], [], [], [])

    assert _apply(path, "--no-url-check") == [
        "model main: created",
        "tool clock: created",
        "agent support: created",
    ]
    assert Tool.objects.get(name="clock").url == dead


def test_python_tools_have_no_url_to_check():
    assert "tool clock: created" in config_apply(document=_base(), check_urls=True)


# URLs from the environment ------------------------------------------------------------------------


def test_a_url_env_form_uses_the_variable_then_the_default_and_appends_the_path(monkeypatch):
    monkeypatch.delenv("ORDERS_API_URL", raising=False)
    monkeypatch.delenv("LLM_URL", raising=False)
    document = _http_tool(
        {"env": "ORDERS_API_URL", "default": "http://127.0.0.1:8765", "path": "/lookup?fixed=1"}
    )
    document["models"].append(
        {"name": "llm", "api": "openai", "base_url": {"env": "LLM_URL", "default": "http://x/v1"}}
    )
    report = config_apply(document=document)
    assert (
        "tool clock: created; url http://127.0.0.1:8765/lookup?fixed=1 (ORDERS_API_URL not set: default)"
        in report
    )
    assert "model llm: created; base_url http://x/v1 (LLM_URL not set: default)" in report
    assert Tool.objects.get(name="clock").url == "http://127.0.0.1:8765/lookup?fixed=1"

    # The URL is an address, not a secret: any variable may be named, with or without a prefix.
    monkeypatch.setenv("ORDERS_API_URL", "https://orders.internal/api")
    monkeypatch.setenv("LLM_URL", "http://10.0.0.5:9000/v1")
    report = config_apply(document=document)
    assert (
        "tool clock: updated (url); url https://orders.internal/api/lookup?fixed=1 (from ORDERS_API_URL)"
        in report
    )
    assert (
        "model llm: updated (base_url); base_url http://10.0.0.5:9000/v1 (from LLM_URL)" in report
    )
    assert ModelEndpoint.objects.get(name="llm").base_url == "http://10.0.0.5:9000/v1"


@pytest.mark.parametrize(
    ("env", "spec", "expected"),
    [
        (
            {},
            {"env": "ORDERS_API_URL", "path": "/coupons"},
            "tools[0] (clock).url: environment variable ORDERS_API_URL is not set and no default is given",
        ),
        (
            {"ORDERS_API_URL": "orders.internal:8765"},
            {"env": "ORDERS_API_URL", "default": "http://127.0.0.1:8765"},
            "tools[0] (clock).url: ORDERS_API_URL='orders.internal:8765' is not an http(s) URL",
        ),
        (
            {},
            {"env": "ORDERS_API_URL", "default": "ftp://127.0.0.1"},
            "tools[0] (clock).url.default: 'ftp://127.0.0.1' does not match '^https?://'",
        ),
        (
            {},
            {"env": "orders url", "default": "http://127.0.0.1"},
            "tools[0] (clock).url.env: 'orders url' does not match",
        ),
        (
            {},
            {"env": "ORDERS_API_URL", "host": "127.0.0.1"},
            "tools[0] (clock).url: Additional properties are not allowed ('host' was unexpected)",
        ),
    ],
)
def test_a_wrong_url_env_form_names_entry_and_field_and_changes_nothing(
    tmp_path, monkeypatch, env, spec, expected
):
    monkeypatch.delenv("ORDERS_API_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CommandError) as info:
        _apply(_write(tmp_path, _http_tool(spec)), "--no-url-check")
    assert expected in str(info.value), str(info.value)
    assert _state() == ([], [], [], [])


def test_the_url_check_uses_the_resolved_url(listening_url, monkeypatch):
    monkeypatch.setenv("ORDERS_API_URL", listening_url.removesuffix("/coupons"))
    document = _http_tool({"env": "ORDERS_API_URL", "path": "/coupons"})
    assert any(
        line.startswith("tool clock: created; url ")
        for line in config_apply(document=document, check_urls=True)
    )
    assert Tool.objects.get(name="clock").url == listening_url


# secrets in tool headers --------------------------------------------------------------------------


def test_a_tool_header_may_read_only_allowed_variables(settings):
    document = _http_tool(
        "http://127.0.0.1:9/x",
        headers={"X-Env-Leak": {"env": "DATABASE_URL"}, "Authorization": {"env": "TOOL_SECRET_X"}},
    )
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "tools[0] (clock).headers.X-Env-Leak: environment variable DATABASE_URL may not be read; "
        "tool headers may read only names starting with TOOL_SECRET_"
    ]
    assert _state() == ([], [], [], [])

    settings.TOOL_SECRET_ENV_ALLOW = ["ORDERS_TOKEN"]
    document["tools"][0]["headers"] = {"X-Token": {"env": "ORDERS_TOKEN"}}
    assert "tool clock: created" in config_apply(document=document)

    settings.TOOL_SECRET_ENV_PREFIXES = ["ACME_"]
    document["tools"][0]["headers"] = {"X-Token": {"env": "TOOL_SECRET_X"}}
    with pytest.raises(
        ConfigInvalid,
        match="TOOL_SECRET_X may not be read; tool headers may read "
        r"only names starting with ACME_ or the names listed in TOOL_SECRET_ENV_ALLOW \(ORDERS_TOKEN\)",
    ):
        config_apply(document=document)


# every agent setting ------------------------------------------------------------------------------


def test_every_field_the_admin_can_set_is_in_the_config_file():
    from configuration.schema import AGENT_ENTRY, MODEL_ENTRY, TOOL_ENTRY

    def editable(model: type) -> set[str]:
        return {
            f.name
            for f in model._meta.concrete_fields
            if f.editable and not f.primary_key and f.name not in ("created_at", "updated_at")
        }

    assert editable(Agent) == set(AGENT_ENTRY["properties"])
    assert editable(ModelEndpoint) == set(MODEL_ENTRY["properties"])
    assert editable(Tool) == set(TOOL_ENTRY["properties"])


def test_double_texting_is_set_from_the_file():
    document = _base()
    document["agents"][0]["double_texting"] = "interrupt"
    assert "agent support: created" in config_apply(document=document)
    assert Agent.objects.get(slug="support").double_texting == "interrupt"

    document["agents"][0]["double_texting"] = "reject"
    assert "agent support: updated (double_texting)" in config_apply(document=document)

    document["agents"][0]["double_texting"] = "queue"
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors[0].startswith(
        "agents[0] (support).double_texting: 'queue' is not one of ['enqueue', 'interrupt', 'reject']"
    )


# missing secrets ------------------------------------------------------------------------------------


def test_a_model_whose_key_variable_is_unset_is_applied_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("MAIN_API_KEY", raising=False)
    document = _base()
    document["models"].append(
        {"name": "llm", "api": "openai", "base_url": "http://x/v1", "api_key_env": "MAIN_API_KEY"}
    )
    out, err = io.StringIO(), io.StringIO()
    call_command("apply_config", str(_write(tmp_path, document)), stdout=out, stderr=err)

    assert "model llm: created" in out.getvalue().splitlines()
    assert err.getvalue().strip() == (
        "warning: model llm: api_key_env MAIN_API_KEY is not set in this environment; "
        "its calls are refused until the worker has it"
    )
    endpoint = ModelEndpoint.objects.get(name="llm")
    assert endpoint.missing_key_env == "MAIN_API_KEY"

    monkeypatch.setenv("MAIN_API_KEY", "sk-set-now")
    assert not any(line.startswith("warning") for line in config_apply(document=document))
    assert endpoint.missing_key_env == ""


def test_an_agents_dialogue_config_is_applied_and_a_wrong_one_named():
    document = _base()
    dialogue = {
        "intents": [{"name": "refund", "keywords": ["refund"]}],
        "slots": [{"name": "order", "patterns": [r"\b(SO-\d+)\b"]}],
    }
    document["agents"][0]["dialogue"] = dialogue
    assert "agent support: created" in config_apply(document=document)
    assert Agent.objects.get(slug="support").dialogue == dialogue

    document["agents"][0]["dialogue"] = {"slots": [{"name": "order", "patterns": ["(SO-"]}]}
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors[0].startswith(
        "agents[0] (support).dialogue.slots[0].patterns[0]: not a valid regular expression"
    ), info.value.errors
    assert Agent.objects.get(slug="support").dialogue == dialogue  # nothing changed


# Workflows --------------------------------------------------------------------------------------


def _with_workflow() -> dict:
    document = _base()
    document["roles"] = [{"name": "support"}]
    document["workflows"] = [
        {
            "slug": "tick",
            "role": "support",
            "start": "read",
            "nodes": {
                "read": {
                    "kind": "tool",
                    "tool": "clock",
                    "args": {},
                    "output": "now",
                    "next": "end",
                }
            },
        }
    ]
    return document


def test_a_workflow_applies_as_a_version_and_again_unchanged() -> None:
    document = _with_workflow()
    assert config_apply(document=document)[-1] == "workflow tick: created (version 1)"
    before = _state()
    assert config_apply(document=document)[-1] == "workflow tick: unchanged (version 1)"
    assert _state() == before
    document["workflows"][0]["name"] = "Tick"
    assert config_apply(document=document)[-1] == "workflow tick: updated (version 2)"


def test_a_wrong_workflow_changes_nothing_and_names_workflow_node_and_field() -> None:
    document = _with_workflow()
    node = document["workflows"][0]["nodes"]["read"]
    node["tool"] = "clonk"
    node["args"] = {"x": "now +"}
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    errors = info.value.errors
    assert errors[0].startswith("workflows[0] (tick).nodes.read.tool: unknown tool 'clonk'")
    assert errors[1].startswith("workflows[0] (tick).nodes.read.args.x: CEL syntax error")
    assert _state() == ([], [], [], [])
    assert not Workflow.objects.exists()


def test_a_workflow_may_use_only_its_roles_tools() -> None:
    document = _with_workflow()
    document["roles"].append({"name": "admin"})
    document["tools"][0]["roles"] = ["admin"]
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "workflows[0] (tick).nodes.read.tool: the workflow's role 'support' may not use tool "
        "'clock' (allowed roles: admin)"
    ]


# Agents together ------------------------------------------------------------------------------


def test_agents_name_other_agents_as_tools_and_handoffs_with_routing() -> None:
    document = _base()
    document["models"].append({"name": "small", "api": "rules"})
    document["agents"].append({"slug": "billing", "model": "main"})
    support = document["agents"][0]
    support.update(
        tools=["clock", "agent.billing"],
        handoffs=["billing"],
        max_depth=1,
        routing={"small": "small", "when": "length < 300 && dialogue.intent == 'greeting'"},
    )
    config_apply(document=document)
    agent = Agent.objects.get(slug="support")
    assert (agent.tools, agent.handoffs, agent.max_depth) == (
        ["clock", "agent.billing"],
        ["billing"],
        1,
    )
    assert agent.routing["small"] == "small"


def test_wrong_agent_references_and_routing_rules_change_nothing() -> None:
    document = _base()
    support = document["agents"][0]
    support.update(
        tools=["clock", "agent.billng"],
        handoffs=["support"],
        routing={"small": "tiny", "when": "size(mesage) < 3"},
    )
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "agents[0] (support).handoffs[0]: unknown agent 'support' (known: none)",
        "agents[0] (support).routing.small: unknown model 'tiny' (known: main)",
        "agents[0] (support).routing.when: names mesage; a routing rule may read dialogue, "
        "failures, iteration, length, message",
        "agents[0] (support).tools[1]: unknown agent 'billng' for agent.billng (known: support)",
    ]
    assert _state() == ([], [], [], [])


NESTED_3_DEEP = "{0}.all(a, {0}.all(b, {0}.all(c, a == b)))"


def test_expressions_whose_cost_cannot_be_bounded_are_refused_and_change_nothing() -> None:
    """Comprehensions nested past EXPRESSION_MAX_NESTING cost the input's length to that
    power whatever the input: apply_config refuses them in a routing rule and in a
    workflow's field, naming each (issue 43)."""
    document = _with_workflow()
    document["models"].append({"name": "small", "api": "rules"})
    document["agents"][0]["routing"] = {
        "small": "small",
        "when": NESTED_3_DEEP.format("dialogue.slots"),
    }
    document["workflows"][0]["nodes"]["read"]["args"] = {"x": NESTED_3_DEEP.format("input.items")}
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    deep = "nests comprehensions 3 deep, more than EXPRESSION_MAX_NESTING (2)"
    assert [e.split(":", 1)[0] for e in info.value.errors if deep in e] == [
        "agents[0] (support).routing.when",
        "workflows[0] (tick).nodes.read.args.x",
    ], info.value.errors
    assert _state() == ([], [], [], [])
    assert not Workflow.objects.exists()


def test_an_entry_the_admin_changed_beyond_the_file_is_not_just_unchanged(tmp_path):
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    _apply(DEMO_CONFIG, "--no-url-check")
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(root)
    tool = Tool.objects.get(name="send_notification")
    # The admin asks for approval and a timeout the demo file does not mention...
    url = reverse("admin:tools_tool_change", args=[tool.pk])
    form = client.get(url).context["adminform"].form
    data = {
        name: json.dumps(value) if isinstance(value, dict | list) and name != "roles" else value
        for name, value in form.initial.items()
        if value is not None
    }
    data.update(requires_approval="on", timeout_s=3, roles="support", idempotent="")
    data = {k: v for k, v in data.items() if v is not False and v != ""}
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    # ...and someone changes another straight in the database (no audit entry).
    Tool.objects.filter(name="send_notification").update(critical=True)

    lines = _apply(DEMO_CONFIG, "--no-url-check")

    [line] = [line for line in lines if line.startswith("tool send_notification:")]
    assert line.startswith("tool send_notification: unchanged in the file; the admin changed: ")
    assert "requires_approval (now true; the file: false, by admin:root 20" in line
    assert "timeout_s (now 3.0; the file: 10.0, by admin:root" in line
    assert line.endswith("; differs from the file: critical (now true; the file: false)")
    assert "tool query_orders: unchanged" in lines  # untouched entries say no more
    assert Tool.objects.get(name="send_notification").requires_approval  # not taken back

"""`apply_config`: the demo file applies, re-applies unchanged, updates by name; a wrong file changes nothing."""

import copy
import io
import json
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from sessions.models import Agent, ModelEndpoint
from sessions.services import ConfigInvalid, config_apply
from tests.demo_setup import DEMO_CONFIG
from tools.models import Tool

pytestmark = pytest.mark.django_db

DEMO = yaml.safe_load(DEMO_CONFIG.read_text())


def _apply(path: Path) -> list[str]:
    out = io.StringIO()
    call_command("apply_config", str(path), stdout=out)
    return out.getvalue().splitlines()


def _write(tmp_path: Path, document, name: str = "config.yaml") -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(json.dumps(document) if name.endswith(".json") else yaml.safe_dump(document))
    return path


def _state() -> tuple:
    """Everything apply_config may write, to prove a failed apply wrote nothing."""
    return (
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
                "description": "What time is it?",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
        "agents": [
            {"slug": "support", "name": "Support desk", "model": "main", "tools": ["clock"]}
        ],
    }


def test_the_demo_file_applies_then_reapplies_unchanged(tmp_path):
    lines = _apply(DEMO_CONFIG)
    assert lines == [
        "model rules: created",
        "tool query_orders: created",
        "tool send_notification: created",
        "tool generate_report: created",
        "agent order-support: created",
    ]
    agent = Agent.objects.get(slug="order-support")
    assert agent.model.name == "rules" and agent.max_iterations == 8
    assert agent.tools == ["query_orders", "send_notification", "generate_report"]
    assert Tool.objects.get(name="send_notification").side_effects is True
    assert ModelEndpoint.objects.get(name="rules").options == {"chunk_delay_s": 0.02}

    before = _state()
    assert _apply(DEMO_CONFIG) == [line.replace("created", "unchanged") for line in lines]
    assert _state() == before


def test_a_change_is_reported_as_updated_with_the_field_names(tmp_path):
    _apply(DEMO_CONFIG)
    changed = copy.deepcopy(DEMO)
    changed["agents"][0]["max_iterations"] = 4
    changed["agents"][0]["system_prompt"] = "Be brief."
    changed["tools"][0]["timeout_s"] = 3

    lines = _apply(_write(tmp_path, changed))

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
    assert _state() == ([], [], [])


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        _apply(tmp_path / "nope.yaml")

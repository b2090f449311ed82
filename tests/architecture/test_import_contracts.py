"""Every import-linter contract in pyproject.toml fails on a deliberately wrong import.

A contract that never fails proves nothing (the old ones passed while `tools` imported
`sessions.services`). For each contract, the product packages and pyproject.toml are copied
to a temporary directory, one wrong import is planted in the copy, and `lint-imports` run on
the copy must report that contract broken. A contract added to pyproject.toml without a
planted case here fails `test_every_contract_has_a_planted_violation`.
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
ROOT_PACKAGES: list[str] = IMPORTLINTER["root_packages"]
CONTRACT_NAMES: list[str] = [contract["name"] for contract in IMPORTLINTER["contracts"]]

# Top-level packages outside the product's import rules: the tests, the benchmarks and the
# embedded development servers may reach into anything.
NOT_PRODUCT = {"tests", "bench", "devstack"}

# The engine: the step loop and the step commit.
ENGINE_PATHS = ["engine"]

LAYERS = "sessions layers follow the import direction"
FLOORS = "The product's floors: edges, front door, engine, ports, record, runtime"
RECORD = "The record imports only runtime and observability"
# What import-linter cannot see (it draws modules, not names or strings): read from the source.
PRIVATE_NAMES = "A private name stays in its package"
RECORD_BY_LABEL = "No app looks the record's models up by label"


@dataclass(frozen=True)
class Plant:
    """One wrong import: `line` appended to `path` (a file that exists, unless `new`)."""

    path: str
    line: str
    new: bool = False


PLANTS: dict[str, list[Plant]] = {
    LAYERS: [
        # The sweeper's status (below the front door) calling up into the services.
        Plant("sessions/sweep_status.py", "from sessions import services"),
        # Edges are independent of each other.
        Plant("sessions/tasks.py", "from sessions import consumers"),
        Plant("sessions/selectors.py", "from sessions import consumers"),
        # A module no layer names.
        Plant("sessions/stray.py", "STRAY = 1", new=True),
    ],
    FLOORS: [
        # The engine calling up into the front door; the record into the engine.
        Plant("engine/moves/turn.py", "import sessions.services"),
        Plant("engine/runner/loop.py", "from sessions.selectors import session_get_for_owner"),
        Plant("record/rows.py", "import engine"),
        Plant("record/publisher.py", "from engine import session_run"),
        Plant("approvals/services.py", "from sessions import services"),
    ],
    "The engine's floors: runner, phases, run cache, moves, gates, model, store": [
        Plant("engine/store/commit.py", "from engine.moves import turn"),
        Plant("engine/gates/budget.py", "from engine.phases import model"),
        Plant("engine/model/context.py", "from engine.gates import guards"),
        Plant("engine/moves/turn.py", "from engine.run_cache import agent_runtime"),
        Plant("engine/phases/model.py", "from engine.runner import loop"),
        # A module no floor names.
        Plant("engine/stray.py", "STRAY = 1", new=True),
    ],
    "The engine's store imports only the record": [
        Plant("engine/store/commit.py", "from billing.services import credits_grant"),
        Plant("engine/store/open_calls.py", "from tools.execution import ToolSnapshot"),
    ],
    "The front door's modules": [
        Plant("sessions/services/grants.py", "from sessions.services import runs"),
        Plant("sessions/services/runs.py", "from sessions.services.messages import message_post"),
        Plant("sessions/services/fork.py", "from sessions.services import operator"),
        Plant("sessions/services/stray.py", "STRAY = 1", new=True),
    ],
    "The engine's phases are peers": [
        Plant("engine/phases/tools.py", "from engine.phases import model"),
    ],
    "Ports, runtime and accounts never import sessions or the engine": [
        Plant("memory/services.py", "from engine import session_run"),
        Plant("tools/execution.py", "import sessions.services"),
        Plant("memory/tokens.py", "from sessions import selectors"),
        Plant("billing/apps.py", "import sessions.services"),
    ],
    "Observability, accounts and llm never import the record": [
        Plant("llm/base.py", "from record.states import State"),
        Plant("accounts/models.py", "from record.models import Session"),
        Plant("observability/tracing.py", "from record.models import Session"),
    ],
    "The approvals port knows no engine, services or edges of sessions": [
        Plant("approvals/services.py", "import sessions.services"),
        Plant("approvals/policy.py", "from engine import session_run"),
    ],
    "The audit trail's record imports no app": [
        Plant("audit/services.py", "from record.models import Session"),
        Plant("audit/selectors.py", "from billing.services import credits_grant"),
    ],
    "runtime imports no app": [
        Plant("runtime/faults.py", "import tools.registry"),
        Plant("runtime/breaker.py", "from accounts import models"),
        Plant("runtime/faults.py", "import configuration.schema"),
        Plant("runtime/breaker.py", "import observability.metrics"),
        Plant("runtime/faults.py", "import record.errors"),
    ],
    "llm imports no other port but the token counter": [
        Plant("llm/base.py", "import tools.registry"),
        Plant("llm/openai.py", "from memory import apps"),
        Plant("llm/rules.py", "import billing.apps"),
    ],
    "The token counter is pure Python": [
        Plant("memory/tokens.py", "from django.conf import settings"),
        Plant("memory/tokens.py", "import llm.types"),
    ],
    "The workflow definitions are pure Python": [
        Plant("workflows/definition.py", "from django.conf import settings"),
        Plant("workflows/expressions.py", "import record.models"),
    ],
    "The state table and the event types are pure Python": [
        Plant("record/states.py", "from django.db import models"),
        Plant("record/events.py", "from django.utils import timezone"),
    ],
    RECORD: [
        Plant("record/models.py", "from tools.models import Tool"),
        Plant("record/errors.py", "import llm.types"),
        Plant("record/rows.py", "from sessions import services"),
        Plant("record/dispatch.py", "from accounts.models import ApiKey"),
        Plant("record/states.py", "import workflows.definition"),
    ],
    "The engine and services know no edges": [
        Plant("engine/moves/turn.py", "from rest_framework import serializers"),
        Plant("sessions/services/messages.py", "from sessions.api import views"),
        # Applying a config file is an edge too (configuration/), not session logic.
        Plant("sessions/services/sweep.py", "from configuration import services"),
        # The OpenAI-compatible endpoint is an edge app (openai_compat/).
        Plant("sessions/selectors.py", "from openai_compat import api"),
        Plant("llm/base.py", "import drf_spectacular"),
        # Indirectly: the engine imports rows, which would import the consumer.
        Plant("record/rows.py", "from sessions import consumers"),
    ],
    "The engine reaches Channels only through the publisher": [
        Plant("engine/model/deltas.py", "from channels.layers import get_channel_layer"),
        Plant("engine/store/commit.py", "import channels"),
        Plant("sessions/selectors.py", "from channels.layers import get_channel_layer"),
    ],
    # The plants of the architecture review (issue 37) that used to pass.
    "Nothing below the edges imports an edge, of its own app or another": [
        Plant("engine/phases/tools.py", "from tools import admin"),
        Plant("engine/gates/approval.py", "from approvals import consumers"),
        Plant("tools/execution.py", "import tools.admin"),
        Plant("approvals/services.py", "from approvals import consumers"),
        Plant("memory/services.py", "from restapi.errors import error_body"),
        Plant("audit/diff.py", "from audit import admin"),
    ],
    "No edge imports another app's edge": [
        Plant("openai_compat/api.py", "from sessions.api import views"),
        Plant("approvals/api.py", "from sessions import consumers"),
        Plant("tools/admin.py", "from sessions.admin import display"),
        Plant("sessions/admin/records.py", "from audit import admin"),
        # The OpenAI endpoint's streaming half is an edge too.
        Plant("openai_compat/relay.py", "from sessions.api import views"),
    ],
    "The engine is entered through its public surface only": [
        Plant("sessions/services/runs.py", "from engine.store.commit import step_commit"),
        Plant("sessions/admin/sessions.py", "from engine import moves"),
        Plant("approvals/services.py", "import engine.runner.loop"),
        # The two that used to pass: the REST edges' shared module, the admin's previews.
        Plant("restapi/errors.py", "from engine.store.commit import step_commit"),
        Plant("sessions/previews.py", "from engine.gates.risk import calls_assess"),
        Plant("record/rows.py", "import engine.store.open_calls"),
    ],
    "The front door is entered through sessions.services only": [
        # Another app reaching into one concern module (here for a private function).
        Plant("workflows/services.py", "from sessions.services.messages import _content_check"),
        Plant("openai_compat/services.py", "from sessions.services.runs import turn_interrupt"),
        Plant("engine/moves/turn.py", "import sessions.services.grants"),
    ],
    "Only the edges and the dispatch port import Celery": [
        Plant("llm/base.py", "import celery"),
        Plant("sessions/services/approvals.py", "from celery import shared_task"),
        Plant("tools/execution.py", "from celery import current_app"),
    ],
    "Only the fast paths import the libraries whose internals they read": [
        Plant("record/publisher.py", "from autobahn.websocket.protocol import WebSocketProtocol"),
        Plant("sessions/consumers.py", "from autobahn.websocket.protocol import WebSocketProtocol"),
    ],
    "No app imports agentplatform": [
        Plant("sessions/services/fork.py", "from agentplatform import settings"),
        Plant("tools/execution.py", "import agentplatform.celery"),
    ],
}


# The source checks' planted cases (each must be found by its check below).
SOURCE_PLANTS: dict[str, list[Plant]] = {
    PRIVATE_NAMES: [
        Plant("workflows/services.py", "from sessions.services.messages import _content_check"),
        Plant("billing/rankings.py", "from record.rows import _prepared_form as prepared"),
        Plant("tools/execution.py", "from memory.tokens import (\n    count,\n    _cache,\n)"),
    ],
    RECORD_BY_LABEL: [
        Plant("billing/rankings.py", 'session = apps.get_model("agent_sessions", "Session")'),
        Plant("billing/series.py", 'agent = django_apps.get_model("agent_sessions.Agent")'),
        Plant(
            "memory/services.py", "Message = get_model(label, 'Message')\nlabel = 'agent_sessions'"
        ),
    ],
}

# The 20 kinds of wrong import of the architecture review (issue 45), each caught: the plant
# named here is one of a contract's (above) or of a source check's.
KINDS: dict[str, tuple[str, Plant]] = {
    "the engine calls up into the front door": (
        FLOORS,
        Plant("engine/moves/turn.py", "import sessions.services"),
    ),
    "the record calls up into the engine": (FLOORS, Plant("record/rows.py", "import engine")),
    "the record reaches the front door": (
        RECORD,
        Plant("record/rows.py", "from sessions import services"),
    ),
    "a port reaches the engine": (
        "Ports, runtime and accounts never import sessions or the engine",
        Plant("memory/services.py", "from engine import session_run"),
    ),
    "process infrastructure reaches an app": (
        "runtime imports no app",
        Plant("runtime/faults.py", "import tools.registry"),
    ),
    "what the record stands on reaches the record": (
        "Observability, accounts and llm never import the record",
        Plant("observability/tracing.py", "from record.models import Session"),
    ),
    "the front door reaches an engine internal": (
        "The engine is entered through its public surface only",
        Plant("sessions/services/runs.py", "from engine.store.commit import step_commit"),
    ),
    "restapi reaches an engine internal": (
        "The engine is entered through its public surface only",
        Plant("restapi/errors.py", "from engine.store.commit import step_commit"),
    ),
    "the admin's previews reach an engine internal": (
        "The engine is entered through its public surface only",
        Plant("sessions/previews.py", "from engine.gates.risk import calls_assess"),
    ),
    "another app reaches a front-door concern module": (
        "The front door is entered through sessions.services only",
        Plant("workflows/services.py", "from sessions.services.messages import _content_check"),
    ),
    "another package's private function": (
        PRIVATE_NAMES,
        Plant("workflows/services.py", "from sessions.services.messages import _content_check"),
    ),
    "a port reads the record's tables by app label": (
        RECORD_BY_LABEL,
        Plant("billing/rankings.py", 'session = apps.get_model("agent_sessions", "Session")'),
    ),
    "an edge calls another app's edge": (
        "No edge imports another app's edge",
        Plant("openai_compat/api.py", "from sessions.api import views"),
    ),
    "the OpenAI relay calls the sessions' REST views": (
        "No edge imports another app's edge",
        Plant("openai_compat/relay.py", "from sessions.api import views"),
    ),
    "a core reaches its own app's edge": (
        "Nothing below the edges imports an edge, of its own app or another",
        Plant("tools/execution.py", "import tools.admin"),
    ),
    "the engine reaches DRF": (
        "The engine and services know no edges",
        Plant("engine/moves/turn.py", "from rest_framework import serializers"),
    ),
    "an engine floor reaches a floor above it": (
        "The engine's floors: runner, phases, run cache, moves, gates, model, store",
        Plant("engine/store/commit.py", "from engine.moves import turn"),
    ),
    "the store reaches a port": (
        "The engine's store imports only the record",
        Plant("engine/store/commit.py", "from billing.services import credits_grant"),
    ),
    "the pure-Python state table reaches Django": (
        "The state table and the event types are pure Python",
        Plant("record/states.py", "from django.db import models"),
    ),
    "a port reaches Celery": (
        "Only the edges and the dispatch port import Celery",
        Plant("llm/base.py", "import celery"),
    ),
}


def test_each_kind_of_wrong_import_has_its_planted_case() -> None:
    assert len(KINDS) == 20
    missing = {
        kind: plant
        for kind, (check, plant) in KINDS.items()
        if plant not in {**PLANTS, **SOURCE_PLANTS}[check]
    }
    assert missing == {}


def test_the_record_contract_names_every_package_but_its_two() -> None:
    (record,) = [c for c in IMPORTLINTER["contracts"] if c["name"] == RECORD]
    assert set(record["forbidden_modules"]) == set(ROOT_PACKAGES) - {
        "record",
        "runtime",
        "observability",
    }


@dataclass(frozen=True)
class LintReport:
    returncode: int
    kept: set[str]
    broken: set[str]
    output: str


_VERDICT = re.compile(r"^(?P<name>.+?) (?P<verdict>KEPT|BROKEN)(?: \(.*\))?$")


def _copy_project(destination: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ROOT_PACKAGES:
        shutil.copytree(ROOT / package, destination / package, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", destination / "pyproject.toml")


def _lint_imports(project: Path) -> LintReport:
    executable = Path(sys.executable).with_name("lint-imports")
    command = [str(executable)] if executable.exists() else ["lint-imports"]
    env = {
        **os.environ,
        # The copy, not the checkout, is what grimp must find.
        "PYTHONPATH": str(project),
        # Contract names must stay on one line to be read back.
        "COLUMNS": "1000",
    }
    result = subprocess.run(
        [*command, "--config", str(project / "pyproject.toml"), "--no-cache"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    kept: set[str] = set()
    broken: set[str] = set()
    for line in output.splitlines():
        match = _VERDICT.match(line.strip())
        if match and match["name"] in CONTRACT_NAMES:
            (kept if match["verdict"] == "KEPT" else broken).add(match["name"])
    return LintReport(result.returncode, kept, broken, output)


def _plant(project: Path, plant: Plant) -> None:
    target = project / plant.path
    if plant.new:
        assert not target.exists(), f"{plant.path} exists; pick another name for the new module"
        target.write_text(plant.line + "\n")
        return
    assert target.is_file(), (
        f"{plant.path} is gone: point this planted import at the module that replaced it"
    )
    with target.open("a") as source:
        source.write(f"\n{plant.line}  # planted by tests/architecture\n")


def test_every_contract_has_a_planted_violation() -> None:
    assert set(PLANTS) == set(CONTRACT_NAMES)
    assert all(PLANTS[name] for name in CONTRACT_NAMES)


def test_every_top_level_package_is_linted() -> None:
    packages = {
        path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name[0] != "."
    }
    assert packages - NOT_PRODUCT - set(ROOT_PACKAGES) == set()
    assert set(ROOT_PACKAGES) <= packages


def test_unmodified_copy_keeps_every_contract(tmp_path: Path) -> None:
    _copy_project(tmp_path)

    report = _lint_imports(tmp_path)

    assert report.returncode == 0, report.output
    assert report.kept == set(CONTRACT_NAMES), report.output
    assert report.broken == set()


@pytest.mark.parametrize(
    ("contract", "plant"),
    [
        pytest.param(contract, plant, id=f"{contract} <- {plant.path}: {plant.line}")
        for contract, plants in PLANTS.items()
        for plant in plants
    ],
)
def test_planted_import_breaks_its_contract(tmp_path: Path, contract: str, plant: Plant) -> None:
    _copy_project(tmp_path)
    _plant(tmp_path, plant)

    report = _lint_imports(tmp_path)

    assert report.returncode == 1, report.output
    assert contract in report.broken, report.output


# import-linter can forbid only whole external packages (django, not django.contrib.admin),
# so the rule "the engine never imports the admin" for Django's admin is read from the
# engine's import statements here.


def _django_admin_imports(source: str) -> list[int]:
    """Line numbers of imports of django.contrib.admin (or its submodules) in `source`."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(
            name == "django.contrib.admin" or name.startswith("django.contrib.admin.")
            for name in names
        ):
            lines.append(node.lineno)
    return lines


def _engine_files() -> list[Path]:
    files: list[Path] = []
    for relative in ENGINE_PATHS:
        path = ROOT / relative
        assert path.exists(), f"{relative} is gone: update ENGINE_PATHS"
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def test_engine_never_imports_the_django_admin() -> None:
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in _engine_files()
        if (lines := _django_admin_imports(path.read_text()))
    }

    assert offenders == {}


@pytest.mark.parametrize(
    "planted",
    [
        "from django.contrib import admin",
        "import django.contrib.admin",
        "from django.contrib.admin import ModelAdmin",
        "from django.contrib.admin.views.decorators import staff_member_required",
        "def f():\n    from django.contrib import admin\n",
    ],
)
def test_django_admin_check_sees_a_planted_import(planted: str) -> None:
    engine_module = (ROOT / "engine/moves/turn.py").read_text()

    assert _django_admin_imports(engine_module + "\n" + planted + "\n") != []


def test_django_admin_check_ignores_other_contrib_imports() -> None:
    assert (
        _django_admin_imports("from django.contrib import auth\nimport django.contrib.auth\n") == []
    )


# Names and strings import-linter cannot see. A private name (`_x`) is its module's: another
# package importing it couples to what its owner may change freely. The record's models are
# imported, so that the import graph (and the contracts) see who reads them.


def _product_files() -> list[Path]:
    return [
        path
        for package in ROOT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.relative_to(ROOT).parts
    ]


def _private_imports(source: str, package: str) -> list[str]:
    """`module._name` for each private name `source` (a module of `package`) imports from
    another product package."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        top = node.module.split(".")[0]
        if top == package or top not in ROOT_PACKAGES:
            continue
        found += [
            f"{node.module}.{alias.name}"
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        ]
    return found


def _record_by_label(source: str) -> list[int]:
    """Lines of `get_model(...)` calls naming the record's app label, directly or by a
    module-level constant."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        first = node.args[0]
        label = (
            first.value
            if isinstance(first, ast.Constant)
            else constants.get(first.id)
            if isinstance(first, ast.Name)
            else None
        )
        if name == "get_model" and isinstance(label, str) and label.startswith("agent_sessions"):
            lines.append(node.lineno)
    return lines


def _source_offenders(check: str, plant: Plant | None = None) -> dict[str, list[object]]:
    offenders: dict[str, list[object]] = {}
    for path in _product_files():
        relative = str(path.relative_to(ROOT))
        source = path.read_text()
        if plant is not None and relative == plant.path:
            source += "\n" + plant.line + "\n"
        package = relative.split("/")[0]
        if check == PRIVATE_NAMES:
            found: list[object] = list(_private_imports(source, package))
        elif package == "record":
            found = []
        else:
            found = list(_record_by_label(source))
        if found:
            offenders[relative] = found
    return offenders


@pytest.mark.parametrize("check", list(SOURCE_PLANTS))
def test_the_product_passes_the_source_check(check: str) -> None:
    assert _source_offenders(check) == {}


@pytest.mark.parametrize(
    ("check", "plant"),
    [
        pytest.param(check, plant, id=f"{check} <- {plant.path}: {plant.line}")
        for check, plants in SOURCE_PLANTS.items()
        for plant in plants
    ],
)
def test_a_planted_name_breaks_its_source_check(check: str, plant: Plant) -> None:
    assert (ROOT / plant.path).is_file(), f"{plant.path} is gone"

    assert plant.path in _source_offenders(check, plant)

"""Issue 43's limits are settings whose defaults are no larger than the issue's maxima, and
each is documented where an operator looks: .env.example (every setting with its default)
and docs/security.md (the limits' table, and who may change them)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = (ROOT / "agentplatform" / "settings.py").read_text()
ENV_EXAMPLE = (ROOT / ".env.example").read_text()
SECURITY = (ROOT / "docs" / "security.md").read_text()

# setting -> the largest default issue 43 allows.
MAXIMA = {
    "WORKFLOW_MAX_NODES": 500,
    "WORKFLOW_MAX_VISITS": 1000,
    "WORKFLOW_MAX_BRANCHES": 32,
    "WORKFLOW_MAX_MAP_CONCURRENCY": 50,
    "AGENT_MAX_CHILDREN_PER_STEP": 8,
    "AGENT_MAX_TREE_SESSIONS": 50,
    "DEFINITION_MAX_BYTES": 1_048_576,
}
# The other settings of the issue: documented, their defaults as the docs say.
DOCUMENTED = [
    *MAXIMA,
    "EXPRESSION_COST_LIMIT",
    "EXPRESSION_MAX_NESTING",
    "DEFINITION_MAX_VALUES",
    "WORKFLOW_MAP_MAX_ITEMS",
    "EGRESS_ALLOW",
    "MCP_STDIO_COMMANDS",
]


def _default(name: str) -> str:
    found = re.search(rf'^{name} = env(?:\.\w+)?\("{name}", default=([^)]*)\)', SETTINGS, re.M)
    assert found, f"{name} is not read from the environment in settings.py"
    return found.group(1).replace("_", "")


@pytest.mark.parametrize(("name", "most"), MAXIMA.items())
def test_each_limits_default_is_within_the_issues_maximum(name: str, most: int) -> None:
    assert 0 < int(_default(name)) <= most


@pytest.mark.parametrize("name", DOCUMENTED)
def test_each_setting_is_in_env_example_with_its_default_and_in_security_md(name: str) -> None:
    default = _default(name)
    line = re.search(rf"^# {name}=(\S*)", ENV_EXAMPLE, re.M)
    assert line, f"{name} missing from .env.example"
    assert line.group(1) == ("" if default == "[]" else default), line.group(0)
    assert f"`{name}`" in SECURITY, f"{name} missing from docs/security.md"


def test_every_audited_action_is_in_the_audit_trails_table() -> None:
    from audit.models import AuditAction

    trail = SECURITY.split("### Audit trail", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)?)`", trail))
    # `.edited`-style shorthands name an action after the one before them in the cell.
    for prefix, suffixes in re.findall(r"`([a-z_]+)\.[a-z_]+`((?:, `\.[a-z_]+`)+)", trail):
        named |= {f"{prefix}{s}" for s in re.findall(r"`(\.[a-z_]+)`", suffixes)}
    assert {a.value for a in AuditAction} - named == set()

"""`manage.py check --deploy` is clean with the production settings the manual documents
(docs/security.md, "Production settings and hardening"), and flags their absence."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECURITY_PAGE = (ROOT / "docs" / "security.md").read_text()


def _documented_env() -> dict[str, str]:
    """The variables of the manual's production example, taken from the page itself."""
    section = SECURITY_PAGE.split("## Production settings and hardening", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    values = dict(re.findall(r"\b([A-Z][A-Z0-9_]+)=(\"[^\"]*\"|\S+)", block))
    return {k: v.strip('"') for k, v in values.items()}


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _documented_env()}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_production_settings_pass_check_deploy() -> None:
    env = _documented_env()
    assert env["DEBUG"] == "false" and "SECURE_HSTS_SECONDS" in env, env
    env["SECRET_KEY"] = "k" + "".join(chr(ord("a") + (i * 7) % 26) for i in range(60)) + "9Z-_!"
    done = _check_deploy(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout


def test_without_them_check_deploy_fails() -> None:
    done = _check_deploy({"DEBUG": "false"})
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr + done.stdout, warning

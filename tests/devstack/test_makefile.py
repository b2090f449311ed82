"""What the Makefile's entry points install: `make run` only what running needs."""

import os
import subprocess

import pytest

from tests.stack import ROOT, free_port


def _dry_run(target: str) -> str:
    """The commands `make TARGET` would run from scratch (-B: as if nothing were installed)."""
    env = {**os.environ, "PORT": str(free_port()), "DEMO_API_PORT": str(free_port())}
    result = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _installs(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line]


def test_make_run_installs_the_dependencies_without_the_contributors_tools():
    installs = _installs(_dry_run("run"))
    assert installs, "make run installs nothing on a fresh checkout"
    assert all("-e '.'" in line and "[dev]" not in line for line in installs), installs
    assert not any("clients/python" in line for line in installs), installs


@pytest.mark.parametrize("target", ["test", "test-fast", "lint"])
def test_the_contributors_targets_add_the_dev_extras_and_the_client(target):
    installs = " ".join(_installs(_dry_run(target)))
    assert "-e '.[dev]'" in installs and "clients/python" in installs, installs


def test_make_run_prepares_the_demo_in_one_process():
    commands = _dry_run("run")
    assert "bootstrap_demo --migrate --config config/demo.yaml" in commands, commands
    assert "manage.py migrate" not in commands and "manage.py apply_config" not in commands

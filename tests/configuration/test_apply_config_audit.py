"""Issue 46: each `apply_config` run, which may change every agent, is one audit entry: who
ran it (`--actor`, else deploy:<the OS user>), the file, and per entry created or updated
its changed fields before and after. A file that fails changes nothing and enters nothing."""

import copy
import io
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from audit.models import AuditEntry
from configuration.services import config_apply

pytestmark = pytest.mark.django_db

WORKFLOW = {
    "slug": "triage",
    "role": "support",
    "start": "look",
    "nodes": {"look": {"kind": "tool", "tool": "clock", "args": {}, "next": "end"}},
}


def _document() -> dict:
    return {
        "roles": [{"name": "support"}],
        "models": [{"name": "main", "api": "rules"}],
        "tools": [
            {
                "name": "clock",
                "description": "The current date and time in UTC. Use when the user asks what "
                "time or day it is; do not use it for other time zones.",
                "result_description": "The time as {now: ISO 8601 timestamp}.",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
        "agents": [
            {
                "slug": "support",
                "name": "Support desk",
                "model": "main",
                "tools": ["clock"],
                "max_iterations": 8,
            }
        ],
        "workflows": [copy.deepcopy(WORKFLOW)],
    }


def _apply(tmp_path: Path, document: dict, *options: str) -> Path:
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(document))
    call_command("apply_config", str(path), *options, stdout=io.StringIO())
    return path


def _runs() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="config.apply").order_by("id"))


def test_each_run_is_one_entry_with_each_entrys_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "release-bot")
    document = _document()
    path = _apply(tmp_path, document)
    [first] = _runs()
    assert first.actor == "deploy:release-bot"
    assert (first.object_type, first.object_id, first.object_repr) == (
        "configuration.file", "platform.yaml", str(path),
    )  # fmt: skip
    created = ["role support", "model main", "tool clock", "agent support", "workflow triage"]
    assert first.data["created"] == created and first.data["updated"] == []
    assert all(first.before[entry] is None for entry in created)
    assert first.after["agent support"]["max_iterations"] == 8
    assert first.after["agent support"]["model"] == "main"  # a referenced row by its name
    assert first.after["workflow triage"]["definition"]["start"] == "look"
    assert len(first.data["sha256"]) == 64

    # Again unchanged: still a run, which changed nothing.
    _apply(tmp_path, document)
    unchanged = _runs()[-1]
    assert (unchanged.before, unchanged.after) == ({}, {})
    assert unchanged.data["unchanged"] == 5 and unchanged.data["sha256"] == first.data["sha256"]

    # An edit of one agent and of the workflow, with --actor.
    document["agents"][0]["max_iterations"] = 4
    document["agents"][0]["name"] = "Support"
    document["workflows"][0]["nodes"]["look"]["args"] = {"zone": "'UTC'"}
    _apply(tmp_path, document, "--actor", "ci:release-42")
    edited = _runs()[-1]
    assert edited.actor == "ci:release-42"
    assert edited.data["updated"] == ["agent support", "workflow triage"]
    assert edited.before["agent support"] == {"max_iterations": 8, "name": "Support desk"}
    assert edited.after["agent support"] == {"max_iterations": 4, "name": "Support"}
    # The definition's changed paths, not the definition twice.
    zone = "definition.nodes.look.args.zone"
    assert (edited.before["workflow triage"][zone], edited.after["workflow triage"][zone]) == (
        "(absent)", "'UTC'",
    )  # fmt: skip
    assert "definition.start" not in edited.after["workflow triage"]
    assert set(edited.before) == {"agent support", "workflow triage"}


def test_a_file_that_fails_enters_nothing(tmp_path):
    document = _document()
    document["agents"][0]["model"] = "missing"
    with pytest.raises(CommandError):
        _apply(tmp_path, document)
    assert not _runs()


def test_the_service_defaults_to_the_system_actor():
    config_apply(document=_document())
    [run] = _runs()
    assert run.actor == "system" and run.object_id == run.data["sha256"][:16]

"""The manual's examples: YAML is what apply_config accepts; shell and Python run or say why not.

A block that is a config document (its keys are sections of one) is checked against the
schema apply_config validates with, its `...` lines (elisions) left out and required
fields not demanded (an example shows the fields it is about); workflows go through the
workflow parser's field check. A YAML block that is a fragment (one entry's part) says
so in the comment on its first line (`# fragment: ...`); it must parse.
"""

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from configuration.schema import DOCUMENT
from tests.docs.blocks import ROOT, Block, blocks, marker_before

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```yaml\n(.*?)^```", flags=re.M | re.S)


def _without_required(schema: Any) -> Any:
    # Without `required`, both sides of a oneOf may match a partial entry: anyOf then.
    if isinstance(schema, dict):
        return {
            ("anyOf" if k == "oneOf" else k): _without_required(v)
            for k, v in schema.items()
            if k != "required"
        }
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


LENIENT = Draft202012Validator(_without_required(DOCUMENT))


def _examples() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.name}:{line}", match.group(1)))
    return found


@pytest.mark.parametrize(("where", "block"), _examples(), ids=[w for w, _ in _examples()])
def test_a_yaml_example_is_accepted_by_the_schema(where: str, block: str) -> None:
    kept = "\n".join(line for line in block.splitlines() if line.strip() != "...")
    document = yaml.safe_load(kept)
    if block.startswith("# fragment:"):
        return  # parsed: a part of an entry, named on its first line
    assert isinstance(document, dict) and set(document) <= set(DOCUMENT["properties"]), (
        f"{where}: not a config document; mark a fragment with '# fragment: <what>'"
    )
    problems = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in LENIENT.iter_errors(document)
    ]
    assert problems == [], where


def test_the_check_finds_a_field_the_schema_refuses() -> None:
    document = {"tools": [{"name": "t", "kind": "http", "colour": "red"}]}
    assert list(LENIENT.iter_errors(document))


# The shell and Python examples (tests/docs/blocks.py): each runs in CI or says why not.
SHELL_AND_PYTHON = blocks()


def test_every_shell_and_python_example_runs_or_says_why_not() -> None:
    unmarked = [b.where for b in SHELL_AND_PYTHON if not b.marker]
    assert unmarked == [], (
        "mark each with <!-- run -->, <!-- run by <test> --> or <!-- not run: why -->"
    )
    for block in SHELL_AND_PYTHON:
        if block.runner:
            runner = ROOT / block.runner
            # The test that runs it names the page it reads the block from.
            assert runner.is_file(), (block.where, block.runner)
            assert Path(block.page).name in runner.read_text(), (block.where, block.runner)
    # The tour (an agent turn, a workflow) is among what runs.
    assert [b.marker for b in SHELL_AND_PYTHON if b.page == "README.md"].count("run") >= 2


@pytest.mark.parametrize("block", SHELL_AND_PYTHON, ids=[b.where for b in SHELL_AND_PYTHON])
def test_an_example_parses(block: Block) -> None:
    """Those that do not run parse at least (bash -n; Python's compiler)."""
    if block.language == "python":
        compile(block.code, block.where, "exec")
        return
    done = subprocess.run(["bash", "-n"], input=block.code, text=True, capture_output=True)
    assert done.returncode == 0, f"{block.where}: {done.stderr}"


def test_an_unmarked_block_or_an_unreadable_marker_is_found() -> None:
    text = "Run it:\n\n<!-- not run: needs a real OpenAI key -->\n\n```bash\nx\n```\n"
    assert marker_before(text, text.index("```")) == "not run: needs a real OpenAI key"
    assert marker_before("<!-- run -->\n```", 13) == "run"
    assert marker_before("<!-- not run -->\n```", 17) == ""  # a reason is required
    assert marker_before("<!-- run -->\ntext\n```", 18) == ""  # not right before the block

"""The configuration reference is generated from apply_config's schema and columns: the
committed page is that output, and no field is accepted that nothing reads."""

from pathlib import Path

from configuration import reference
from configuration.schema import DOCUMENT

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration-reference.md"


def test_the_committed_reference_is_the_generated_one() -> None:
    # Regenerate with: .venv/bin/python manage.py config_reference > docs/configuration-reference.md
    assert PAGE.read_text() == reference.reference_markdown()


def test_every_field_the_schema_accepts_is_read_by_apply_config() -> None:
    assert reference.unread_fields() == []


def test_a_field_nothing_reads_is_found(monkeypatch) -> None:
    tools = DOCUMENT["properties"]["tools"]["items"]["properties"]
    monkeypatch.setitem(tools, "colour", {"type": "string"})
    assert reference.unread_fields() == ["tools.colour"]


def test_the_reference_lists_every_section_and_field() -> None:
    text = reference.reference_markdown()
    for section in reference.SECTIONS:
        assert f"## `{section.key}`" in text
        for field in DOCUMENT["properties"][section.key]["items"].get("properties", {}):
            assert f"| `{field}` |" in text, (section.key, field)

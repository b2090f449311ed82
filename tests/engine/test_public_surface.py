"""engine/__init__.py names exactly what it exports, and each name exists."""

import ast
from pathlib import Path

import engine


def test_every_name_the_surface_lists_exists_and_every_import_is_listed() -> None:
    tree = ast.parse(Path(engine.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }

    assert [name for name in engine.__all__ if not hasattr(engine, name)] == []
    assert set(engine.__all__) == imported
    assert len(engine.__all__) == len(set(engine.__all__))

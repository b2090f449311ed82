"""The hubs stay readable in one sitting: no function in `engine/` or `workflows/` runs
over 80 lines of code (its docstring not counted: what it says is not what one reads
through). A longer one is composed of named parts (see `engine/store/commit.py`)."""

import ast

from tests.architecture.test_import_contracts import ROOT

PACKAGES = ("engine", "workflows")
MOST_LINES = 80


def long_functions(tree: ast.AST, most: int = MOST_LINES) -> list[tuple[int, str, int]]:
    """(line, name, lines) of each function whose body, past its docstring, is longer."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if ast.get_docstring(node) is not None and len(body) > 1:
                body = body[1:]
            lines = (node.end_lineno or node.lineno) - body[0].lineno + 1
            if lines > most:
                found.append((node.lineno, node.name, lines))
    return found


def test_no_function_in_the_hubs_is_longer_than_80_lines() -> None:
    too_long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({lines} lines)"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for line, name, lines in long_functions(ast.parse(path.read_text()))
    ]
    assert too_long == []


def test_a_long_function_is_found_and_its_docstring_is_not_counted() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_LINES))
    docstring = '    """' + "\n" * 30 + '    """\n'
    fits = ast.parse(f"def fits():\n{docstring}{body}\n")
    over = ast.parse(f"async def over():\n{body}\n    return x0\n")
    assert long_functions(fits) == []
    assert long_functions(over) == [(1, "over", MOST_LINES + 1)]

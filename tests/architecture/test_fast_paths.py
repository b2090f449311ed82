"""A library's private attributes are read in runtime/fastpaths/ alone.

Everything else in the product uses public APIs, so that a library upgrade can only
turn a fast path off (README "Fast paths"), never break a module nobody knows depends
on an internal. Read from the code: an attribute `x._name` (or `getattr(x, "_name")`)
on anything but `self`/`cls` is private to a library unless the product itself defines
`_name` somewhere; Django's documented model API (`_meta`, `_default_manager`,
`_base_manager`, `_state`) is public despite its underscore.
"""

import ast
import importlib
import inspect
from pathlib import Path

from tests.architecture.test_import_contracts import ROOT, ROOT_PACKAGES

FENCE = ROOT / "runtime" / "fastpaths"
DJANGO_PUBLIC = {"_meta", "_default_manager", "_base_manager", "_state"}


def _product_files() -> list[Path]:
    return [
        path
        for package in ROOT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, attributes it sets,
    variables, arguments and keywords (a queryset's annotations)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:  # keywords: annotate(_n=...)
            names.add(node.arg)
    return {name for name in names if _private(name)}


def foreign_private_reads(tree: ast.AST, own: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each read of a private attribute the product does not define."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            owner, name = node.args[0], node.args[1].value
        else:
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if _private(name) and name not in own and name not in DJANGO_PUBLIC:
            found.append((node.lineno, name))
    return found


def _own_names(trees: dict[Path, ast.AST]) -> set[str]:
    return set().union(*(_defined_names(tree) for tree in trees.values()))


def test_only_the_fast_paths_read_a_librarys_private_attributes() -> None:
    trees = {path: ast.parse(path.read_text()) for path in _product_files()}
    own = _own_names(trees)
    offenders = {
        str(path.relative_to(ROOT)): reads
        for path, tree in trees.items()
        if FENCE not in path.parents and (reads := foreign_private_reads(tree, own))
    }
    assert offenders == {}
    # The fence holds what it fences: the check sees the fast paths' own reads.
    fenced = [path for path in trees if FENCE in path.parents]
    assert any(foreign_private_reads(trees[path], own) for path in fenced)


def test_a_planted_private_read_outside_the_fence_is_found() -> None:
    trees = {path: ast.parse(path.read_text()) for path in _product_files()}
    own = _own_names(trees)
    publisher = (ROOT / "record" / "publisher.py").read_text()
    planted = (
        publisher + "\n\ndef _peek(layer):\n    return layer._shards, getattr(layer, '_kwargs')\n"
    )

    assert foreign_private_reads(ast.parse(publisher), own) == []
    lines = len(publisher.splitlines())
    assert foreign_private_reads(ast.parse(planted), own) == [
        (lines + 4, "_shards"),
        (lines + 4, "_kwargs"),
    ]


# A private method overridden is a private attribute read too (the library calls ours in its
# place): DRF's `_readable_fields` was, outside the fence. Read from the classes themselves.


def _library_privates_overridden(classes: list[type]) -> list[tuple[str, str, str]]:
    """(class, name, library module) for each private method or property a product class in
    `classes` (or a product class it inherits) defines over a library class's."""
    found = []
    for cls in classes:
        mro = cls.__mro__
        for i, own in enumerate(mro):
            if own.__module__.split(".")[0] not in ROOT_PACKAGES or own.__module__.startswith(
                "runtime.fastpaths"
            ):
                continue
            for name, value in vars(own).items():
                if not _private(name) or name.endswith("_"):  # _sunder_: enum's own
                    continue
                if not (inspect.isfunction(value) or isinstance(value, property | classmethod)):
                    continue
                library = next(
                    (
                        base.__module__
                        for base in mro[i + 1 :]
                        if base.__module__.split(".")[0] not in ROOT_PACKAGES and name in vars(base)
                    ),
                    None,
                )
                if library is not None:
                    found.append((f"{own.__module__}.{own.__qualname__}", name, library))
    return found


def _product_classes() -> list[type]:
    classes: list[type] = []
    for path in _product_files():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith("agentplatform.") or FENCE in path.parents:
            continue  # the wiring (asgi, wsgi build applications on import); the fence
        classes += [
            value
            for value in vars(importlib.import_module(module)).values()
            if inspect.isclass(value) and value.__module__ == module
        ]
    return classes


def test_no_product_class_overrides_a_librarys_private_method_outside_the_fence() -> None:
    assert _library_privates_overridden(_product_classes()) == []


def test_an_overridden_private_method_is_found() -> None:
    from rest_framework import serializers

    class Planted(serializers.Serializer):
        @property
        def _readable_fields(self):  # type: ignore[no-untyped-def]
            return []

    Planted.__module__ = "sessions.api.serializers"
    assert _library_privates_overridden([Planted]) == [
        (
            "sessions.api.serializers." + Planted.__qualname__,
            "_readable_fields",
            "rest_framework.serializers",
        )
    ]

"""The one way a YAML definition is read (apply_config, the workflow admin editor).

PyYAML's safe_load shares an anchored value among its aliases, but whatever reads the result
walks every copy: nine lines of `&a [*b, *b, ...]` (509 bytes) made ~1.1 GB and 8.4 s of work
in the web process, each extra line ten times more. Here a document over DEFINITION_MAX_BYTES
is not parsed at all, and one whose values, aliases expanded, come to more than
DEFINITION_MAX_VALUES is refused before anything is built from it (anchors and merges a
person writes by hand stay far below that).
"""

import json
from typing import Any

import yaml
from django.conf import settings
from yaml.nodes import Node


class DocumentInvalid(ValueError):
    """A document that cannot be read; the message says where and why, on one line."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts what the document's values come to with every alias expanded
    (cheaply: each node's count once) and refuses it past DEFINITION_MAX_VALUES, or when an
    alias refers to the value it is in (a loop no definition needs)."""

    def compose_document(self) -> Node | None:
        node: Node | None = super().compose_document()
        if node is not None:
            most = settings.DEFINITION_MAX_VALUES
            if (values := _expanded(node, {}, most)) > most:
                raise DocumentInvalid(
                    f"the document comes to more than {most:,} values once its aliases (*name) "
                    f"are expanded ({values:,} counted); DEFINITION_MAX_VALUES is {most:,}"
                )
        return node


_IN_PROGRESS = -1


def _expanded(node: Node, counted: dict[int, int], most: int) -> int:
    """How many values `node` stands for with its aliases expanded (stops counting past `most`)."""
    known = counted.get(id(node))
    if known == _IN_PROGRESS:
        line = node.start_mark.line + 1
        raise DocumentInvalid(f"line {line}: an alias (*name) refers to the value it is in")
    if known is not None:
        return known
    counted[id(node)] = _IN_PROGRESS
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[Node] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded(child, counted, most)
        if total > most:
            break
    counted[id(node)] = total
    return total


def document_load(text: str, *, as_json: bool = False) -> Any:
    """The YAML (or, `as_json`, JSON) document in `text`; raises DocumentInvalid."""
    size = len(text.encode())
    if size > (most := settings.DEFINITION_MAX_BYTES):
        raise DocumentInvalid(
            f"the document is {size:,} bytes; at most {most:,} (DEFINITION_MAX_BYTES)"
        )
    if as_json:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise DocumentInvalid(f"not valid JSON: {exc}") from None
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506  # nosec B506: a SafeLoader
    except yaml.YAMLError as exc:
        raise DocumentInvalid(f"not valid YAML: {exc}") from None

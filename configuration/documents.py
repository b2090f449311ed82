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
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
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


def document_entries_text(text: str, key: str) -> dict[str, str]:
    """Each entry of the document's top-level `key` list (by its `slug`) as its author wrote
    it: its own lines of `text`, comments and order kept, unindented. A round-trip YAML
    library says where each entry starts. Only for a document `document_load` has read (its
    size and aliases bounded); {} where there is no such list."""
    try:
        document = YAML().load(text)  # round-trip: each value knows its line and column
    except Exception:  # noqa: BLE001 - what PyYAML read, ruamel may still refuse: no text then
        return {}
    if not isinstance(document, CommentedMap) or not isinstance(document.get(key), list):
        return {}
    lines = text.splitlines(keepends=True)
    keys = list(document)
    after = keys.index(key) + 1
    end = document.lc.key(keys[after])[0] if after < len(keys) else len(lines)
    entries = [
        e for e in document[key] if isinstance(e, CommentedMap) and isinstance(e.get("slug"), str)
    ]
    found: dict[str, str] = {}
    for i, entry in enumerate(entries):
        stop = entries[i + 1].lc.line if i + 1 < len(entries) else end
        chunk = lines[entry.lc.line : stop]
        while chunk and chunk[-1].strip()[:1] in ("", "#"):
            chunk.pop()  # the blank lines and the next entry's heading comment
        col = entry.lc.col
        chunk[0] = " " * col + chunk[0][col:]  # the list's "- " goes
        found[entry["slug"]] = "".join(
            line[col:] if not line[:col].strip() else line.lstrip() for line in chunk
        )
    return found

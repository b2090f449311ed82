"""The one way a YAML definition is read (apply_config, the workflow admin editor).

PyYAML's safe_load still expands aliases: nine lines of `&a [*b, *b, ...]` (509 bytes) made
~1.1 GB and 8.4 s of work in the web process, each extra line ten times more. Here an alias
is refused where it stands, and a document over DEFINITION_MAX_BYTES is not parsed at all;
with neither, the values loaded are no larger than the text.
"""

import json
from typing import Any

import yaml
from django.conf import settings
from yaml.nodes import Node


class DocumentInvalid(ValueError):
    """A document that cannot be read; the message says where and why, on one line."""


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses `*alias` (and so `<<: *alias` merges) while composing."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            line = event.start_mark.line + 1
            raise DocumentInvalid(
                f"line {line}: aliases (*{event.anchor}) are not accepted in a definition; "
                "write the value out"
            )
        return super().compose_node(parent, index)


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
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506  # nosec B506: a SafeLoader
    except yaml.YAMLError as exc:
        raise DocumentInvalid(f"not valid YAML: {exc}") from None

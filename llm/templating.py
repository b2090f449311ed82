"""`{{ path.to.value }}` substitution for rule templates.

Only dict keys and list indexes are followed, never attributes, so an operator's
template cannot reach into Python objects.
"""

import json
import re
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w]*(?:\.[\w]+)*)\s*\}\}")
_MISSING = object()


def lookup(context: Any, path: str) -> Any:
    value = context
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit():
            index = int(part)
            value = value[index] if index < len(value) else _MISSING
        elif isinstance(value, list) and part == "length":
            value = len(value)
        else:
            value = _MISSING
        if value is _MISSING:
            return None
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def render(template: Any, context: dict[str, Any]) -> Any:
    """Render strings, lists and dicts; a string that is one placeholder keeps the value's type."""
    if isinstance(template, str):
        whole = PLACEHOLDER.fullmatch(template.strip())
        if whole:
            return lookup(context, whole.group(1))
        return PLACEHOLDER.sub(lambda m: _as_text(lookup(context, m.group(1))), template)
    if isinstance(template, list):
        return [render(item, context) for item in template]
    if isinstance(template, dict):
        if "$map" in template:
            items = lookup(context, str(template["$map"])) or []
            return [
                render(template.get("template", ""), {**context, "item": item}) for item in items
            ]
        return {key: render(value, context) for key, value in template.items()}
    return template


def render_text(template: Any, context: dict[str, Any]) -> str:
    """Render to text (an answer): an unknown path is empty, a structure is JSON, never `None` or a repr."""
    return _as_text(render(template, context))

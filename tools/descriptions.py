"""Does a tool's description help the model? Checks for apply_config and the admin.

A model calls a tool well when its description says what it does, when to use
it and when not, what each parameter means, and what comes back (see
../shared/reference/runtime-engineering.zh.txt §2.3). These checks are
heuristics on the text: each problem is one short sentence naming what is
missing, so an operator can fix it in a minute.
"""

import re
from typing import Any

MIN_WORDS = 6
WHEN_TO_USE = re.compile(
    r"\b(use (this|it|when|for|to|if|after|before)|call (this|it|when|for|to|if)|"
    r"when (the|a|an|you|someone|asked)|for (questions|requests) about|useful (for|when))\b",
    re.IGNORECASE,
)
WHEN_NOT = re.compile(
    r"\b(do not|don't|does not|not for|not to|never|instead|only (for|when|if)|avoid|unless)\b",
    re.IGNORECASE,
)
RETURNS = re.compile(r"\b(returns?|answers with|responds with|gives back)\b", re.IGNORECASE)


def description_problems(
    *,
    description: str,
    parameters: Any,
    result_description: str = "",
    output_schema: dict[str, Any] | None = None,
) -> list[str]:
    """What the description and schema do not tell the model; empty when nothing is missing."""
    problems: list[str] = []
    text = " ".join((description or "").split())
    words = len(text.split())
    if not text:
        problems.append("no description: say what it does and when to use it")
    elif words < MIN_WORDS:
        problems.append(
            f"description is too short ({words} words) to say what it does; write a full sentence"
        )
    if text and not WHEN_TO_USE.search(text):
        problems.append("description does not say when to use it (e.g. 'Use when ...')")
    if text and not WHEN_NOT.search(text):
        problems.append("description does not say when not to use it (e.g. 'Do not use for ...')")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if isinstance(properties, dict):
        bare = [
            str(name)
            for name, schema in properties.items()
            if not (isinstance(schema, dict) and str(schema.get("description") or "").strip())
        ]
        if bare:
            problems.append(f"parameters without a description: {', '.join(bare)}")
    if not result_description.strip() and not output_schema and not RETURNS.search(text):
        problems.append("no result description: say what it returns (result_description)")
    return problems


def tool_warnings(name: str, problems: list[str]) -> list[str]:
    """`tool NAME: problem` lines."""
    return [f"tool {name}: {problem}" for problem in problems]

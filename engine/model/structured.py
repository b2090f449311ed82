"""Answers that must be JSON: the instruction, the check, and the one repair.

Shared by a workflow's llm node (an `output_schema`) and a turn whose client asked
for a `response_format` (the OpenAI-compatible endpoint). Whatever the wire (OpenAI's
structured output, Anthropic, the offline rules model, a compatible server that
ignores response_format), the model is told in words, its answer is checked, and a
wrong answer gets one repair: the answer and what is wrong with it, then "again".
"""

import json
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from llm.types import ChatMessage, ResponseFormat


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def answer_instruction(answer: ResponseFormat, *, final_only: bool = False) -> str:
    """What the model is told about the answer's form (OpenAI's json_object mode also
    needs the word JSON in the conversation)."""
    when = (
        "When you give your final answer (not when you call a tool), answer"
        if final_only
        else "Answer"
    )
    if answer.schema is None:
        return f"{when} with one JSON object only, no prose."
    return (
        f"{when} with one JSON value only, no prose, valid against this JSON Schema: "
        + _compact(answer.schema)
    )


@dataclass(frozen=True)
class Checked:
    value: Any
    problem: str  # "" when the answer is valid
    # The answer as JSON text: the model's own, or, when it wrapped it (a code fence), the
    # value alone, so a client parsing the answer gets JSON.
    text: str = ""


def answer_check(text: str, answer: ResponseFormat) -> Checked:
    """The answer's JSON value, or what is wrong with it (a code fence around it is forgiven)."""
    cleaned = text.strip()
    fenced = cleaned.startswith("```")
    if fenced:
        cleaned = cleaned.strip("`")
        cleaned = cleaned[cleaned.find("\n") + 1 :] if "\n" in cleaned else cleaned
    try:
        value = json.loads(cleaned)
    except json.JSONDecodeError as exc:
        return Checked(None, f"not JSON ({exc.msg} at character {exc.pos})")
    if answer.schema is None and not isinstance(value, dict):
        return Checked(None, f"(top): a JSON object is required, not {type(value).__name__}")
    if answer.schema is not None:
        validator = Draft202012Validator(answer.schema)
        errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
        if errors:
            where = "/".join(map(str, errors[0].absolute_path)) or "(top)"
            return Checked(None, f"{where}: {errors[0].message}")
    return Checked(value, "", json.dumps(value, ensure_ascii=False) if fenced else text)


def repair_messages(text: str, problem: str) -> tuple[ChatMessage, ChatMessage]:
    """The wrong answer and what is wrong with it, for the one repair."""
    return (
        ChatMessage(role="assistant", content=text),
        ChatMessage(
            role="user",
            content=f"That answer is not valid: {problem}. Answer again with the JSON only.",
        ),
    )

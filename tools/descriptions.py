"""Does a tool's description help the model? Checks for apply_config and the admin.

A model calls a tool well when its description says what it does, when to use
it and when not, what each parameter means, and what comes back (see
../shared/reference/runtime-engineering.zh.txt §2.3). Each problem is one short
sentence naming what is missing, so an operator can fix it in a minute.

The checks judge the description's structure, in whatever language it is written:

1. Length in words, a CJK character counting half a word (a Chinese word is about
   two characters), so a full Chinese sentence is not "too short".
2. The parts a description needs, each found in a clause of its own (clauses end at
   the sentence and clause punctuation of any script: `.;:!?` and `。；：！？`): when to
   use it, when not, what it returns. A part is recognised by the markers of the
   languages the text is written in (`MARKERS`: English and Chinese); a description
   in a language without markers is not judged on them (no false alarm).
3. What the schema says: every parameter described; the result described by
   `result_description` or an output schema, or else by a "returns" clause.
"""

import math
import re
from dataclasses import dataclass
from typing import Any

MIN_WORDS = 6
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
# A run of letters or digits outside the CJK blocks: one word.
WORD = re.compile(r"[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
LATIN = re.compile(r"[A-Za-z]{2,}")
CLAUSE_END = re.compile(r"[.;:!?\n。；：！？]+")


@dataclass(frozen=True)
class Markers:
    """How one language says when to use a tool, when not, and what it returns."""

    when: re.Pattern[str]
    when_not: re.Pattern[str]
    returns: re.Pattern[str]


MARKERS: dict[str, Markers] = {
    "en": Markers(
        when=re.compile(
            r"\b(use (this|it|when|for|to|if|after|before)|call (this|it|when|for|to|if)|"
            r"when (the|a|an|you|someone|asked)|for (questions|requests) about|useful (for|when))\b",
            re.IGNORECASE,
        ),
        when_not=re.compile(
            r"\b(do not|don't|does not|not for|not to|never|instead|only (for|when|if)|avoid|unless)\b",
            re.IGNORECASE,
        ),
        returns=re.compile(r"\b(returns?|answers with|responds with|gives back)\b", re.IGNORECASE),
    ),
    "zh": Markers(
        when=re.compile(r"用于|适用于|适合|用来|时使用|时调用|时用|需要.{0,12}时|使用场景|场景："),
        when_not=re.compile(
            r"不要|不用于|不适用|不适合|请勿|勿用|禁止|不能用|不可用|不应|仅限|只用于|只在|仅在|仅用于|"
            r"除非|而不是|请改用|改用|不是用来"
        ),
        returns=re.compile(r"返回|输出|结果为|结果是|给出"),
    ),
}


def _words(text: str) -> int:
    return len(WORD.findall(text)) + math.ceil(len(CJK.findall(text)) / 2)


def _languages(text: str) -> list[str]:
    """The languages of `text` that have markers: Chinese if it has CJK characters,
    English if it has Latin words (a Chinese description may name things in English)."""
    found = []
    if CJK.search(text):
        found.append("zh")
    if LATIN.search(text):
        found.append("en")
    return found


def _says(clauses: list[str], languages: list[str], part: str) -> bool:
    return any(
        getattr(MARKERS[language], part).search(clause)
        for clause in clauses
        for language in languages
    )


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
    words = _words(text)
    clauses = [c for c in CLAUSE_END.split(text) if c.strip()]
    languages = [lang for lang in _languages(text) if lang in MARKERS]
    if not text:
        problems.append("no description: say what it does and when to use it")
    elif words < MIN_WORDS:
        problems.append(
            f"description is too short ({words} words) to say what it does; write a full sentence"
        )
    if text and languages and not _says(clauses, languages, "when"):
        problems.append("description does not say when to use it (e.g. 'Use when ...')")
    if text and languages and not _says(clauses, languages, "when_not"):
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
    if (
        not result_description.strip()
        and not output_schema
        and not (languages and _says(clauses, languages, "returns"))
    ):
        problems.append("no result description: say what it returns (result_description)")
    return problems


def tool_warnings(name: str, problems: list[str]) -> list[str]:
    """`tool NAME: problem` lines."""
    return [f"tool {name}: {problem}" for problem in problems]

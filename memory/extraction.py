"""Reading memory out of text without a model: subjects, "remember that ...", and the
deterministic extractor the offline rules model uses at the end of a turn.
"""

import json
import re
from dataclasses import dataclass

from .models import MemoryTag

# "remember that ...", "please remember: ...", "don't forget ...", "记住 ...".
_REMEMBER = re.compile(
    r"(?:^|[.!?。！？]\s*|\b(?:please|pls)\s+)(?:remember|don't forget|do not forget|note)"
    r"(?:\s+that)?\s*[:,]?\s+(?P<what>[^.!?。！？\n]{3,500})",
    re.IGNORECASE,
)
_REMEMBER_ZH = re.compile(r"(?:请)?记住[:：,，\s]*(?P<what>[^。！？\n]{2,500})")
# "my favourite colour is blue", "my address: ...", "我的地址是...".
_MY_X_IS = re.compile(
    r"\bmy\s+(?P<subject>[a-z][a-z '-]{1,60}?)\s*(?:is|are|:|=)\s+(?P<value>.+)", re.IGNORECASE
)
_MY_X_IS_ZH = re.compile(r"我的(?P<subject>[^是：:]{1,20})(?:是|：|:)(?P<value>.+)")
_PREFER = re.compile(
    r"\bI\s+(?:prefer|like|love|hate|want|always|never|usually)\b.{3,200}", re.IGNORECASE
)
_AGREED = re.compile(r"\b(?:we|you and I)\s+agreed\b.{3,200}", re.IGNORECASE)


@dataclass(frozen=True)
class Candidate:
    content: str
    tag: str = MemoryTag.FACT
    subject: str = ""
    importance: float = 0.5


def subject_of(content: str) -> str:
    """What the item is about, when the text says it plainly ("my X is ..."); else ""."""
    for pattern in (_MY_X_IS, _MY_X_IS_ZH):
        found = pattern.search(content)
        if found:
            subject = " ".join(found.group("subject").lower().split())
            return subject.replace("favorite", "favourite").replace("color", "colour")
    return ""


def _tag_of(content: str) -> str:
    if _PREFER.search(content) or re.search(r"\b(favou?rite|prefer)", content, re.IGNORECASE):
        return MemoryTag.PREFERENCE
    if _AGREED.search(content):
        return MemoryTag.AGREEMENT
    return MemoryTag.FACT


def explicit_requests(text: str) -> list[Candidate]:
    """What the user asked, in so many words, to be remembered."""
    found: list[Candidate] = []
    for pattern in (_REMEMBER, _REMEMBER_ZH):
        for match in pattern.finditer(text):
            what = match.group("what").strip(" ,;:")
            if what:
                found.append(Candidate(what, _tag_of(what), subject_of(what), importance=0.9))
    return found


def asks_to_remember(text: str) -> bool:
    return bool(_REMEMBER.search(text) or _REMEMBER_ZH.search(text))


def rule_extract(user_texts: list[str]) -> list[Candidate]:
    """The deterministic extraction: sentences stating a preference, an agreement or "my X is Y"."""
    found: list[Candidate] = []
    for text in user_texts:
        for sentence in re.split(r"(?<=[.!?。！？])\s*|\n", text):
            sentence = sentence.strip()
            if not sentence or asks_to_remember(sentence):
                continue  # an explicit request is stored as such
            if _MY_X_IS.search(sentence) or _MY_X_IS_ZH.search(sentence):
                found.append(Candidate(sentence, _tag_of(sentence), subject_of(sentence), 0.6))
            elif _PREFER.search(sentence):
                found.append(Candidate(sentence, MemoryTag.PREFERENCE, "", 0.6))
            elif _AGREED.search(sentence):
                found.append(Candidate(sentence, MemoryTag.AGREEMENT, "", 0.7))
    return found


EXTRACTION_PROMPT = (
    "You maintain a user's long-term memory. From the conversation turn below, list only what "
    "is worth remembering across conversations: stable preferences, facts about the user, "
    "agreements, business conclusions. Skip small talk and anything only relevant now. "
    'Answer with JSON only: {"items": [{"content": str, "tag": "preference"|"fact"|'
    '"agreement"|"business conclusion", "subject": str (what it is about, short), '
    '"importance": 0..1}]}. An empty list is a fine answer.'
)


def parse_extraction(text: str) -> list[Candidate]:
    """The model's JSON answer as candidates; anything malformed is skipped, never raised."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return []
    try:
        items = json.loads(text[start : end + 1]).get("items") or []
    except (ValueError, AttributeError):
        return []
    found: list[Candidate] = []
    for item in items[:20] if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            continue
        content = item["content"].strip()[:2000]
        if not content:
            continue
        try:
            importance = min(1.0, max(0.0, float(item.get("importance", 0.5))))
        except (TypeError, ValueError):
            importance = 0.5
        tag = str(item.get("tag") or MemoryTag.FACT)[:40]
        subject = str(item.get("subject") or "")[:200].strip().lower() or subject_of(content)
        found.append(Candidate(content, tag, subject, importance))
    return found

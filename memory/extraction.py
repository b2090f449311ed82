"""Reading memory out of text without a model: subjects, "remember that ...", and the
deterministic extractor the offline rules model uses at the end of a turn.
"""

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


# Sentences that name their subject without saying "my X": (pattern, the subject).
_NAMED_SUBJECTS = (
    (re.compile(r"\b(?:call me|i am called|i'm called)\s+\w", re.IGNORECASE), "name"),
    (re.compile(r"\bI(?:'ve| have)?\s+(?:live|moved|relocated)\s+(?:in|to)\s+\w", re.IGNORECASE), "home city"),
    (re.compile(r"\bI(?:'m| am)?\s+(?:work(?:ing)?)\s+(?:at|for)\s+\w", re.IGNORECASE), "employer"),
    (re.compile(r"我(?:住在|搬到了?)"), "home city"),
    (re.compile(r"(?:叫我|我叫)"), "name"),
)  # fmt: skip


def subject_of(content: str) -> str:
    """What the item is about, when the text says it plainly; else "".

    "my X is ..." / "我的X是..." name X (spelling normalised: "favorite color" is
    "favourite colour"); a few set phrases name theirs ("call me ..." is the name,
    "I live in / moved to ..." the home city, "I work at ..." the employer).
    """
    for pattern in (_MY_X_IS, _MY_X_IS_ZH):
        found = pattern.search(content)
        if found:
            subject = " ".join(found.group("subject").lower().split())
            subject = subject.removeprefix("the ")
            return subject.replace("favorite", "favourite").replace("color", "colour")
    for named, subject in _NAMED_SUBJECTS:
        if named.search(content):
            return subject
    return ""


def tag_of(content: str) -> str:
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
                found.append(Candidate(what, tag_of(what), subject_of(what), importance=0.9))
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
                found.append(Candidate(sentence, tag_of(sentence), subject_of(sentence), 0.6))
            elif _PREFER.search(sentence):
                found.append(Candidate(sentence, MemoryTag.PREFERENCE, "", 0.6))
            elif _AGREED.search(sentence):
                found.append(Candidate(sentence, MemoryTag.AGREEMENT, "", 0.7))
    return found

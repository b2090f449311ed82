"""Keeping contents out of logs, spans and labels: sizes and hashes instead, and a scrubber.

Code logs what it handles as `digest(value)` (size and a short hash: enough to
tell two payloads apart or find the same one again, not to read it). The
scrubber is the last guard on every formatted log line: API keys and bearer
tokens, email addresses and card numbers (Luhn-checked, so order numbers and
timestamps survive) become `[redacted:<kind>]`.
"""

import hashlib
import json
import re
from typing import Any

# ap_ (ours), sk-/sk_ (OpenAI, Anthropic, Stripe), and the like: a prefix and a long tail.
_KEY = re.compile(r"\b(?:ap|sk|pk|rk|xox[abp]|ghp|gho|glpat)[-_][A-Za-z0-9_\-]{12,}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/\-=]{8,}")
# key=..., "api_key": "...", password: ... (the name stays, the value goes).
_ASSIGNED = re.compile(
    r"(?i)\b(api[_-]?key|access[_-]?token|token|secret|password|authorization)"
    r"([\"']?\s*[:=]\s*[\"']?)(?!\[redacted)[^\s\"',&}]{6,}"
)
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}")
# A card number stands alone: not part of a longer token of letters, digits and hyphens
# (a UUID such as a11d1644-5100-4580-8811-... holds a Luhn-valid 4-4-4-4 run).
_CARD = re.compile(r"(?<![0-9A-Za-z-])(?:\d[ \-]?){12,18}\d(?![0-9A-Za-z-])")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)
        if i % 2:
            n *= 2
            if n > 9:
                n -= 9
        total += n
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return "[redacted:card]" if 13 <= len(digits) <= 19 and _luhn(digits) else match.group(0)


def scrub(text: str) -> str:
    """The text with credentials, email addresses and card numbers replaced."""
    if not text:
        return text
    text = _KEY.sub("[redacted:key]", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}[redacted:key]", text)
    text = _ASSIGNED.sub(lambda m: f"{m.group(1)}{m.group(2)}[redacted:key]", text)
    text = _EMAIL.sub("[redacted:email]", text)
    return _CARD.sub(_card, text)


def scrub_value(value: Any) -> Any:
    """`scrub` applied to every string inside a JSON-like value."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_value(v) for v in value]
    return value


def digest(value: Any) -> str:
    """`<size in bytes>B:<first 12 hex digits of its SHA-256>`, of the value's canonical JSON."""
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, str):
        raw = value.encode()
    else:
        raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return f"{len(raw)}B:{hashlib.sha256(raw).hexdigest()[:12]}"

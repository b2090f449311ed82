"""An offline token estimate, good enough for budgets and usage when a provider reports none.

Latin text runs about four characters a token in common BPE vocabularies; CJK and
other non-ASCII characters are closer to one token each. We round up so a
budget built on the estimate errs on the safe side.
"""

import math


def count_tokens(text: str) -> int:
    if not text:
        return 0
    if text.isascii():
        return math.ceil(len(text) / 4)
    # Counting in C: encoding to ASCII with errors ignored keeps exactly the ASCII characters.
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


MESSAGE_OVERHEAD_TOKENS = 4  # role and separators, as chat formats add


def count_message_tokens(content: str, extra: str = "") -> int:
    return MESSAGE_OVERHEAD_TOKENS + count_tokens(content) + count_tokens(extra)

"""Retry policies of tools and model endpoints: how many attempts, how long between them,
after which errors, and how a server's `Retry-After` is honoured.

A policy is stored as a JSON object on the tool (`Tool.retry`) or the model endpoint
(`ModelEndpoint.retry`); missing keys take the defaults of that kind:

    {"attempts": 3, "backoff_base_s": 0.5, "backoff_max_s": 20,
     "on": ["timeout", "connect", "5xx", "429"], "retry_after_max_s": 60}

- `attempts`: calls in all, the first included (1 = never retried).
- The wait before attempt n+1 is `backoff_base_s * 2**(n-1)`, at most `backoff_max_s`,
  times a random factor between 0.5 and 1 (jitter: callers that failed together do not
  come back together).
- `on`: the errors worth another attempt: `timeout` (no answer in time), `connect`
  (the connection failed or broke off), `5xx` (a server error), `429` (rate limited).
- A `Retry-After` header (seconds or an HTTP date) replaces the backoff; one asking
  for more than `retry_after_max_s` ends the retries (retrying sooner is refused again).

Pure Python (no Django), so the configuration checks, the executor and the adapters share it.
"""

import datetime
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ERROR_KINDS = ("timeout", "connect", "5xx", "429")
KEYS = ("attempts", "backoff_base_s", "backoff_max_s", "on", "retry_after_max_s")
MAX_ATTEMPTS = 10
MAX_WAIT_S = 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 2
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    on: frozenset[str] = field(default_factory=lambda: frozenset(ERROR_KINDS))
    retry_after_max_s: float = 60.0

    def wait_s(
        self, failed_attempts: int, retry_after_s: float | None, rng: random.Random | None = None
    ) -> float | None:
        """The wait before the next attempt after `failed_attempts` failures; None: no more.

        1. No attempts left: None.
        2. A server's Retry-After within `retry_after_max_s` is the wait; beyond it, None.
        3. Otherwise the exponential backoff, capped, with jitter.
        """
        if failed_attempts >= self.attempts:
            return None
        if retry_after_s is not None:
            return retry_after_s if retry_after_s <= self.retry_after_max_s else None
        backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** (failed_attempts - 1))
        return backoff * (rng or random).uniform(0.5, 1.0)  # noqa: S311 - jitter, not security

    def retries(self, kind: str | None) -> bool:
        return kind is not None and kind in self.on


TOOL_DEFAULT = RetryPolicy()
# A model endpoint is not retried by default: the agent's fallback model is the second try.
MODEL_DEFAULT = RetryPolicy(attempts=1, on=frozenset({"connect", "5xx", "429"}))


def retry_policy(value: Mapping[str, Any] | None, default: RetryPolicy) -> RetryPolicy:
    """The policy a stored JSON object describes (checked by `retry_policy_problems`)."""
    if not value:
        return default
    return RetryPolicy(
        attempts=int(value.get("attempts", default.attempts)),
        backoff_base_s=float(value.get("backoff_base_s", default.backoff_base_s)),
        backoff_max_s=float(value.get("backoff_max_s", default.backoff_max_s)),
        on=frozenset(value["on"]) if "on" in value else default.on,
        retry_after_max_s=float(value.get("retry_after_max_s", default.retry_after_max_s)),
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def retry_policy_problems(value: Any) -> list[str]:
    """What is wrong with a stored retry policy (empty when it is usable)."""
    if value is None or value == {}:
        return []
    if not isinstance(value, Mapping):
        return ['must be an object such as {"attempts": 3, "on": ["5xx", "429"]}']
    problems = [
        f"unknown key '{key}' (known: {', '.join(KEYS)})" for key in value if key not in KEYS
    ]
    attempts = value.get("attempts", 1)
    if (
        not isinstance(attempts, int)
        or isinstance(attempts, bool)
        or not 1 <= attempts <= MAX_ATTEMPTS
    ):
        problems.append(f"'attempts' must be a whole number from 1 to {MAX_ATTEMPTS}")
    for key in ("backoff_base_s", "backoff_max_s", "retry_after_max_s"):
        if key in value and (not _number(value[key]) or not 0 <= value[key] <= MAX_WAIT_S):
            problems.append(f"'{key}' must be a number of seconds from 0 to {MAX_WAIT_S:g}")
    base, top = value.get("backoff_base_s", 0), value.get("backoff_max_s", MAX_WAIT_S)
    if _number(base) and _number(top) and base > top:
        problems.append("'backoff_base_s' must not be above 'backoff_max_s'")
    kinds = value.get("on", [])
    if not isinstance(kinds, list) or any(k not in ERROR_KINDS for k in kinds):
        problems.append(f"'on' must be a list of: {', '.join(ERROR_KINDS)}")
    return problems


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A `Retry-After` header in seconds: a number of seconds or an HTTP date; None when absent
    or unreadable (the error still counts, with the policy's own backoff)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)  # HTTP dates are GMT
        seconds = parsed.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN, infinity
        return None
    return max(0.0, seconds)

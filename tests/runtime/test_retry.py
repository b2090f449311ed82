"""runtime/retry.py: the waits a policy gives, how Retry-After is read, what a stored policy may say."""

import email.utils
import random

from runtime.retry import (
    MODEL_DEFAULT,
    TOOL_DEFAULT,
    RetryPolicy,
    parse_retry_after,
    retry_policy,
    retry_policy_problems,
)


def test_the_backoff_doubles_up_to_its_cap_with_jitter_and_ends_with_the_attempts() -> None:
    policy = RetryPolicy(attempts=5, backoff_base_s=1, backoff_max_s=3)
    rng = random.Random(7)
    waits = [policy.wait_s(n, None, rng) for n in (1, 2, 3, 4)]
    for wait, full in zip(waits, (1, 2, 3, 3), strict=True):
        assert wait is not None and full * 0.5 <= wait <= full
    assert policy.wait_s(5, None) is None


def test_retry_after_is_the_wait_within_the_cap_and_ends_the_retries_beyond_it() -> None:
    policy = RetryPolicy(attempts=3, retry_after_max_s=10)
    assert policy.wait_s(1, 4.0) == 4.0
    assert policy.wait_s(1, 11.0) is None
    assert policy.wait_s(3, 1.0) is None  # no attempts left


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after("120") == 120.0  # not capped here: the policy decides
    now = 1_800_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("nan") is None and parse_retry_after("inf") is None


def test_stored_policies_take_the_defaults_of_their_kind() -> None:
    assert retry_policy({}, TOOL_DEFAULT) == TOOL_DEFAULT
    assert retry_policy(None, MODEL_DEFAULT).attempts == 1
    policy = retry_policy({"attempts": 4, "on": ["429"]}, TOOL_DEFAULT)
    assert (policy.attempts, policy.on, policy.backoff_max_s) == (4, {"429"}, 30.0)


def test_policy_problems_name_the_key() -> None:
    assert retry_policy_problems({}) == [] and retry_policy_problems(None) == []
    assert retry_policy_problems({"attempts": 3, "on": ["5xx"], "backoff_max_s": 5}) == []
    assert retry_policy_problems([1]) == [
        'must be an object such as {"attempts": 3, "on": ["5xx", "429"]}'
    ]
    assert retry_policy_problems({"attempts": True}) == [
        "'attempts' must be a whole number from 1 to 10"
    ]
    assert retry_policy_problems({"on": "5xx"}) == [
        "'on' must be a list of: timeout, connect, 5xx, 429"
    ]

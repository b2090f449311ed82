"""apply_config sets the retry policies of tools and model endpoints; a wrong one changes nothing
and says which entry and field."""

import pytest

from configuration.services import ConfigInvalid, config_apply
from record.models import ModelEndpoint
from tools.execution import ToolSnapshot
from tools.models import Tool

pytestmark = pytest.mark.django_db

DOCUMENT = {
    "models": [
        {"name": "main", "api": "rules", "retry": {"attempts": 3, "on": ["5xx", "429"]}},
    ],
    "tools": [
        {
            "name": "refund",
            "description": "Refund an order.",
            "kind": "python",
            "handler": "builtin.current_time",
            "retry": {"attempts": 4, "backoff_base_s": 1, "backoff_max_s": 8},
        }
    ],
}


def test_retry_policies_apply_and_reach_the_executor() -> None:
    config_apply(document=DOCUMENT)
    assert ModelEndpoint.objects.get(name="main").retry == {"attempts": 3, "on": ["5xx", "429"]}
    tool = Tool.objects.get(name="refund")
    policy = ToolSnapshot.from_model(tool).retry
    assert (policy.attempts, policy.backoff_base_s, policy.backoff_max_s) == (4, 1.0, 8.0)
    assert policy.on == {"timeout", "connect", "5xx", "429"}  # the default kinds


@pytest.mark.parametrize(
    ("kind", "retry", "message"),
    [
        ("tools", {"attempts": 0}, "tools[0] (refund).retry: 'attempts' must be a whole number"),
        ("tools", {"on": ["teapot"]}, "tools[0] (refund).retry: 'on' must be a list of"),
        ("tools", {"tries": 2}, "tools[0] (refund).retry: unknown key 'tries'"),
        (
            "models",
            {"backoff_base_s": 10, "backoff_max_s": 1},
            "models[0] (main).retry: 'backoff_base_s' must not be above 'backoff_max_s'",
        ),
        ("models", {"retry_after_max_s": -1}, "models[0] (main).retry: 'retry_after_max_s' must"),
    ],
)
def test_a_wrong_retry_policy_changes_nothing_and_says_where(kind, retry, message) -> None:  # type: ignore[no-untyped-def]
    document = {**DOCUMENT, kind: [{**DOCUMENT[kind][0], "retry": retry}]}
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=document)
    assert message in str(error.value), str(error.value)
    assert not Tool.objects.exists() and not ModelEndpoint.objects.exists()

"""apply_config sets how a model's tokens are counted; a wrong tokenizer changes nothing."""

from typing import Any

import pytest

from configuration.services import ConfigInvalid, config_apply
from engine.model.calls import endpoint_tokenizer
from record.models import ModelEndpoint

pytestmark = pytest.mark.django_db

MODEL = {"name": "main", "api": "openai", "base_url": "http://127.0.0.1:9/v1"}


def test_a_tokenizer_and_its_ratio_apply_and_can_be_cleared() -> None:
    config_apply(document={"models": [{**MODEL, "tokenizer": "cl100k_base"}]})
    endpoint = ModelEndpoint.objects.get(name="main")
    assert endpoint_tokenizer(endpoint).key == "cl100k_base"

    config_apply(document={"models": [{**MODEL, "tokenizer": "estimate", "tokenizer_ratio": 2.5}]})
    endpoint.refresh_from_db()
    assert (endpoint.tokenizer, endpoint.tokenizer_ratio) == ("estimate", 2.5)
    assert endpoint_tokenizer(endpoint).key == "estimate:2.5"

    config_apply(document={"models": [{**MODEL, "tokenizer": "", "tokenizer_ratio": None}]})
    endpoint.refresh_from_db()
    assert endpoint_tokenizer(endpoint).key == "o200k_base"  # openai's default


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenizer": "p50k_base"}, "models[0] (main).tokenizer"),
        ({"tokenizer": "estimate", "tokenizer_ratio": 0.1}, "models[0] (main).tokenizer_ratio"),
        ({"tokenizer": "estimate", "tokenizer_ratio": "4"}, "models[0] (main).tokenizer_ratio"),
        (
            {"tokenizer": "o200k_base", "tokenizer_ratio": 3},
            "models[0] (main).tokenizer_ratio: only with tokenizer: estimate "
            "(this model's tokenizer is o200k_base)",
        ),
        (
            {"tokenizer_ratio": 3},
            "models[0] (main).tokenizer_ratio: only with tokenizer: estimate "
            "(this model's tokenizer is its api default)",
        ),
    ],
)
def test_a_wrong_tokenizer_field_changes_nothing_and_says_where(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document={"models": [{**MODEL, **change}]})
    assert message in str(error.value), str(error.value)
    assert not ModelEndpoint.objects.exists()

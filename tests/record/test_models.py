"""Model-level validation the admin's forms run (full_clean)."""

import pytest
from django.core.exceptions import ValidationError

from record.models import ModelEndpoint


@pytest.mark.parametrize(
    ("tokenizer", "ratio", "field"),
    [
        ("o200k_base", 3.0, "tokenizer_ratio"),
        ("", 3.0, "tokenizer_ratio"),
        ("estimate", 0.2, "tokenizer_ratio"),
        ("estimate", 11, "tokenizer_ratio"),
        ("p50k_base", None, "tokenizer"),
    ],
)
def test_an_endpoints_tokenizer_fields_are_checked(tokenizer: str, ratio: float | None, field: str):
    endpoint = ModelEndpoint(name="m", api="rules", tokenizer=tokenizer, tokenizer_ratio=ratio)
    with pytest.raises(ValidationError) as error:
        endpoint.full_clean(validate_unique=False)
    assert field in error.value.message_dict


@pytest.mark.parametrize(
    ("tokenizer", "ratio"), [("", None), ("cl100k_base", None), ("estimate", 2.5)]
)
def test_usable_tokenizer_fields_pass(tokenizer: str, ratio: float | None):
    ModelEndpoint(name="m", api="rules", tokenizer=tokenizer, tokenizer_ratio=ratio).full_clean(
        validate_unique=False
    )

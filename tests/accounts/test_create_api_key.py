"""`manage.py create_api_key --max-value`: the operator's grant of session values above an
agent's own."""

import io

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiKey

pytestmark = pytest.mark.django_db


def _create(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "--user", "alice", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_max_value_is_stored_on_the_key_and_said():
    out, err = _create("--roles", "support", "--max-value", "16")
    key = ApiKey.objects.get(prefix=out.strip()[:10])
    assert key.max_value == 16.0
    assert "max value 16" in err


def test_without_max_value_the_key_has_no_grant():
    out, _ = _create("--roles", "support")
    assert ApiKey.objects.get(prefix=out.strip()[:10]).max_value is None


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_negative_or_non_finite_max_value_is_refused(bad):
    with pytest.raises(CommandError, match="max_value"):
        _create("--max-value", bad)
    assert not ApiKey.objects.exists()

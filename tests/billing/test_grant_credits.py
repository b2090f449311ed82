"""`python manage.py grant_credits`."""

import pytest
from django.core.management import CommandError, call_command

from billing.models import CreditAccount, CreditLedger
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_grant_adds_points_sets_the_cap_and_records_who(capsys):
    user = UserFactory(username="zoe")
    call_command("grant_credits", "--user", "zoe", "--points", "100", "--daily-cap", "30")
    call_command("grant_credits", "--user", "zoe", "--points", "5")
    account = CreditAccount.objects.get(owner=user)
    assert (account.balance, account.daily_cap) == (105, 30)  # a later grant keeps the cap
    entries = CreditLedger.objects.filter(account=account).order_by("id")
    assert [(e.kind, e.delta, e.balance_after) for e in entries] == [
        ("grant", 100, 100),
        ("grant", 5, 105),
    ]
    assert all(e.actor.startswith("cli:") for e in entries)
    assert "zoe: balance 105 (0 reserved), daily cap 30" in capsys.readouterr().out


def test_an_unknown_user_or_negative_points_change_nothing():
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("grant_credits", "--user", "nobody", "--points", "5")
    UserFactory(username="yan")
    with pytest.raises(CommandError):
        call_command("grant_credits", "--user", "yan", "--points", "-5")
    assert not CreditAccount.objects.exists()

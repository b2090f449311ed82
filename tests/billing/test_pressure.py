"""The owner's figures before a model call (billing/pressure.py): a month's and an API
key's spend are the sums of their period's daily rollups, so a new period starts at zero."""

from datetime import timedelta
from decimal import Decimal

import pytest

from billing.budgets import Budget, Spent
from billing.models import KeyBudget, OwnerBudget
from billing.notices import billing_today
from billing.pressure import owner_figures, owner_watch_reset, owner_watched
from record.models import ModelCall
from tests.factories import (
    SessionFactory,
    SpendDailyFactory,
    UsageDailyFactory,
    UserFactory,
    api_key_for,
)

pytestmark = pytest.mark.django_db


def _figures(session, api_key_id=None):  # type: ignore[no-untyped-def]
    return owner_figures(
        owner_id=session.owner_id,
        agent_id=session.agent_id,
        session_id=session.pk,
        turn=1,
        session_spent=Spent(),
        model_call_table=ModelCall._meta.db_table,
        api_key_id=api_key_id,
    )


def _budget(figures, who: str, period: str):  # type: ignore[no-untyped-def]
    return next((spent for b, spent in figures.budgets if (b.who, b.period) == (who, period)), None)


def test_the_month_budget_counts_this_months_days_only() -> None:
    today = billing_today()
    first = today.replace(day=1)
    session = SessionFactory()
    owner, agent = session.owner, session.agent
    OwnerBudget.objects.create(owner=owner, month_tokens=10_000, month_cost=Decimal(5))
    # Today, the month's first day (another shard: it may be today) and the last day of
    # the month before, which a new month no longer counts.
    UsageDailyFactory(owner=owner, agent=agent, day=today, input_tokens=100, cost=Decimal(1))
    UsageDailyFactory(owner=owner, agent=agent, day=first, shard=7, output_tokens=20,
                      cost=Decimal("0.5"))  # fmt: skip
    UsageDailyFactory(owner=owner, agent=agent, day=first - timedelta(days=1),
                      input_tokens=5000, cost=Decimal(4))  # fmt: skip
    UsageDailyFactory(agent=agent, day=today, input_tokens=999)  # another owner

    figures = _figures(session)

    assert _budget(figures, "owner", "month") == Spent(120, Decimal("1.5"))
    budget = next(b for b, _ in figures.budgets if b.period == "month")
    assert budget == Budget("owner", "month", 10_000, Decimal(5))
    day_tokens = 100 + (20 if first == today else 0)
    assert _budget(figures, "owner", "day").tokens == day_tokens


@pytest.mark.parametrize("period", ["day", "month"])
def test_a_key_budget_counts_the_keys_spend_of_its_period(period: str) -> None:
    today = billing_today()
    first = today.replace(day=1)
    owner = UserFactory(username=f"keyed-{period}")
    api_key_for(owner.username)
    key = owner.api_keys.get()
    session = SessionFactory(owner=owner, api_key_id=key.pk)
    KeyBudget.objects.create(api_key=key, owner=owner, period=period, tokens=1000)
    SpendDailyFactory(owner=owner, api_key_id=key.pk, day=today, input_tokens=30,
                      cost=Decimal("0.3"))  # fmt: skip
    SpendDailyFactory(owner=owner, api_key_id=key.pk, day=first, shard=6, input_tokens=7,
                      endpoint="other")  # fmt: skip
    SpendDailyFactory(owner=owner, api_key_id=key.pk, day=first - timedelta(days=1),
                      input_tokens=500)  # fmt: skip
    SpendDailyFactory(owner=owner, api_key_id=key.pk + 1000, day=today, input_tokens=400)

    figures = _figures(session, api_key_id=key.pk)

    spent = _budget(figures, "API key", period)
    if period == "month" or first == today:
        assert spent == Spent(37, Decimal("0.3"))
    else:
        assert spent == Spent(30, Decimal("0.3"))
    # A session of another key (or none) is not judged by this key's budget.
    assert _budget(_figures(session, api_key_id=None), "API key", period) is None


def test_a_key_budget_makes_its_owner_watched() -> None:
    owner = UserFactory(username="watched-by-key")
    api_key_for(owner.username)
    owner_watch_reset()
    assert owner_watched(owner_id=owner.pk) is False
    KeyBudget.objects.create(api_key=owner.api_keys.get(), owner=owner, tokens=5)
    owner_watch_reset()
    assert owner_watched(owner_id=owner.pk) is True

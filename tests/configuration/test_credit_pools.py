"""apply_config sets credit pools (global and per tenant) and tools' value and cost
estimates; a wrong one is named by entry and field and changes nothing."""

import copy

import pytest

from billing.models import CreditPool
from configuration.services import ConfigInvalid, config_apply
from tests.factories import UserFactory
from tools.models import Tool

pytestmark = pytest.mark.django_db

DOCUMENT = {
    "models": [{"name": "main", "api": "rules"}],
    "tools": [
        {
            "name": "issue_coupon",
            "description": "Issue a coupon to a customer.",
            "kind": "python",
            "handler": "builtin.current_time",
            "credit_cost": 50,
            "value": "double(args.amount) * 3.0",
            "cost": "double(args.amount)",
        }
    ],
    "agents": [{"slug": "support", "model": "main", "tools": ["issue_coupon"]}],
    "credit_pools": [
        {"name": "global", "size": 500},
        {"name": "acme", "owner": "acme", "size": 100},
    ],
}


def _document(**changes):  # type: ignore[no-untyped-def]
    document = copy.deepcopy(DOCUMENT)
    for path, value in changes.items():
        kind, index, field = path.split("__")
        document[kind][int(index)][field] = value
    return document


def test_pools_and_estimates_apply_and_a_second_apply_changes_the_size_only() -> None:
    acme = UserFactory(username="acme")
    report = config_apply(document=DOCUMENT)
    assert "credit pool global: created" in report and "credit pool acme: created" in report
    tool = Tool.objects.get(name="issue_coupon")
    assert (tool.value, tool.cost) == ("double(args.amount) * 3.0", "double(args.amount)")
    pools = {p.name: (p.owner_id, p.size, p.enabled) for p in CreditPool.objects.all()}
    assert pools == {"global": (None, 500, True), "acme": (acme.pk, 100, True)}
    CreditPool.objects.filter(name="acme").update(in_use=40)
    report = config_apply(document=_document(credit_pools__1__size=60))
    assert "credit pool acme: updated (size)" in report
    assert CreditPool.objects.values_list("size", "in_use").get(name="acme") == (60, 40)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        (
            {"tools__0__value": "double(args.amount) *"},
            "tools[0] (issue_coupon).value: CEL syntax error",
        ),
        (
            {"tools__0__cost": "order.total"},
            "tools[0] (issue_coupon).cost: names order; it may read args, session",
        ),
        (
            {"tools__0__value": "[1,2].map(a, [1,2].map(b, [1,2].map(c, [1,2].map(d, a))))"},
            "tools[0] (issue_coupon).value: expression_limit:",
        ),
        ({"tools__0__cost": ""}, "tools[0] (issue_coupon).cost:"),
        ({"credit_pools__0__size": 0}, "credit_pools[0] (global).size:"),
        ({"credit_pools__0__size": -5}, "credit_pools[0] (global).size:"),
        ({"credit_pools__0__size": 10**13}, "credit_pools[0] (global).size:"),
        ({"credit_pools__0__size": "many"}, "credit_pools[0] (global).size:"),
        (
            {"credit_pools__1__owner": "nobody"},
            "credit_pools[1] (acme).owner: unknown user 'nobody'",
        ),
        (
            {"credit_pools__1__owner": None},
            "credit_pools[1] (acme).owner:",
        ),
    ],
)
def test_a_wrong_estimate_or_pool_is_named_and_changes_nothing(changes, error) -> None:  # type: ignore[no-untyped-def]
    UserFactory(username="acme")
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=_document(**changes))
    assert any(e.startswith(error) for e in info.value.errors), info.value.errors
    assert not Tool.objects.exists() and not CreditPool.objects.exists()


def test_a_second_global_pool_or_a_tenants_second_pool_is_refused() -> None:
    UserFactory(username="acme")
    document = _document()
    document["credit_pools"] += [
        {"name": "shared", "size": 5},
        {"name": "acme2", "owner": "acme", "size": 5},
    ]
    with pytest.raises(ConfigInvalid) as info:
        config_apply(document=document)
    assert info.value.errors == [
        "credit_pools[2] (shared).owner: the platform (no owner) already has the credit pool 'global'",
        "credit_pools[3] (acme2).owner: user 'acme' already has the credit pool 'acme'",
    ]

from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from .models import Customer, Order

DEMO_CUSTOMERS = [
    ("Ada Lovelace", "ada@example.com"),
    ("Grace Hopper", "grace@example.com"),
    ("Alan Turing", "alan@example.com"),
    ("Barbara Liskov", "barbara@example.com"),
]
# (customer index, days ago, logistics status, reason)
DEMO_ORDERS = [
    (0, 2, "exception", "parcel held at customs"),
    (1, 3, "exception", "carrier lost track of the parcel"),
    (2, 4, "ok", ""),
    (3, 5, "exception", "address could not be found"),
    (0, 20, "exception", "damaged in transit"),
    (1, 1, "ok", ""),
]


@transaction.atomic
def demo_data_seed() -> int:
    """Create the demo customers and orders once; return how many orders were added."""
    if Order.objects.exists():
        return 0
    now = timezone.now()
    customers = [Customer.objects.create(name=n, email=e) for n, e in DEMO_CUSTOMERS]
    for i, (ci, days, status, reason) in enumerate(DEMO_ORDERS, start=1):
        Order.objects.create(
            number=f"SO-{1000 + i}",
            customer=customers[ci],
            placed_at=now - timedelta(days=days),
            amount=Decimal("49.90") + i,
            logistics_status=status,
            exception_reason=reason,
        )
    return len(DEMO_ORDERS)


def demo_operator_ensure() -> str | None:
    """Create the demo operator (superuser) once; return its new password, or None if it existed."""
    import secrets

    from django.contrib.auth import get_user_model

    users = get_user_model()
    if users.objects.filter(username="operator").exists():
        return None
    password = secrets.token_urlsafe(12)
    users.objects.create_superuser(
        username="operator", email="operator@example.com", password=password
    )
    return password


def demo_api_key_ensure() -> str | None:
    """Issue the demo API key once (roles: support); return it, or None if one exists."""
    from accounts.models import ApiKey
    from accounts.services import api_key_create

    if ApiKey.objects.filter(name="demo", owner__username="demo").exists():
        return None
    return api_key_create(username="demo", roles=["support"], name="demo").raw

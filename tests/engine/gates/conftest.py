"""Credits and usage through a run: the billing tests' paid agent and side effects."""

from tests.billing.conftest import effects, fake_endpoint, paid_agent  # noqa: F401

from django.db.models import Q, QuerySet

from .models import Tool


def tools_for_roles(*, roles: list[str]) -> QuerySet[Tool]:
    """Enabled tools a caller holding any of these roles may use (a tool with no roles is open to all)."""
    return Tool.objects.filter(Q(roles__overlap=roles) | Q(roles=[]), enabled=True).order_by("name")

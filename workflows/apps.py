from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.test.signals import setting_changed

_SETTINGS = {
    "EXPRESSION_COST_LIMIT": "expression_cost",
    "EXPRESSION_MAX_NESTING": "expression_nesting",
    "WORKFLOW_MAX_NODES": "nodes",
    "WORKFLOW_MAX_VISITS": "visits",
    "WORKFLOW_MAX_BRANCHES": "branches",
    "WORKFLOW_MAX_MAP_CONCURRENCY": "map_concurrency",
}


def _limits_load(**_: Any) -> None:
    """Copy the limit settings into the (Django-free) definitions; compiled expressions were
    judged by the old ones, so they are compiled again."""
    from workflows.expressions import expression_compile
    from workflows.limits import limits_set

    limits_set(**{field: getattr(settings, name) for name, field in _SETTINGS.items()})
    expression_compile.cache_clear()


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        _limits_load()
        setting_changed.connect(_limits_changed)


def _limits_changed(*, setting: str, **_: Any) -> None:
    if setting in _SETTINGS:
        _limits_load()

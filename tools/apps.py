from django.apps import AppConfig
from django.core import checks

from runtime import egress


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Built-in handlers register themselves on import.
        from . import builtin  # noqa: F401

        # An EGRESS_ALLOW entry that means nothing is an error in `manage.py check`.
        checks.register(egress.check)

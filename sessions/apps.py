from django.apps import AppConfig
from django.core import checks

from runtime import fastpaths


class AgentSessionsConfig(AppConfig):
    name = "sessions"
    # django.contrib.sessions owns the label "sessions".
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the Celery tasks in every process (web too), so that
        # services can enqueue them by name with delay_on_commit.
        from . import tasks  # noqa: F401

        # A library upgrade that turns a fast path off says so in `manage.py check`.
        checks.register(fastpaths.check)

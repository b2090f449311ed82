from django.apps import AppConfig
from django.core import checks

from runtime import fastpaths


class RecordConfig(AppConfig):
    name = "record"
    # The label the tables and the migration history were made under (the record lived in
    # sessions/ before); django.contrib.sessions owns the label "sessions".
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A library upgrade that turns a fast path off says so in `manage.py check`.
        checks.register(fastpaths.check)

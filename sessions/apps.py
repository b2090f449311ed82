from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """The front door: no models (they are the record's); installed for its admin, its Celery
    tasks and its management commands."""

    name = "sessions"
    # django.contrib.sessions owns the label "sessions", the record "agent_sessions".
    label = "sessions_front"

    def ready(self) -> None:
        # Register the Celery tasks in every process (web too), so that
        # services can enqueue them by name with delay_on_commit.
        from . import tasks  # noqa: F401

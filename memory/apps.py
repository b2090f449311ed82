from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the Celery task in every process (web too): the write path
        # enqueues the owner-index build by name.
        from . import tasks  # noqa: F401

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each process (daphne, worker, beat, manage.py) sets its exporter up once, here:
        # off (and nothing of the SDK imported) unless the OTEL_* variables ask for it.
        from . import tracing

        tracing.configure()

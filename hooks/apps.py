from django.apps import AppConfig


class HooksConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "hooks"
    verbose_name = "Schedules and run webhooks"

"""Print the configuration reference (docs/configuration-reference.md) from the schema."""

from typing import Any

from django.core.management.base import BaseCommand

from configuration.reference import reference_markdown


class Command(BaseCommand):
    help = "Print the configuration reference generated from apply_config's schema."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(reference_markdown(), ending="")

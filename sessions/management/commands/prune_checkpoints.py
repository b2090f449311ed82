from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from sessions.services import checkpoints_prune


class Command(BaseCommand):
    help = "Delete checkpoints of finished turns older than the retention age (the latest per session is kept)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=float,
            default=None,
            help=f"Default: CHECKPOINT_RETENTION_DAYS ({settings.CHECKPOINT_RETENTION_DAYS:g}).",
        )

    def handle(self, *args: object, **options: object) -> None:
        days = options["older_than_days"]
        deleted = checkpoints_prune(older_than_days=float(days) if days is not None else None)  # type: ignore[arg-type]
        self.stdout.write(f"deleted {deleted} checkpoint(s)")

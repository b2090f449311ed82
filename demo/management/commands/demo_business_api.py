import contextlib

from django.core.management.base import BaseCommand, CommandParser

from demo.business_api import serve


class Command(BaseCommand):
    help = "Serve the demo business API (coupons, orders) that the demo's HTTP tools call."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765)

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(f"demo business API on http://{options['host']}:{options['port']}/")
        with contextlib.suppress(KeyboardInterrupt):
            serve(str(options["host"]), int(str(options["port"])))

import os
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from demo.services import demo_api_key_ensure, demo_data_seed, demo_operator_ensure


def _credentials_merge(path: Path, values: dict[str, str]) -> None:
    """Add KEY=value lines to a private (mode 600) file, keeping the keys already there."""
    lines = [
        line
        for line in (path.read_text().splitlines() if path.exists() else [])
        if line.partition("=")[0] not in values
    ]
    lines += [f"{key}={value}" for key, value in values.items()]
    # Created 600 from the start: the password never sits in a world-readable file.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    path.chmod(0o600)


class Command(BaseCommand):
    help = "Seed the demo business data, the operator account and a demo API key (each only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--credentials-file",
            default="",
            help="write a new password and key to this file (mode 600) instead of printing them",
        )
        # `make run` prepares everything in this one process: each Django start-up costs
        # ~2 s of CPU, and migrate, apply_config and the bootstrap were three of them.
        parser.add_argument("--migrate", action="store_true", help="apply pending migrations first")
        parser.add_argument(
            "--config",
            default="",
            help="then apply this configuration file, as `manage.py apply_config FILE` does",
        )
        parser.add_argument(
            "--no-url-check",
            action="store_true",
            help="with --config: do not check that HTTP tools' URLs accept connections",
        )

    def handle(self, *args: object, **options: object) -> None:
        if options["migrate"]:
            call_command("migrate", interactive=False, verbosity=options["verbosity"])
        if options["config"]:
            call_command(
                "apply_config",
                str(options["config"]),
                no_url_check=bool(options["no_url_check"]),
                stdout=self.stdout,
                stderr=self.stderr,
            )
        target = Path(str(options["credentials_file"])) if options["credentials_file"] else None
        added = demo_data_seed()
        if added:
            self.stdout.write(f"demo data: {added} orders created")
        created: dict[str, str] = {}
        password = demo_operator_ensure()
        if password:
            created.update(OPERATOR_USERNAME="operator", OPERATOR_PASSWORD=password)
            if target is None:
                self.stdout.write(
                    f"operator account (admin): username 'operator', password '{password}'  <- shown once"
                )
        else:
            self.stdout.write(
                "operator account 'operator' already exists (reset: manage.py changepassword operator)"
            )
        key = demo_api_key_ensure()
        if key:
            created["DEMO_API_KEY"] = key
            if target is None:
                self.stdout.write(
                    f"demo API key (user 'demo', role 'support'): {key}  <- shown once"
                )
        else:
            self.stdout.write(
                "demo API key already issued (new one: manage.py create_api_key --user demo --roles support)"
            )
        if target is not None and created:
            _credentials_merge(target, created)
            self.stdout.write(f"new credentials written to {target} (shown when the stack is up)")

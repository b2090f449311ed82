from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import command_actor
from configuration.documents import DocumentInvalid, document_entries_text, document_load
from configuration.services import ConfigInvalid, config_apply


class Command(BaseCommand):
    help = "Create or update model endpoints, tools and agents from a YAML or JSON file, in one transaction."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument(
            "--no-url-check",
            action="store_true",
            help=(
                "Do not check that HTTP tools' URLs accept connections (e.g. their service starts "
                "later); an MCP server that cannot be asked for its tools is then a warning."
            ),
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            help=(
                "Tool descriptions that do not help the model are errors, not warnings "
                "(as the TOOL_DESCRIPTIONS_STRICT setting does); nothing is applied."
            ),
        )
        parser.add_argument(
            "--actor",
            default="",
            help=(
                "Who applies the file, for the audit trail's entry of this run, e.g. "
                "ci:release-42 (default deploy:<the OS user running the command>)."
            ),
        )
        parser.add_argument(
            "--override-rollout-gate",
            action="store_true",
            help=(
                "Raise an agent's candidate_percent although its rollout gate finds no passing "
                "evaluation of the candidate; each such raise is audited as an override."
            ),
        )

    def handle(self, *args: object, **options: object) -> None:
        path = Path(str(options["file"]))
        try:
            text = path.read_text()
        except OSError as exc:
            raise CommandError(f"{path}: cannot read ({exc.strerror})") from None
        try:
            document = document_load(text, as_json=path.suffix == ".json")
        except DocumentInvalid as exc:
            raise CommandError(f"{path}: {exc}") from None
        try:
            report = config_apply(
                document=document or {},
                check_urls=not options["no_url_check"],
                strict=True if options["strict"] else None,
                # -v 2 and up: each MCP tool's description warning, not just their count.
                each_mcp_warning=int(str(options["verbosity"])) >= 2,
                actor=command_actor(given=str(options["actor"] or ""), prefix="deploy"),
                source=str(path),
                override_rollout_gate=bool(options["override_rollout_gate"]),
                texts={} if path.suffix == ".json" else document_entries_text(text, "workflows"),
            )
        except ConfigInvalid as exc:
            lines = "\n".join(f"  - {e}" for e in exc.errors)
            raise CommandError(f"{path}: nothing was changed; fix these:\n{lines}") from None
        for line in report:
            if line.startswith("warning: "):
                self.stderr.write(self.style.WARNING(line))
            else:
                self.stdout.write(line)

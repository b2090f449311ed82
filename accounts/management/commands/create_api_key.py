from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.services import api_key_create, approver_grant, unknown_roles
from audit.services import command_actor


class Command(BaseCommand):
    help = "Create an API key for a user (created if missing) and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True)
        parser.add_argument(
            "--roles", default="", help="Comma-separated roles, e.g. support,analyst"
        )
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--max-value",
            type=float,
            default=None,
            help="The highest session value (priority for credits and workers) the key may "
            "ask for; without it, no more than the agent's own value.",
        )
        parser.add_argument(
            "--approver",
            action="store_true",
            help="Make the user an approver: their keys may decide approvals.",
        )
        parser.add_argument(
            "--approver-groups",
            default="approvers",
            help="Comma-separated approver groups (with --approver), default 'approvers'.",
        )
        parser.add_argument(
            "--actor",
            default="",
            help="Who issues the key, for the audit trail (default cli:<the OS user>).",
        )

    def handle(self, *args: object, **options: object) -> None:
        roles = [r.strip() for r in str(options["roles"]).split(",") if r.strip()]
        new_roles = unknown_roles(roles)
        max_value = options["max_value"]
        actor = command_actor(given=str(options["actor"] or ""))
        try:
            issued = api_key_create(
                username=str(options["user"]),
                roles=roles,
                name=str(options["name"]),
                max_value=float(max_value) if isinstance(max_value, float | int) else None,
                actor=actor,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["approver"]:
            groups = [g.strip() for g in str(options["approver_groups"]).split(",") if g.strip()]
            approver_grant(username=str(options["user"]), groups=groups, actor=actor)
        self.stdout.write(issued.raw)
        if new_roles:
            # Said out loud, so a typo ("suport") is noticed rather than silently granting nothing.
            self.stderr.write(f"note: created new role(s): {', '.join(new_roles)}")
        self.stderr.write(
            f"key for {options['user']} with roles [{', '.join(issued.api_key.roles)}]"
            f"{' (approver)' if options['approver'] else ''}"
            f"{f', max value {max_value:g}' if isinstance(max_value, float) else ''}"
            "; it is shown only now"
        )

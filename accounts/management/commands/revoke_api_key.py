from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.selectors import api_keys_with_prefix, user_exists
from accounts.services import api_key_revoke, api_keys_revoke_for_user
from audit.services import command_actor


class Command(BaseCommand):
    help = (
        "Revoke an API key at once, open websockets included: by the key's prefix "
        "(as shown in the admin), or all keys of a user with --user."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", nargs="?", help="the key's first characters, e.g. ap_3xY9kQ")
        parser.add_argument("--user", help="revoke every key of this user instead")
        parser.add_argument(
            "--actor",
            default="",
            help="who revokes, for the audit trail and the log (default cli:<the OS user>)",
        )

    def handle(self, *args: object, **options: object) -> None:
        prefix = str(options["prefix"] or "").strip()
        username = str(options["user"] or "").strip()
        if bool(prefix) == bool(username):
            raise CommandError("give either a key prefix or --user NAME (not both)")
        actor = command_actor(given=str(options["actor"] or ""))
        if username:
            if not user_exists(username=username):
                raise CommandError(f"no user named {username!r}")
            outcomes = api_keys_revoke_for_user(username=username, actor=actor)
            if not outcomes:
                raise CommandError(f"{username} has no API keys")
            for key, was_active in outcomes:
                self.stdout.write(f"{key.prefix} {'revoked' if was_active else 'already revoked'}")
            return
        matches = list(api_keys_with_prefix(prefix=prefix))
        if not matches:
            raise CommandError(f"no API key starts with {prefix!r}")
        if len(matches) > 1:
            listed = ", ".join(f"{k.prefix} ({k.owner})" for k in matches[:10])
            raise CommandError(
                f"{len(matches)} keys start with {prefix!r}: {listed}; give a longer prefix"
            )
        key = matches[0]
        was_active = api_key_revoke(api_key=key, actor=actor)
        self.stdout.write(
            f"{key.prefix} of {key.owner} {'revoked' if was_active else 'already revoked'}"
        )

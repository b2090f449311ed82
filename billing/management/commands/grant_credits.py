from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import command_actor
from billing.services import CreditError, credits_grant


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = (
        "Add credit points to a user's account (created if missing), and optionally set "
        "its daily cap. Every grant is a ledger entry naming who ran the command."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="the account owner's username")
        parser.add_argument("--points", required=True, type=_non_negative, help="points to add")
        parser.add_argument(
            "--daily-cap",
            type=_non_negative,
            help="points the user may spend per day (BILLING_TIME_ZONE); 0 blocks all spending",
        )
        parser.add_argument("--note", default="", help="why, for the ledger")

    def handle(self, *args: object, **options: object) -> None:
        username = str(options["user"]).strip()
        owner = get_user_model().objects.filter(username=username).first()
        if owner is None:
            raise CommandError(f"no user named {username!r}")
        cap = options["daily_cap"]
        try:
            account = credits_grant(
                owner_id=owner.pk,
                points=int(options["points"]),  # type: ignore[call-overload]
                actor=command_actor(),
                daily_cap=cap,  # type: ignore[arg-type]
                set_daily_cap=cap is not None,
                note=str(options["note"]),
            )
        except CreditError as exc:
            raise CommandError(str(exc)) from None
        cap_text = "no daily cap" if account.daily_cap is None else f"daily cap {account.daily_cap}"
        self.stdout.write(
            f"{username}: balance {account.balance} ({account.reserved} reserved), {cap_text}"
        )

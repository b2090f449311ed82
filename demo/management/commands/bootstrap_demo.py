from django.core.management.base import BaseCommand

from demo.services import demo_api_key_ensure, demo_data_seed, demo_operator_ensure


class Command(BaseCommand):
    help = "Seed the demo business data, the operator account and a demo API key (each only once)."

    def handle(self, *args: object, **options: object) -> None:
        added = demo_data_seed()
        if added:
            self.stdout.write(f"demo data: {added} orders created")
        password = demo_operator_ensure()
        if password:
            self.stdout.write(
                f"operator account (admin): username 'operator', password '{password}'  <- shown once"
            )
        else:
            self.stdout.write(
                "operator account 'operator' already exists (reset: manage.py changepassword operator)"
            )
        key = demo_api_key_ensure()
        if key:
            self.stdout.write(f"demo API key (user 'demo', role 'support'): {key}  <- shown once")
        else:
            self.stdout.write(
                "demo API key already issued (new one: manage.py create_api_key --user demo --roles support)"
            )

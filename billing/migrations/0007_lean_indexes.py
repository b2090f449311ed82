"""Drop the daily usage row's `owner_id` index: `usage_daily_key` leads with it.

Written by hand on the database side: Django's AlterField of `db_index` drops and
re-adds the foreign key, which re-checks every row of the table.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0006_credit_reserve_function"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    ["DROP INDEX IF EXISTS billing_usagedaily_owner_id_eb820417"],
                    [
                        "CREATE INDEX billing_usagedaily_owner_id_eb820417 ON billing_usagedaily (owner_id)"
                    ],
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="usagedaily",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]

"""Drop the `owner_id` indexes of memory items and of owner indexes:
`memory_item_owner_subject` and `memory_owner_index_key` lead with them.

Written by hand on the database side: Django's AlterField of `db_index` drops and
re-adds the foreign key, which re-checks every row of the table.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0003_owner_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        "DROP INDEX IF EXISTS memory_memoryitem_owner_id_5d18631a",
                        "DROP INDEX IF EXISTS memory_memoryownerindex_owner_id_f0f439db",
                    ],
                    [
                        "CREATE INDEX memory_memoryitem_owner_id_5d18631a ON memory_memoryitem (owner_id)",
                        "CREATE INDEX memory_memoryownerindex_owner_id_f0f439db ON memory_memoryownerindex (owner_id)",
                    ],
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="memoryitem",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memory_items",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="memoryownerindex",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memory_indexes",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]

"""Drop the approval's `session_id` index: `approval_session_step` leads with it.

Written by hand on the database side: Django's AlterField of `db_index` drops and
re-adds the foreign key, which re-checks every row of the table.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0016_lean_indexes"),
        ("approvals", "0002_recovery_reviews"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    ["DROP INDEX IF EXISTS approvals_approval_session_id_951c8654"],
                    [
                        "CREATE INDEX approvals_approval_session_id_951c8654 ON approvals_approval (session_id)"
                    ],
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="approval",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="approvals",
                        to="agent_sessions.session",
                    ),
                ),
            ],
        ),
    ]

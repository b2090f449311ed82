"""Drop the indexes a step's writes maintained for nothing.

Each table a step inserts into had an index on `session_id` alone beside one that
leads with it (`(session_id, seq)` and the like), and the session row had two
such on `agent_id` and `owner_id`: every row inserted, and every session UPDATE
(none is HOT: the state and the lease are indexed), paid one more index insertion
and WAL record for each. `forked_from_id` is indexed only where set, and the tool
call's idempotency key loses the LIKE index `unique=True` builds beside its
unique constraint.

The database side is written by hand: Django's AlterField drops and re-adds each
foreign key to change `db_index`, which re-checks every row of the table, and
would rebuild the unique index; here the indexes are dropped and the unique
constraint renamed, in place.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# (table, index Django created for the foreign key, column)
FOREIGN_KEY_INDEXES = [
    ("agent_sessions_checkpoint", "agent_sessions_checkpoint_session_id_f7e138f2", "session_id"),
    ("agent_sessions_event", "agent_sessions_event_session_id_981260c3", "session_id"),
    ("agent_sessions_message", "agent_sessions_message_session_id_702865c4", "session_id"),
    ("agent_sessions_modelcall", "agent_sessions_modelcall_session_id_91298ac2", "session_id"),
    ("agent_sessions_session", "agent_sessions_session_agent_id_1bc73aad", "agent_id"),
    ("agent_sessions_session", "agent_sessions_session_forked_from_id_ad30ca70", "forked_from_id"),
    ("agent_sessions_session", "agent_sessions_session_owner_id_5a08c69b", "owner_id"),
    ("agent_sessions_toolcall", "agent_sessions_toolcall_session_id_37013d05", "session_id"),
    ("agent_sessions_transition", "agent_sessions_transition_session_id_32b00331", "session_id"),
]

# The unique constraint `unique=True` made, whatever it was named, becomes the model's.
RENAME_UNIQUE = """
DO $$
DECLARE
    old_name text;
BEGIN
    SELECT con.conname INTO STRICT old_name
    FROM pg_constraint con
    JOIN pg_attribute att ON att.attrelid = con.conrelid AND att.attnum = con.conkey[1]
    WHERE con.conrelid = 'agent_sessions_toolcall'::regclass
      AND con.contype = 'u'
      AND cardinality(con.conkey) = 1
      AND att.attname = 'idempotency_key';
    EXECUTE format(
        'ALTER TABLE agent_sessions_toolcall RENAME CONSTRAINT %I TO toolcall_idempotency_key',
        old_name
    );
END
$$;
"""

FORWARD = [
    *(f"DROP INDEX IF EXISTS {index}" for _, index, _ in FOREIGN_KEY_INDEXES),
    "CREATE INDEX session_forked_from ON agent_sessions_session (forked_from_id) "
    "WHERE forked_from_id IS NOT NULL",
    "DROP INDEX IF EXISTS agent_sessions_toolcall_idempotency_key_64ecd9be_like",
    RENAME_UNIQUE,
]

BACKWARD = [
    "ALTER TABLE agent_sessions_toolcall RENAME CONSTRAINT toolcall_idempotency_key "
    "TO agent_sessions_toolcall_idempotency_key_key",
    "CREATE INDEX agent_sessions_toolcall_idempotency_key_64ecd9be_like "
    "ON agent_sessions_toolcall (idempotency_key varchar_pattern_ops)",
    "DROP INDEX session_forked_from",
    *(
        f"CREATE INDEX {index} ON {table} ({column})"
        for table, index, column in FOREIGN_KEY_INDEXES
    ),
]


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0015_agent_config_stamp"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AlterField(
                    model_name="checkpoint",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="checkpoints",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="event",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="messages",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="modelcall",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="model_calls",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="session",
                    name="agent",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="sessions",
                        to="agent_sessions.agent",
                    ),
                ),
                migrations.AlterField(
                    model_name="session",
                    name="forked_from",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="forks",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="session",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="agent_sessions",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="toolcall",
                    name="idempotency_key",
                    field=models.CharField(max_length=200),
                ),
                migrations.AlterField(
                    model_name="toolcall",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tool_calls",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AlterField(
                    model_name="transition",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="transitions",
                        to="agent_sessions.session",
                    ),
                ),
                migrations.AddIndex(
                    model_name="session",
                    index=models.Index(
                        condition=models.Q(("forked_from__isnull", False)),
                        fields=["forked_from"],
                        name="session_forked_from",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="toolcall",
                    constraint=models.UniqueConstraint(
                        fields=("idempotency_key",), name="toolcall_idempotency_key"
                    ),
                ),
            ],
        ),
    ]

"""The schema's indexes: none maintained for nothing, none missing under a foreign key.

A step inserts ~10 rows and updates the session row (never a HOT update: its
state and lease are indexed), so every index of those tables costs an insertion
and a WAL record per row. Django gives each foreign key an index of its own;
where another index leads with the same column, that one is pure cost.
"""

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db

# Plain (non-partial, non-expression) btree indexes, with their columns and operator classes.
_INDEXES = """
SELECT c.relname, ic.relname, i.indisunique,
       string_to_array(i.indkey::text, ' ')::int[],
       string_to_array(i.indclass::text, ' ')::oid[]
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam
WHERE c.relname = ANY(%s) AND am.amname = 'btree'
  AND i.indpred IS NULL AND i.indexprs IS NULL
"""

# Each single-column foreign key, and whether some index (partial or not) leads with it.
_FOREIGN_KEYS = """
SELECT c.relname, a.attname,
       EXISTS (
           SELECT 1 FROM pg_index i
           WHERE i.indrelid = con.conrelid AND i.indkey[0] = con.conkey[1]
       )
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = con.conkey[1]
WHERE con.contype = 'f' AND cardinality(con.conkey) = 1 AND c.relname = ANY(%s)
"""


def _our_tables() -> list[str]:
    return [
        model._meta.db_table
        for config in apps.get_app_configs()
        if not config.name.startswith("django.")
        for model in config.get_models()
        if model._meta.managed
    ]


def redundant_indexes(tables: list[str]) -> list[str]:
    """Non-unique indexes whose columns and operator classes are the leading ones of
    another index of the same table (which answers every query they answer)."""
    with connection.cursor() as cursor:
        cursor.execute(_INDEXES, [tables])
        rows = cursor.fetchall()
    found = []
    for table, name, unique, columns, classes in rows:
        if unique:
            continue
        width = len(columns)
        for other_table, other, _, other_columns, other_classes in rows:
            if (
                other_table == table
                and other != name
                and other_columns[:width] == columns
                and other_classes[:width] == classes
            ):
                found.append(f"{table}.{name} (covered by {other})")
                break
    return sorted(found)


def test_no_index_repeats_the_leading_columns_of_another():
    assert redundant_indexes(_our_tables()) == []


def unindexed_foreign_keys(tables: list[str]) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_FOREIGN_KEYS, [tables])
        return sorted(f"{table}.{column}" for table, column, ok in cursor.fetchall() if not ok)


def test_every_foreign_key_leads_an_index():
    # Deleting a session (or a user, an agent) finds the rows of each referencing
    # table by that column: without an index that leads with it, a sequential scan.
    assert unindexed_foreign_keys(_our_tables()) == []


def test_the_checks_find_what_they_look_for():
    # Both rules on planted tables: the tests above must not pass by finding nothing.
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE index_probe (id int PRIMARY KEY, a int, b int, t text)")
        cursor.execute("CREATE INDEX index_probe_a ON index_probe (a)")
        cursor.execute("CREATE INDEX index_probe_a_b ON index_probe (a, b)")
        cursor.execute("CREATE INDEX index_probe_b ON index_probe (b)")
        cursor.execute("CREATE INDEX index_probe_b_a ON index_probe (b DESC, a)")
        # Another operator class answers other queries (LIKE): not a repeat.
        cursor.execute("CREATE INDEX index_probe_t ON index_probe (t)")
        cursor.execute("CREATE INDEX index_probe_t_like ON index_probe (t text_pattern_ops)")
        cursor.execute(
            "CREATE TABLE index_probe_child (id int, probe_id int REFERENCES index_probe (id),"
            " other_id int REFERENCES index_probe (id))"
        )
        cursor.execute(
            "CREATE INDEX index_probe_child_other ON index_probe_child (other_id)"
            " WHERE other_id IS NOT NULL"
        )
    assert redundant_indexes(["index_probe"]) == [
        "index_probe.index_probe_a (covered by index_probe_a_b)",
        "index_probe.index_probe_b (covered by index_probe_b_a)",
    ]
    assert unindexed_foreign_keys(["index_probe_child"]) == ["index_probe_child.probe_id"]

"""One HNSW index per embedding dimension in use (a partial expression index).

`CREATE INDEX IF NOT EXISTS` is cheap when the index exists, so applying the
config (or saving an endpoint) ensures the index of its dimension.
"""

from django.db import connection

from .models import MemoryItem

MAX_INDEXED_DIMENSION = 2000  # pgvector's HNSW limit for `vector`


def index_name(dimension: int) -> str:
    return f"memory_item_hnsw_{dimension}"


def memory_index_ensure(*, dimension: int) -> bool:
    """Create the partial HNSW index for `dimension` if missing; False past pgvector's limit."""
    if not 0 < dimension <= MAX_INDEXED_DIMENSION:
        return False
    table = MemoryItem._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'CREATE INDEX IF NOT EXISTS "{index_name(dimension)}" ON "{table}" '
            f"USING hnsw ((embedding::vector({int(dimension)})) vector_cosine_ops) "
            f"WHERE dims = {int(dimension)} AND superseded_at IS NULL"
        )
    return True

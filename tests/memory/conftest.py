"""A fake embeddings server with controlled semantics, configured as the embeddings endpoint."""

from collections.abc import Iterator

import pytest

from memory.models import EmbeddingEndpoint
from tests.fakes.embedding_server import FakeEmbeddingServer

DIMENSION = 16
# Words that mean the same thing share a direction; see tests/fakes/embedding_server.py.
CONCEPTS = {
    **dict.fromkeys(["colour", "color", "favourite", "favorite"], 0),
    "blue": 1,
    "red": 2,
    "green": 3,
    **dict.fromkeys(["coffee", "espresso"], 4),
    "tea": 5,
    **dict.fromkeys(["like", "likes", "prefer", "prefers", "love", "loves"], 6),
    **dict.fromkeys(["address", "live", "lives"], 7),
    "berlin": 8,
    "paris": 9,
    **dict.fromkeys(["invoice", "invoices", "billing"], 10),
    **dict.fromkeys(["monthly", "month"], 11),
    **dict.fromkeys(["parcel", "package", "shipment"], 12),
    **dict.fromkeys(["start", "beginning", "first"], 13),
    "name": 14,
    **dict.fromkeys(["dog", "puppy"], 15),
}


@pytest.fixture
def embeddings(db) -> Iterator[FakeEmbeddingServer]:  # type: ignore[no-untyped-def]
    with FakeEmbeddingServer(dimension=DIMENSION, concepts=CONCEPTS) as server:
        EmbeddingEndpoint.objects.create(
            name="fake", base_url=server.base_url, model="fake-embed", dimension=DIMENSION
        )
        yield server

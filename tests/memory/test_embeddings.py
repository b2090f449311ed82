"""The offline feature-hashing embedder, the HTTP client and the cache."""

import math

import pytest

from memory.embeddings import (
    OFFLINE_DIMENSION,
    EmbeddingError,
    HashingEmbedder,
    HttpEmbedder,
    current_embedder,
    embed_texts,
    features,
)
from memory.models import EmbeddingCache, EmbeddingEndpoint
from tests.fakes.embedding_server import FakeEmbeddingServer


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_offline_vectors_are_deterministic_unit_vectors():
    embedder = HashingEmbedder()
    a = embedder.embed_one("My favourite colour is blue")
    assert len(a) == OFFLINE_DIMENSION and embedder.model == "offline-hash-v1-256"
    assert math.isclose(math.sqrt(sum(x * x for x in a)), 1.0, rel_tol=1e-9)
    assert a == HashingEmbedder().embed_one("My favourite colour is blue")
    assert embedder.embed_one("") == [0.0] * OFFLINE_DIMENSION


def test_offline_similarity_follows_shared_words_and_pieces():
    e = HashingEmbedder()
    base = e.embed_one("my favourite colour is blue")
    reworded = e.embed_one("favourite colour: blue")
    plural = e.embed_one("my favourite colours are blue")
    unrelated = e.embed_one("the invoice for march was paid late")
    assert _cos(base, reworded) > 0.5
    assert _cos(base, plural) > _cos(base, unrelated)
    assert abs(_cos(base, unrelated)) < 0.2


def test_offline_embedder_knows_no_synonyms():
    """The documented limit: different words for the same thing are unrelated to it."""
    e = HashingEmbedder()
    assert abs(_cos(e.embed_one("car"), e.embed_one("automobile"))) < 0.3


def test_cjk_text_is_embedded_by_characters_and_pairs():
    assert "c:记" in features("记住我的地址") and "c2:地址" in features("记住我的地址")
    e = HashingEmbedder()
    assert _cos(e.embed_one("我的地址是上海"), e.embed_one("地址：上海")) > 0.4


def test_http_embedder_normalises_and_checks_the_dimension():
    with FakeEmbeddingServer(dimension=8, concepts={"blue": 1}) as server:
        server.vectors["raw"] = [3.0, 4.0, 0, 0, 0, 0, 0, 0]
        embedder = HttpEmbedder(base_url=server.base_url, model="m", dimension=8)
        assert embedder.embed(["raw"])[0][:2] == pytest.approx([0.6, 0.8])
        assert server.requests[0]["body"] == {"model": "m", "input": ["raw"]}
        wrong = HttpEmbedder(base_url=server.base_url, model="m", dimension=9)
        with pytest.raises(EmbeddingError, match="dimension 9"):
            wrong.embed(["blue"])
        server.fail_status = 503
        with pytest.raises(EmbeddingError, match="HTTP 503"):
            embedder.embed(["blue"])
    with pytest.raises(EmbeddingError, match="unreachable"):
        embedder.embed(["blue"])


def test_an_embeddings_endpoint_at_a_refused_address_is_an_error_and_nothing_is_sent(settings):
    settings.EGRESS_ALLOW = []
    with FakeEmbeddingServer(dimension=4) as server:
        embedder = HttpEmbedder(base_url=server.base_url, model="m", dimension=4)
        with pytest.raises(EmbeddingError, match="egress refused: 127.0.0.1 is a loopback"):
            embedder.embed(["x"])
        assert server.requests == []


def test_http_embedder_sends_the_key_from_the_environment(monkeypatch):
    with FakeEmbeddingServer(dimension=4) as server:
        embedder = HttpEmbedder(server.base_url, "m", 4, api_key_env="EMBED_TEST_KEY")
        monkeypatch.delenv("EMBED_TEST_KEY", raising=False)
        with pytest.raises(EmbeddingError, match="EMBED_TEST_KEY"):
            embedder.embed(["x"])
        monkeypatch.setenv("EMBED_TEST_KEY", "sk-test")
        embedder.embed(["x"])
        assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-test"


@pytest.mark.django_db
def test_the_configured_endpoint_is_used_and_vectors_are_cached():
    assert isinstance(current_embedder(), HashingEmbedder)  # nothing configured: offline
    with FakeEmbeddingServer(dimension=4, concepts={"tea": 0}) as server:
        EmbeddingEndpoint.objects.create(
            name="e", base_url=server.base_url, model="m4", dimension=4
        )
        assert current_embedder().model == "m4"
        first = embed_texts(["tea", "tea", "coffee"])
        again = embed_texts(["coffee", "tea"])
        assert first[0] == first[1] == again[1] and first[2] == again[0]
        assert server.texts_embedded == ["tea", "coffee"]  # one call, each text once
        assert EmbeddingCache.objects.filter(model="m4").count() == 2

"""apply_config declares the embeddings endpoint and an agent's memory settings."""

import pytest
from django.db import connection

from configuration.services import ConfigInvalid, config_apply
from memory.models import EmbeddingEndpoint
from record.models import Agent

pytestmark = pytest.mark.django_db

DOCUMENT = {
    "models": [{"name": "main", "api": "rules"}],
    "embeddings": [
        {
            "name": "tei",
            "base_url": {"env": "EMBED_URL_TEST", "default": "http://127.0.0.1:8080/v1"},
            "model": "bge-small-en-v1.5",
            "dimension": 384,
            "api_key_env": "EMBED_KEY_TEST",
        }
    ],
    "agents": [
        {
            "slug": "support",
            "model": "main",
            "tools": ["remember", "recall", "ask_user"],
            "memory": {"top_k": 3, "tags": ["preference"], "extraction": True},
        }
    ],
}


def test_embeddings_and_memory_settings_apply(monkeypatch):
    monkeypatch.delenv("EMBED_URL_TEST", raising=False)
    monkeypatch.delenv("EMBED_KEY_TEST", raising=False)
    report = config_apply(document=DOCUMENT)
    assert "embeddings tei: created" in report[1]
    assert any("EMBED_KEY_TEST is not set" in line for line in report)
    endpoint = EmbeddingEndpoint.objects.get(name="tei")
    assert (endpoint.base_url, endpoint.dimension) == ("http://127.0.0.1:8080/v1", 384)
    with connection.cursor() as cursor:
        # No global index per dimension any more: only large owners get one, their own.
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'memory_item_hnsw%%'")
        assert cursor.fetchone() == (0,)
    agent = Agent.objects.get(slug="support")
    assert agent.memory == {"top_k": 3, "tags": ["preference"], "extraction": True}
    assert config_apply(document=DOCUMENT)[1].startswith("embeddings tei: unchanged;")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"embeddings": [{"name": "x", "base_url": "http://h/v1", "model": "m"}]}, "dimension"),
        ({"agents": [{"slug": "a", "model": "main", "memory": {"top_k": -1}}]}, "top_k"),
        ({"agents": [{"slug": "a", "model": "main", "memory": {"recall": 1}}]}, "recall"),
    ],
)
def test_wrong_memory_fields_change_nothing_and_say_where(change, message):
    with pytest.raises(ConfigInvalid, match=message):
        config_apply(document={"models": [{"name": "main", "api": "rules"}], **change})
    assert not EmbeddingEndpoint.objects.exists() and not Agent.objects.exists()


def test_every_embeddings_field_the_admin_can_set_is_in_the_config_file():
    from configuration.schema import EMBEDDINGS_ENTRY

    editable = {
        f.name
        for f in EmbeddingEndpoint._meta.concrete_fields
        if f.editable and not f.primary_key and f.name != "updated_at"
    }
    assert editable == set(EMBEDDINGS_ENTRY["properties"])

"""Turning text into vectors: an OpenAI-compatible endpoint, or an offline default.

No machine here may download model weights (DESIGN.md), so the offline default
is feature hashing: word unigrams and bigrams plus character trigrams (single
characters and pairs for CJK text) hashed into a fixed number of signed
buckets, then L2-normalised. It is deterministic and free, and matches texts
that share words or word pieces; it knows no synonyms ("car" and "automobile"
are unrelated to it). Real semantics need an embeddings endpoint.

Every vector is cached by (sha256 of the text, model): the same text is
embedded once, whoever asks.
"""

import hashlib
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from runtime import egress

from .models import EmbeddingCache, EmbeddingEndpoint

OFFLINE_DIMENSION = 256
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class EmbeddingError(Exception):
    """The endpoint failed or answered something that is not the vectors asked for."""


class Embedder(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def dimension(self) -> int: ...
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def _is_cjk(char: str) -> bool:
    return "\u3400" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff"


def features(text: str) -> list[str]:
    """The hashed features of a text: words, word pairs, character trigrams; CJK characters and pairs."""
    out: list[str] = []
    words: list[str] = []
    for token in _WORD.findall(text.lower()):
        cjk = [c for c in token if _is_cjk(c)]
        if cjk:
            out.extend(f"c:{c}" for c in cjk)
            out.extend(f"c2:{a}{b}" for a, b in zip(cjk, cjk[1:], strict=False))
        latin = "".join(c for c in token if not _is_cjk(c))
        if latin:
            words.append(latin)
    out.extend(f"w:{w}" for w in words)
    out.extend(f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False))
    for w in words:
        padded = f"<{w}>"
        out.extend(f"t:{padded[i : i + 3]}" for i in range(len(padded) - 2))
    return out


@dataclass(frozen=True)
class HashingEmbedder:
    """The offline default: deterministic feature hashing, nothing downloaded."""

    dimension: int = OFFLINE_DIMENSION

    @property
    def model(self) -> str:
        return f"offline-hash-v1-{self.dimension}"

    def embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        for feature in features(text):
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dimension
            # Words weigh more than their trigrams; the sign bit spreads collisions.
            weight = 1.0 if feature[0] in "wbc" else 0.5
            vector[bucket] += weight if digest[4] & 1 else -weight
        return normalised(vector)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]


def normalised(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:
        return [0.0 for _ in vector]
    return [x / norm for x in vector]


@dataclass(frozen=True)
class HttpEmbedder:
    """An OpenAI-compatible `/v1/embeddings` endpoint (vLLM, TEI, Ollama, a provider)."""

    base_url: str
    model: str
    dimension: int
    api_key_env: str = ""
    timeout_s: float = 10.0

    @classmethod
    def from_endpoint(cls, endpoint: EmbeddingEndpoint) -> "HttpEmbedder":
        return cls(
            base_url=endpoint.base_url,
            model=endpoint.model,
            dimension=endpoint.dimension,
            api_key_env=endpoint.api_key_env,
            timeout_s=endpoint.timeout_s,
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        headers = {}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
            if not key:
                raise EmbeddingError(f"the environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        url = self.base_url.rstrip("/") + "/embeddings"
        try:
            with egress.client(timeout=self.timeout_s) as client:
                response = client.post(
                    url, json={"model": self.model, "input": list(texts)}, headers=headers
                )
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"embeddings endpoint unreachable: {type(exc).__name__}") from exc
        except egress.EgressRefused as exc:
            raise EmbeddingError(f"embeddings endpoint: {exc}") from exc
        if response.status_code != 200:
            raise EmbeddingError(f"embeddings endpoint answered HTTP {response.status_code}")
        try:
            data = sorted(response.json()["data"], key=lambda d: d.get("index", 0))
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError("embeddings endpoint answered an unexpected body") from exc
        if len(vectors) != len(texts) or any(len(v) != self.dimension for v in vectors):
            raise EmbeddingError(
                f"embeddings endpoint returned {len(vectors)} vectors, expected {len(texts)} "
                f"of dimension {self.dimension}"
            )
        # Cosine scores below assume unit vectors; not every server normalises.
        return [normalised(v) for v in vectors]


def current_embedder() -> Embedder:
    """The first enabled endpoint, else the offline default."""
    endpoint = EmbeddingEndpoint.objects.filter(enabled=True).order_by("id").first()
    if endpoint is None:
        return HashingEmbedder()
    return HttpEmbedder.from_endpoint(endpoint)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def embed_texts(texts: Sequence[str], embedder: Embedder | None = None) -> list[list[float]]:
    """Vectors for `texts`, from the cache where known; the rest in one endpoint call.

    1. Look the texts up by (hash, model).
    2. Embed the missing ones in one batch.
    3. Store them (a concurrent writer of the same text is ignored).
    """
    embedder = embedder or current_embedder()
    hashes = [content_hash(t) for t in texts]
    known = {
        h: list(v)
        for h, v in EmbeddingCache.objects.filter(
            model=embedder.model, content_hash__in=set(hashes)
        ).values_list("content_hash", "embedding")
    }
    missing = list(dict.fromkeys(h for h in hashes if h not in known))
    if missing:
        by_hash = dict(zip(hashes, texts, strict=True))
        fresh = embedder.embed([by_hash[h] for h in missing])
        known.update(zip(missing, fresh, strict=True))
        EmbeddingCache.objects.bulk_create(
            [
                EmbeddingCache(
                    content_hash=h, model=embedder.model, dims=embedder.dimension, embedding=v
                )
                for h, v in zip(missing, fresh, strict=True)
            ],
            ignore_conflicts=True,
        )
    return [[float(x) for x in known[h]] for h in hashes]

"""An independent tokenizer for the tests that prove the token counts: OpenAI's `tiktoken`.

memory/tokens.py counts with bpe-openai (another implementation, in Rust). tiktoken
normally downloads its vocabularies; offline, it is given the files bpe-openai ships,
through its own cache, and tiktoken checks each against the SHA-256 OpenAI publishes
(tiktoken_ext/openai_public.py) before using it: a vocabulary that is not OpenAI's
fails here rather than agreeing with itself. The request count follows OpenAI's
published recipe: three tokens a message (four with a `name`), three for the reply's
priming, the tool calls' names and arguments, the tool schemas as sent on the wire.
"""

import functools
import gzip
import hashlib
import json
import os
import tempfile
from importlib import resources
from typing import Any

import tiktoken

from llm.types import ChatRequest

URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


@functools.cache
def reference_encoding(name: str) -> Any:
    cache = tempfile.mkdtemp(prefix="tiktoken-")
    ranks = resources.files("bpe_openai.data").joinpath(f"{name}.tiktoken.gz").read_bytes()
    key = hashlib.sha1(URLS[name].encode()).hexdigest()  # noqa: S324 - tiktoken's cache key
    with open(os.path.join(cache, key), "wb") as file:
        file.write(gzip.decompress(ranks))
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = cache
    try:
        return tiktoken.get_encoding(name)
    finally:
        if before is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def reference_tokens(text: str, name: str) -> int:
    return len(reference_encoding(name).encode_ordinary(text))


def reference_request_tokens(request: ChatRequest, name: str) -> int:
    """What OpenAI's format makes of `request`, counted by tiktoken."""
    total = 3  # the reply's priming
    for m in request.messages:
        total += 3 + reference_tokens(m.content, name) + reference_tokens(m.role, name)
        if m.name:
            total += 1 + reference_tokens(m.name, name)
        for call in m.tool_calls:
            total += reference_tokens(call.name, name)
            total += reference_tokens(json.dumps(call.arguments, ensure_ascii=False), name)
    for tool in request.tools:
        wire = {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        total += reference_tokens(json.dumps(wire), name)
    return total


def reference_wire_tokens(body: Any, name: str) -> int:
    """What a Chat Completions request body (as it went over the wire) costs, by tiktoken."""
    total = 3
    for m in body.get("messages") or []:
        content = m.get("content") or ""
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        total += 3 + reference_tokens(m.get("role", ""), name) + reference_tokens(text, name)
        if m.get("name"):
            total += 1 + reference_tokens(m["name"], name)
        for call in m.get("tool_calls") or []:
            function = call.get("function") or {}
            total += reference_tokens(function.get("name", ""), name)
            total += reference_tokens(function.get("arguments", ""), name)
    for tool in body.get("tools") or []:
        total += reference_tokens(json.dumps(tool), name)
    return total

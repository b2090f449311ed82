"""`python -m tests.fakes.remote_services --bind ADDR --port P`: a model provider and a business API on a host of their own.

The scale-out test (tests/e2e/test_scale_out.py) runs this in its own network
namespace, so the platform reaches both over the network, as it would in
production. One asyncio loop, so every run's calls can wait at once.

- `POST /v1/chat/completions` (OpenAI-compatible, streamed): a scripted model. The
  run's tag is the last word of the first user message; with `n` tool results in the
  request it asks for `ship_parcel(order="<tag>-<n+1>")` while `n < --calls`, then
  answers `Shipped <tag>.` Each answer waits `--model-latency` seconds.
- `POST /ship` (a side-effecting tool): every request that arrives *is* a shipment
  (no de-duplication here, on purpose: a re-sent call would ship twice), recorded
  with its `Idempotency-Key`; the answer comes `--tool-latency` seconds later, so a
  worker killed meanwhile dies mid-call.
- `GET /ship/status?idempotency_key=K`: the probe. 200 `{"status": "done", ...}` once
  a request with that key arrived, 404 `{"status": "unknown"}` before.
- `GET /counts`: what the test asserts on: requests per key, keys per order, when and
  from which address each key first arrived, model calls, probes.
"""

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent.parent
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Connection: close\r\n\r\n"
)


def _json_response(status: int, payload: Any) -> bytes:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "OK")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


class Services:
    def __init__(self, model_latency: float, tool_latency: float, calls: int) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.fakes.model_servers import Call, Reply, openai_events

        self._call, self._reply, self._events = Call, Reply, openai_events
        self.model_latency = model_latency
        self.tool_latency = tool_latency
        self.calls = calls
        self.ids = itertools.count(1)
        self.model_calls = 0
        self.requests_per_key: Counter[str] = Counter()
        self.keys_per_order: defaultdict[str, list[str]] = defaultdict(list)
        self.results: dict[str, dict[str, Any]] = {}
        self.first_at: dict[str, float] = {}
        self.first_from: dict[str, str] = {}
        self.in_flight = 0
        self.probes = 0

    # The model -----------------------------------------------------------------------------

    def model_answer(self, body: dict[str, Any]) -> bytes:
        messages = body.get("messages") or []
        done = sum(1 for m in messages if m.get("role") == "tool")
        tag = _tag(messages)
        if done < self.calls:
            call = self._call(
                name="ship_parcel",
                arguments={"order": f"{tag}-{done + 1}"},
                id=f"call_ship_{next(self.ids)}",
            )
            reply = self._reply(calls=[call], usage=(50, 8))
        else:
            reply = self._reply(text=f"Shipped {tag}.", usage=(60, 4))
        model = str(body.get("model") or "scripted")
        return SSE_HEAD + b"".join(self._events(reply, model, include_usage=True))

    # The business API ----------------------------------------------------------------------

    def ship(self, key: str, body: Any, peer: str) -> tuple[int, dict[str, Any]]:
        if not key or not isinstance(body, dict) or not isinstance(body.get("order"), str):
            return 400, {"ok": False, "error": "send an order and an Idempotency-Key"}
        order = body["order"]
        self.requests_per_key[key] += 1
        if key not in self.keys_per_order[order]:
            self.keys_per_order[order].append(key)
        result = {"ok": True, "order": order, "parcel": f"P-{len(self.results) + 1}"}
        self.results.setdefault(key, result)
        self.first_at.setdefault(key, time.time())
        self.first_from.setdefault(key, peer)
        return 200, result

    def status(self, key: str) -> tuple[int, dict[str, Any]]:
        self.probes += 1
        if key in self.results:
            return 200, {"status": "done", "result": self.results[key]}
        return 404, {"status": "unknown"}

    def counts(self) -> dict[str, Any]:
        return {
            "model_calls": self.model_calls,
            "requests_per_key": dict(self.requests_per_key),
            "keys_per_order": dict(self.keys_per_order),
            "first_at": self.first_at,
            "first_from": self.first_from,
            "in_flight": self.in_flight,
            "probes": self.probes,
        }

    # HTTP ----------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            raw = await reader.readexactly(length) if length else b""
            url = urlsplit(target)
            if method == "POST" and url.path.endswith("/chat/completions"):
                self.model_calls += 1
                answer = self.model_answer(json.loads(raw or b"{}"))
                await asyncio.sleep(self.model_latency)
                writer.write(answer)
            elif method == "POST" and url.path == "/ship":
                # Recorded on arrival: the side effect happens whatever becomes of the caller.
                peer = str((writer.get_extra_info("peername") or ("",))[0])
                status, payload = self.ship(
                    headers.get("idempotency-key", ""), json.loads(raw or b"null"), peer
                )
                self.in_flight += 1
                try:
                    await asyncio.sleep(self.tool_latency)
                finally:
                    self.in_flight -= 1
                writer.write(_json_response(status, payload))
            elif method == "GET" and url.path == "/ship/status":
                key = (parse_qs(url.query).get("idempotency_key") or [""])[0]
                writer.write(_json_response(*self.status(key)))
            elif method == "GET" and url.path == "/counts":
                writer.write(_json_response(200, self.counts()))
            elif method == "GET" and url.path == "/healthz":
                writer.write(_json_response(200, {"ok": True}))
            else:
                writer.write(_json_response(404, {"error": "not found"}))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


def _tag(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"].rsplit(" ", 1)[-1]
    return "untagged"


async def serve(args: argparse.Namespace) -> None:
    services = Services(args.model_latency, args.tool_latency, args.calls)
    listener = await asyncio.start_server(services.handle, args.bind, args.port, backlog=1024)
    print(f"remote_services: listening on {args.bind}:{args.port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.remote_services")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--model-latency", type=float, default=0.2)
    parser.add_argument("--tool-latency", type=float, default=1.5)
    parser.add_argument("--calls", type=int, default=2, help="tool calls per run")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()

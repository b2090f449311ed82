"""`python -m bench.model_server --port P --latency S`: a slow OpenAI-compatible model for `load`.

A process of its own (its CPU is not the platform's) on one asyncio loop, so
hundreds of calls can wait at once. Every `POST .../chat/completions` is
answered after `--latency` seconds, streamed (SSE, rendered by the test fakes'
`openai_events`): a call whose messages hold no `tool` message after the last user message asks for
one call of the tool `--tool` (no arguments); a call after a tool result
answers in text. That is the turn the `load` benchmark runs: model (tool call)
-> tool -> model (answer).

`GET /stats` returns, per call, the wall time the request was read completely
(`received`) and the time its answer was sent (`sent`) and its `tag` (the last word of the first user message), so the benchmark can
split a turn's time into the platform's and the model's.
"""

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Kept alive, as a provider's API is: the platform's pooled client reuses the connection,
# so a turn's CPU holds no TCP connect per call (closing each one charged the workers a
# connect a call that production does not pay). The events go as one chunk.
HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class ModelServer:
    def __init__(self, latency: float, tool: str) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.fakes.model_servers import Call, Reply, openai_events

        self._call, self._reply, self._events = Call, Reply, openai_events
        self.latency = latency
        self.tool = tool
        self.ids = itertools.count(1)
        self.calls: list[dict[str, Any]] = []
        self.connections = 0

    def _answer(self, body: dict[str, Any]) -> bytes:
        after_tool = _after_tool(body)
        if after_tool:
            reply = self._reply(text="It is now, according to the clock tool.", usage=(60, 9))
        else:
            call = self._call(name=self.tool, arguments={}, id=f"call_load_{next(self.ids)}")
            reply = self._reply(calls=[call], usage=(50, 8))
        model = str(body.get("model") or "load-model")
        return HEAD + _chunked(b"".join(self._events(reply, model, include_usage=True)))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after another on the connection, until the client closes it."""
        self.connections += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False once the client has closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as eof:
            if eof.partial:
                raise
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        raw = await reader.readexactly(length) if length else b""
        received = time.time()
        if method == "GET" and target.startswith("/stats"):
            payload = json.dumps(self.calls).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
        else:
            body = json.loads(raw or b"{}")
            answer = self._answer(body)
            await asyncio.sleep(self.latency)
            writer.write(answer)
            self.calls.append(
                {
                    "received": received,
                    "sent": time.time(),
                    "tool_result": _after_tool(body),
                    "tag": _tag(body),
                }
            )
        await writer.drain()
        return True


def _after_tool(body: dict[str, Any]) -> bool:
    """Whether this turn's tool has answered: a `tool` message after the last user message
    (a session's earlier turns are in its history: `sustained` posts several per session)."""
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return any(m.get("role") == "tool" for m in messages[last_user + 1 :])


def _tag(body: dict[str, Any]) -> str:
    """The last word of the first user message: the `load` benchmark puts the session id there."""
    for message in body.get("messages") or []:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"].rsplit(" ", 1)[-1]
    return ""


async def serve(port: int, latency: float, tool: str) -> None:
    server = ModelServer(latency, tool)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=1024)
    print(f"model_server: listening on 127.0.0.1:{port}, {latency:g} s per call", flush=True)
    async with listener:
        await listener.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.model_server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--tool", default="bench_clock")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency, args.tool))


if __name__ == "__main__":
    main()

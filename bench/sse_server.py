"""`python -m bench.sse_server --port P --chunks N`: a minimal streaming model server for `adapters`.

A separate process (so its CPU is not counted against the client being
measured) that answers every POST with one pre-rendered streamed answer of N
text chunks in the wire format the path asks for: `.../chat/completions`
(OpenAI, rendered by `tests.fakes.model_servers.openai_events`) or
`.../v1/messages` (Anthropic, `anthropic_events`). The rendering happens once,
at start-up, so serving costs the server next to nothing and the client is
what limits the speed.

Delivery, by query string:

- `?mode=burst` (default): the whole body in one `sendall`; the client reads
  it as fast as it can, in whatever pieces the kernel hands over.
- `?mode=paced&gap_us=G`: one `send` per event with a pause of G µs between
  them (TCP_NODELAY), as a real provider streams tokens: the client wakes up
  for (nearly) every event.

HTTP/1.1 with `Connection: close` framing (the body ends when the socket
closes), as the fake model servers of the tests do.
"""

import argparse
import socket
import socketserver
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Connection: close\r\n\r\n"
)


def render(chunks: int) -> dict[str, list[bytes]]:
    """Both wire formats' events for one answer of `chunks` text pieces (one word each)."""
    sys.path.insert(0, str(ROOT))
    from tests.fakes.model_servers import Reply, anthropic_events, openai_events

    reply = Reply(text="".join(f"w{i} " for i in range(chunks)), usage=(1000, chunks))
    return {
        "openai": openai_events(reply, "bench-model", include_usage=True),
        "anthropic": anthropic_events(reply, "bench-model"),
    }


class Handler(socketserver.BaseRequestHandler):
    server: "Server"

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                return
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        target = lines[0].split(" ")[1]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                return
            body += piece
        url = urlsplit(target)
        query = parse_qs(url.query)
        api = "openai" if url.path.endswith("/chat/completions") else "anthropic"
        events = self.server.events[api]
        if query.get("mode", ["burst"])[0] == "paced":
            gap = float(query.get("gap_us", ["200"])[0]) / 1e6
            sock.sendall(HEAD)
            for event in events:
                sock.sendall(event)
                time.sleep(gap)  # not a spin: the client needs the CPU more
        else:
            sock.sendall(HEAD + self.server.bodies[api])
        sock.shutdown(socket.SHUT_WR)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    events: dict[str, list[bytes]]
    bodies: dict[str, bytes]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sse_server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=2000)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.events = render(args.chunks)
    server.bodies = {api: b"".join(events) for api, events in server.events.items()}
    sizes = ", ".join(
        f"{api} {len(server.events[api])} events / {len(body)} B"
        for api, body in server.bodies.items()
    )
    print(f"sse_server: listening on 127.0.0.1:{args.port}; {sizes}", flush=True)
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()

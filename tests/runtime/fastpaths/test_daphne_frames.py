"""A live frame's bytes, built once and written directly to daphne's sockets."""

import functools
import socket
from typing import Any

import pytest
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol

from runtime.fastpaths import daphne_frames


def _autobahn_frame(payload: bytes) -> bytes:
    """What autobahn's server protocol writes for a text message (its own framing)."""
    protocol = WebSocketServerProtocol()
    protocol.factory = WebSocketServerFactory()
    protocol._perMessageCompress = None
    protocol.maskServerFrames = False
    protocol.logFrames = False
    protocol.trafficStats = type("Stats", (), {"outgoingWebSocketFrames": 0})()
    written: list[bytes] = []
    protocol.sendData = lambda data, sync=False, chopsize=None: written.append(data)
    protocol.sendFrame(opcode=1, payload=payload)
    return b"".join(written)


@pytest.mark.parametrize("size", [0, 5, 125, 126, 1000, 65535, 65536, 200_000])
def test_text_frame_is_autobahns_frame(size):
    text = ("é" + "x" * size)[: max(size, 1)]  # a two-byte character: the length is in bytes
    assert daphne_frames.text_frame(text) == _autobahn_frame(text.encode())


class _Transport:
    TLS = False

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.connected = True
        self.disconnecting = False
        self.dataBuffer = b""
        self._tempDataLen = 0
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self._tempDataLen += len(data)


class _Protocol:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport
        self.state = WebSocketProtocol.STATE_OPEN
        self.send_state = WebSocketProtocol.SEND_STATE_GROUND
        self.send_queue: list[Any] = []
        self._perMessageCompress = None
        self.maskServerFrames = False


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_a_frame_goes_straight_to_an_idle_socket_and_behind_queued_bytes(pair):
    ours, peer = pair
    protocol = _Protocol(_Transport(ours))
    frame = daphne_frames.text_frame('{"seq": 1}')
    assert daphne_frames.write(protocol, frame)
    assert peer.recv(100) == frame
    assert protocol.transport.written == []
    # Bytes already queued in Twisted go first: the frame queues behind them.
    protocol.transport.write(b"queued")
    assert daphne_frames.write(protocol, frame)
    assert protocol.transport.written == [b"queued", frame]


def test_what_the_kernel_does_not_take_is_queued_in_order(pair):
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    protocol = _Protocol(_Transport(ours))
    frame = daphne_frames.text_frame("x" * 2_000_000)
    assert daphne_frames.write(protocol, frame)
    rest = b"".join(protocol.transport.written)
    assert 0 < len(rest) < len(frame)
    assert frame.endswith(rest)


@pytest.mark.parametrize(
    "change",
    [
        {"state": WebSocketProtocol.STATE_CLOSING},
        {"send_state": WebSocketProtocol.SEND_STATE_INSIDE_MESSAGE},  # a fragmented message
        {"send_queue": [(b"x", True)]},
        {"_perMessageCompress": object()},
        {"maskServerFrames": True},
    ],
)
def test_a_socket_not_in_the_plain_shape_is_left_to_asgi(pair, change):
    protocol = _Protocol(_Transport(pair[0]))
    for name, value in change.items():
        setattr(protocol, name, value)
    assert not daphne_frames.write(protocol, daphne_frames.text_frame("{}"))
    assert protocol.transport.written == []


def test_only_daphnes_send_yields_a_protocol(pair):
    async def other_send(message: dict[str, Any]) -> None:
        return None

    assert daphne_frames.daphne_protocol(other_send) is None
    assert daphne_frames.daphne_protocol(functools.partial(other_send)) is None


def test_daphnes_send_yields_its_protocol(pair):
    from daphne.server import Server

    server = Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])  # not run
    protocol = _Protocol(_Transport(pair[0]))
    assert (
        daphne_frames.daphne_protocol(functools.partial(server.handle_reply, protocol)) is protocol
    )
    protocol.transport.TLS = True  # TLS terminated in daphne: its bytes are not the frame's
    assert daphne_frames.daphne_protocol(functools.partial(server.handle_reply, protocol)) is None


def test_off_every_socket_is_sent_to_through_asgi(pair, settings):
    from daphne.server import Server

    settings.FAST_PATHS = False
    server = Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])  # not run
    protocol = _Protocol(_Transport(pair[0]))
    assert daphne_frames.daphne_protocol(functools.partial(server.handle_reply, protocol)) is None


def test_daphne_delivers_direct_and_asgi_frames_in_order():
    """The real thing: daphne, autobahn, Twisted and a websocket client."""
    import asyncio
    import subprocess
    import sys
    import time
    from pathlib import Path

    import websockets

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[3]
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        + ["tests.runtime.fastpaths.daphne_frames_app:application"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def receive_three() -> list[str]:
        deadline = time.monotonic() + 20
        while True:
            try:
                async with websockets.connect(f"ws://127.0.0.1:{port}/", max_size=None) as ws:
                    return [str(await asyncio.wait_for(ws.recv(), 10)) for _ in range(3)]
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    try:
        frames = asyncio.run(receive_three())
    finally:
        daphne.terminate()
        daphne.wait(10)
    assert frames[:2] == ["direct 1", "asgi 2 (first was direct: True)"]
    assert frames[2] == "direct 3 " + "x" * 100_000

"""One text frame's bytes, built once, written to many daphne websockets.

daphne's path for one socket's frame (ASGI send -> daphne -> autobahn -> Twisted)
cost ~45 µs of the event loop's CPU in the fanout benchmark: per socket it
encodes the text, builds the frame header, formats autobahn's debug log
arguments (even with debug logging off), and has Twisted register the socket for
writing and unregister it after (two epoll_ctl calls and a loop callback). A
frame to 500 sockets was ~25 ms of the loop's time.

Here the frame's bytes (RFC 6455: a server frame is unmasked, so every socket
gets the same bytes) are built once, and each socket's are sent with one
`send()` when its Twisted transport has nothing queued; the part the kernel did
not take goes through `transport.write` (buffered, in order). Whatever does not
fit this shape (TLS terminated in daphne, a compression extension, a closing or
paused socket, another ASGI server, a test communicator) gets `None` from
`daphne_protocol` or `False` from `write`, and the caller sends through ASGI.

This reads attributes of daphne, autobahn and Twisted that are not public API
(the versions it was written for: runtime/fastpaths/__init__.py); `daphne_protocol`
probes them when a socket opens, and a release without them falls back to ASGI,
as does every socket while the fast path is off.
"""

import functools
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol

from runtime import fastpaths

_OPEN = WebSocketProtocol.STATE_OPEN
_GROUND = WebSocketProtocol.SEND_STATE_GROUND  # no fragmented message being sent


def text_frame(text: str) -> bytes:
    """A final, unmasked text frame: what autobahn's sendMessage writes for `text`."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        header = bytes((0x81, size))
    elif size < 1 << 16:
        header = bytes((0x81, 126)) + size.to_bytes(2, "big")
    else:
        header = bytes((0x81, 127)) + size.to_bytes(8, "big")
    return header + payload


def daphne_protocol(send: Any) -> Any | None:
    """The autobahn protocol behind a daphne ASGI `send` (daphne passes
    `partial(server.handle_reply, protocol)`), or None where the shape differs or the
    fast path is off."""
    if not fastpaths.enabled("daphne_frames"):
        return None
    if not isinstance(send, functools.partial) or len(send.args) != 1:
        return None
    server = getattr(send.func, "__self__", None)
    if type(server).__module__ != "daphne.server":
        return None
    protocol = send.args[0]
    try:
        transport = protocol.transport
        protocol.state, protocol.send_state, protocol.send_queue  # noqa: B018 - probes
        protocol._perMessageCompress, protocol.maskServerFrames  # noqa: B018
        transport.TLS, transport.socket, transport.dataBuffer  # noqa: B018
        transport._tempDataLen, transport.disconnecting, transport.connected  # noqa: B018
    except AttributeError:
        return None
    if transport.TLS:
        return None
    return protocol


def write(protocol: Any, frame: bytes) -> bool:
    """Write `frame` (from text_frame) to the socket; False: not written, send through ASGI."""
    if (
        protocol.state != _OPEN
        or protocol.send_state != _GROUND
        or protocol.send_queue
        or protocol._perMessageCompress is not None
        or protocol.maskServerFrames
    ):
        return False
    transport = protocol.transport
    if transport is None or not transport.connected or transport.disconnecting:
        return False
    if transport.dataBuffer or transport._tempDataLen:
        transport.write(frame)  # behind what is queued: in order
        return True
    try:
        sent = transport.socket.send(frame)
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:
        # A broken connection: Twisted's next write attempt notices it and closes it.
        sent = 0
    if sent < len(frame):
        transport.write(frame[sent:])
    return True

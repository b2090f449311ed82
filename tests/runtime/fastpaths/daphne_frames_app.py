"""An ASGI app for test_daphne_frames: daphne serves it, and each socket gets a frame
written directly (daphne_frames), then one through ASGI, then one directly again."""

from typing import Any

from runtime.fastpaths import daphne_frames


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    protocol = daphne_frames.daphne_protocol(send)
    direct = protocol is not None and daphne_frames.write(
        protocol, daphne_frames.text_frame("direct 1")
    )
    await send({"type": "websocket.send", "text": f"asgi 2 (first was direct: {direct})"})
    if protocol is not None:
        daphne_frames.write(protocol, daphne_frames.text_frame("direct 3 " + "x" * 100_000))
    await receive()  # websocket.disconnect

"""An ASGI app for test_ws_wire: daphne serves it, and each socket gets a frame
written directly (ws_wire), then one through ASGI, then one directly again."""

from typing import Any

from sessions import ws_wire


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    protocol = ws_wire.daphne_protocol(send)
    direct = protocol is not None and ws_wire.write(protocol, ws_wire.text_frame("direct 1"))
    await send({"type": "websocket.send", "text": f"asgi 2 (first was direct: {direct})"})
    if protocol is not None:
        ws_wire.write(protocol, ws_wire.text_frame("direct 3 " + "x" * 100_000))
    await receive()  # websocket.disconnect

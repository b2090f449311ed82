"""`python -m bench.http_watchers IN.json OUT.json`: the 500 websocket watchers of `http`.

A process of its own: opens `count` websockets on one session, prints
`ready` on stdout once all are open, then for `seconds` records, per
`progress` frame whose data has a `sent` wall time, when each socket got it
(the frame's arrival - `sent`). OUT.json: {"connect_s", "frames", "latency_ms"}.
"""

import asyncio
import json
import sys
import time
from typing import Any


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    import websockets

    url = f"{spec['ws']}/ws/sessions/{spec['session']}/"
    headers = {"Authorization": f"Bearer {spec['key']}"}
    latencies: list[float] = []
    t0 = time.perf_counter()
    sockets = []
    for start in range(0, spec["count"], 50):  # in batches: the server's accept backlog
        batch = range(start, min(start + 50, spec["count"]))
        sockets += await asyncio.gather(
            *(
                websockets.connect(url, additional_headers=headers, max_queue=None, open_timeout=60)
                for _ in batch
            )
        )
    connect_s = time.perf_counter() - t0
    print("ready", flush=True)

    async def read(ws: Any) -> None:
        async for raw in ws:
            now = time.time()
            frame = json.loads(raw)
            sent = (frame.get("data") or {}).get("sent")
            if frame.get("type") == "progress" and sent:
                latencies.append((now - sent) * 1000)

    tasks = [asyncio.create_task(read(ws)) for ws in sockets]
    await asyncio.sleep(spec["seconds"])
    for task in tasks:
        task.cancel()
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {"connect_s": connect_s, "frames": len(latencies), "latency_ms": latencies}


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    result = asyncio.run(_main(spec))
    with open(sys.argv[2], "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()

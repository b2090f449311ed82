"""A client process of the `fanout` benchmark: holds websockets, stamps every frame's arrival.

`python -m bench.fanout_client WS_BASE SPEC_JSON`, where SPEC_JSON is a list of
`[session_id, api_key, sockets]`. It opens the sockets (a few at a time), prints
`ready <n>` and then answers commands on stdin, one per line:
`dump` prints one JSON line `{"frames": [[socket, session, seq, type, t], ...]}`
(every frame since the last dump; `t` is `time.monotonic()`, one clock for
every process of the machine), `close` closes every socket, prints `closed`
and exits. Idle sockets answer the server's pings on their own.
"""

import asyncio
import json
import sys
import threading
import time
from typing import Any

CONNECT_CONCURRENCY = 20
CONNECT_ATTEMPTS = 3


async def _hold(
    index: int,
    url: str,
    key: str,
    session: str,
    frames: list[list[Any]],
    opened: asyncio.Event,
    gate: asyncio.Semaphore,
    stop: asyncio.Event,
    counter: list[int],
    total: int,
    failures: list[str],
) -> None:
    import websockets

    async with gate:
        # A handshake can fail on a machine other work keeps busy: a few attempts.
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                ws = await websockets.connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {key}"},
                    max_queue=None,
                    ping_interval=None,  # the server pings; the client only answers
                    open_timeout=60,
                )
                break
            except Exception as exc:  # noqa: BLE001 - reported to the driver
                if attempt + 1 < CONNECT_ATTEMPTS:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                failures.append(f"connect: {exc!r}")
                counter[0] += 1
                if counter[0] == total:
                    opened.set()
                return
    counter[0] += 1
    if counter[0] == total:
        opened.set()
    monotonic = time.monotonic
    loads = json.loads
    try:
        async for raw in ws:
            at = monotonic()
            frame = loads(raw)
            frames.append([index, session, frame.get("seq"), frame.get("type"), at])
    except Exception as exc:  # noqa: BLE001
        if not stop.is_set():
            failures.append(f"socket {index} dropped: {exc!r}")
    finally:
        if not stop.is_set():
            failures.append(f"socket {index} closed early")
        await ws.close()


async def _main(ws_base: str, spec: list[list[Any]]) -> None:
    loop = asyncio.get_running_loop()
    frames: list[list[Any]] = []
    failures: list[str] = []
    opened = asyncio.Event()
    stop = asyncio.Event()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    counter = [0]
    total = sum(int(n) for _, _, n in spec)
    tasks = []
    index = 0
    for session, key, count in spec:
        url = f"{ws_base}/ws/sessions/{session}/?after=0"
        for _ in range(int(count)):
            tasks.append(
                asyncio.create_task(
                    _hold(
                        index,
                        url,
                        key,
                        session,
                        frames,
                        opened,
                        gate,
                        stop,
                        counter,
                        total,
                        failures,
                    )
                )
            )
            index += 1
    await opened.wait()
    refused = sum(1 for f in failures if f.startswith("connect:"))
    print(f"ready {total - refused} {json.dumps(failures[:5])}", flush=True)

    commands: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "close")

    threading.Thread(target=read_stdin, daemon=True).start()
    while True:
        command = await commands.get()
        if command == "dump":
            batch, frames[:] = list(frames), []
            print(json.dumps({"frames": batch, "failures": failures}), flush=True)
        elif command == "close":
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            print("closed", flush=True)
            return


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], json.loads(sys.argv[2])))

"""`python -m bench.load_client IN.json OUT.json`: the users of the `load` benchmark.

A process of its own (its CPU is not the server's, and not under the bench
process's GIL): one asyncio loop, one websocket per session
(`/ws/sessions/{id}/?after=0`), all connected first; then every session gets
`POST /api/v1/sessions/{id}/messages/` at the same moment (httpx, one
connection per user). Per session it writes the wall times (`time.time()`, the
clock the servers' rows use) of the POST's start, its 202, and the arrival of
the turn's `turn.finished` frame.

The content of each post ends with the session id: the model server tags its
calls with it.

IN.json: {"base": "http://127.0.0.1:P", "key": "...", "sessions": [...], "content": "..."}
"""

import asyncio
import json
import sys
import time
from typing import Any


async def _watch(
    ws_base: str, key: str, session_id: str, ready: asyncio.Event, out: dict[str, Any]
) -> Any:
    import websockets

    finished = asyncio.get_running_loop().create_future()
    ws = await websockets.connect(
        f"{ws_base}/ws/sessions/{session_id}/?after=0",
        additional_headers={"Authorization": f"Bearer {key}"},
        max_queue=None,
        open_timeout=60,
    )

    async def reader() -> None:
        try:
            async for raw in ws:
                frame = json.loads(raw)
                if frame.get("type") == "turn.finished":
                    out["finished"] = time.time()
                    out["stop_reason"] = (frame.get("data") or {}).get("stop_reason")
                    finished.set_result(None)
                    return
        except Exception as exc:  # noqa: BLE001 - reported with the sample
            if not finished.done():
                finished.set_exception(exc)

    task = asyncio.create_task(reader())
    return ws, task, finished


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    base: str = spec["base"]
    ws_base = "ws" + base.removeprefix("http")
    key: str = spec["key"]
    ids: list[str] = spec["sessions"]
    samples: dict[str, dict[str, Any]] = {sid: {} for sid in ids}
    ready = asyncio.Event()
    t0 = time.perf_counter()
    sockets = await asyncio.gather(*(_watch(ws_base, key, s, ready, samples[s]) for s in ids))
    connect_s = time.perf_counter() - t0
    limits = httpx.Limits(max_connections=len(ids) + 10, max_keepalive_connections=len(ids) + 10)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60, limits=limits
    ) as http:

        async def post(session_id: str) -> None:
            sample = samples[session_id]
            sample["post"] = time.time()
            response = await http.post(
                f"/api/v1/sessions/{session_id}/messages/",
                json={"content": f"{spec['content']} {session_id}"},
            )
            sample["answered"] = time.time()
            sample["status"] = response.status_code

        # The bench samples the servers' CPU between the phases: "connected" -> it answers
        # (stdin) -> the posts -> "posted".
        print("connected", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await asyncio.gather(*(post(s) for s in ids))
        print("posted", flush=True)
        errors = []
        async with asyncio.timeout(spec.get("timeout", 120)):
            for sid, (_ws, _task, finished) in zip(ids, sockets, strict=True):
                try:
                    await finished
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{sid}: {exc!r}")
    for ws, task, _ in sockets:
        task.cancel()
        await ws.close()
    return {"connect_s": connect_s, "samples": samples, "errors": errors}


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.loads(fh.read())
    result = asyncio.run(_main(spec))
    with open(sys.argv[2], "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()

"""`python -m bench.sustained_client IN.json OUT.json`: the users of the `sustained` benchmark.

A process of its own (its CPU is not the servers'): one asyncio loop, one
websocket per session of a pool (`/ws/sessions/{id}/?after=0`), all connected
first. Then turns arrive evenly, `rate` a second for `seconds`: turn i is posted
at start + i / rate to a session with no turn running (a user does not post
again before the answer), `POST /api/v1/sessions/{id}/messages/` over a pool of
keep-alive connections. Per turn it writes the wall times (`time.time()`, the
clock the servers' rows use) of the POST's start, its 202 and the arrival of
the session's next `turn.finished` frame. A turn that finds every session busy
is counted as `no_session` (the pool is sized so that only an overloaded
platform runs out) and not posted.

The content of each post ends with the session id: the model server tags its
calls with it.

Lines on stdout: "connected" (every websocket open; the bench samples the
servers' CPU, then writes "go" on stdin), "posted" (the last arrival's 202 in),
then the process exits when every turn has finished (or the timeout passed).

IN.json: {"base": "http://127.0.0.1:P", "keys": {session id: its owner's key}, "sessions": [...],
          "content": "...", "rate": 20, "seconds": 60, "timeout": 120}
"""

import asyncio
import collections
import json
import sys
import time
from typing import Any


class _Session:
    def __init__(self, session_id: str, key: str) -> None:
        self.id = session_id
        self.key = key  # its owner's API key
        self.ws: Any = None
        self.task: asyncio.Task[None] | None = None
        # The turn waiting for its turn.finished frame (turns of one session run one at a time).
        self.waiting: asyncio.Future[float] | None = None


async def _connect(ws_base: str, session: _Session) -> None:
    import websockets

    session.ws = await websockets.connect(
        f"{ws_base}/ws/sessions/{session.id}/?after=0",
        additional_headers={"Authorization": f"Bearer {session.key}"},
        max_queue=None,
        open_timeout=60,
    )

    async def reader() -> None:
        try:
            async for raw in session.ws:
                if '"turn.finished"' not in raw:
                    continue
                if json.loads(raw).get("type") == "turn.finished":
                    waiting = session.waiting
                    if waiting is not None and not waiting.done():
                        waiting.set_result(time.time())
        except Exception as exc:  # noqa: BLE001 - reported with the turn
            if session.waiting is not None and not session.waiting.done():
                session.waiting.set_exception(exc)

    session.task = asyncio.create_task(reader())


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    base: str = spec["base"]
    ws_base = "ws" + base.removeprefix("http")
    rate: float = spec["rate"]
    count = round(rate * spec["seconds"])
    sessions = [_Session(s, spec["keys"][s]) for s in spec["sessions"]]
    t0 = time.perf_counter()
    for start in range(0, len(sessions), 100):
        await asyncio.gather(*(_connect(ws_base, s) for s in sessions[start : start + 100]))
    connect_s = time.perf_counter() - t0
    idle: collections.deque[_Session] = collections.deque(sessions)
    turns: list[dict[str, Any]] = []
    errors: list[str] = []
    no_session = 0
    late_ms: list[float] = []
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:

        async def turn(session: _Session) -> None:
            sample: dict[str, Any] = {"session": session.id}
            turns.append(sample)
            loop = asyncio.get_running_loop()
            session.waiting = loop.create_future()
            try:
                sample["post"] = time.time()
                response = await http.post(
                    f"/api/v1/sessions/{session.id}/messages/",
                    json={"content": f"{spec['content']} {session.id}"},
                    headers={"Authorization": f"Bearer {session.key}"},
                )
                sample["answered"] = time.time()
                sample["status"] = response.status_code
                if response.status_code != 202:
                    errors.append(f"{session.id}: {response.status_code} {response.text[:200]}")
                    return
                sample["finished"] = await session.waiting
            except Exception as exc:  # noqa: BLE001 - reported
                errors.append(f"{session.id}: {exc!r}")
            finally:
                session.waiting = None
                idle.append(session)

        print("connected", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        for i in range(count):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late_ms.append(-delay * 1000)
            if not idle:
                no_session += 1
                continue
            tasks.append(asyncio.create_task(turn(idle.popleft())))
        posted_s = time.perf_counter() - start
        print("posted", flush=True)
        try:
            async with asyncio.timeout(spec.get("timeout", 120)):
                await asyncio.gather(*tasks)
        except TimeoutError:
            errors.append(f"{sum(not t.done() for t in tasks)} turns unfinished at the timeout")
    for session in sessions:
        if session.task is not None:
            session.task.cancel()
        await session.ws.close()
    return {
        "connect_s": connect_s,
        "posting_s": posted_s,
        "turns": turns,
        "errors": errors,
        "no_session": no_session,
        # How far behind schedule the client itself fell (its own CPU on a busy machine).
        "client_late_ms_max": max(late_ms, default=0.0),
        "client_late_count": sum(1 for v in late_ms if v > 10),
    }


def main() -> None:
    with open(sys.argv[1]) as fh:
        spec = json.loads(fh.read())
    result = asyncio.run(_main(spec))
    with open(sys.argv[2], "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()

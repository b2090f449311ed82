import asyncio
import json

import httpx
import pytest
import websockets

from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.factories import api_key_for

# Run again with FAST_PATHS=off by make test (tests/lanes.py): the fallbacks on the real stack.
pytestmark = [pytest.mark.e2e, pytest.mark.fast_paths, pytest.mark.django_db(transaction=True)]


async def _collect_until_turn_finished(url: str, key: str, timeout: float = 30) -> list[dict]:
    frames = []
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        async with asyncio.timeout(timeout):
            while True:
                frame = json.loads(await ws.recv())
                frames.append(frame)
                if frame["type"] == "turn.finished":
                    return frames


def test_demo_request_streams_every_step(live_stack):
    demo_install()
    key = api_key_for("alice")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live_stack.http, headers=headers, timeout=10) as client:
        created = client.post("/api/v1/sessions/", json={"agent": "order-support"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]

        async def scenario():
            url = f"{live_stack.ws}/ws/sessions/{session_id}/?after=0"
            task = asyncio.create_task(_collect_until_turn_finished(url, key))
            await asyncio.sleep(0.3)
            posted = await asyncio.to_thread(
                client.post,
                f"/api/v1/sessions/{session_id}/messages/",
                json={"content": DEMO_REQUEST},
            )
            assert posted.status_code == 202, posted.text
            return await task

        frames = asyncio.run(scenario())
        persisted = client.get(f"/api/v1/sessions/{session_id}/events/", params={"after": 0}).json()

    seqs = [f["seq"] for f in frames if f["seq"] is not None]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    assert frames[-1]["type"] == "turn.finished"
    assert [e["seq"] for e in persisted] == seqs
    tools_run = [f["data"]["tool"] for f in frames if f["type"] == "tool.finished"]
    assert tools_run[0] == "query_orders" and tools_run[-1] == "generate_report"
    assert tools_run.count("send_notification") == 3

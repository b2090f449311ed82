"""An HTTP tool end to end: daphne + a Celery worker + beat, and the demo business API as its own
process (`manage.py demo_business_api`) on the test database. A coupon request through the real
worker issues exactly one coupon, the API sees the Idempotency-Key, and the websocket shows the
tool starting and finishing."""

import asyncio
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from demo.models import ApiRequestLog, Coupon, Customer
from record.models import ToolCall
from tests.demo_setup import demo_install
from tests.e2e.support import (
    api,
    collect_until,
    create_session,
    get_messages,
    set_model_options,
    until_turns_finished,
    ws_connect,
)
from tests.factories import api_key_for
from tests.stack import BIN, ROOT, Stack, free_port
from tools.models import Tool

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def business_api(live_stack: Stack) -> Iterator[str]:
    """`manage.py demo_business_api` on a free port, with the live stack's environment (test database)."""
    port = free_port()
    log = ROOT / ".data" / "test-logs" / f"demoapi-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            [str(BIN / "python"), "manage.py", "demo_business_api", "--port", str(port)],
            cwd=ROOT, env=live_stack.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (
                f"demo_business_api exited:\n{log.read_text(errors='replace')}"
            )
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "demo_business_api did not start"
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_a_coupon_request_through_the_worker_issues_exactly_one_coupon(
    live_stack, business_api, monkeypatch
):
    # The demo config's HTTP tools follow DEMO_API_URL, resolved and stored by apply_config.
    monkeypatch.setenv("DEMO_API_URL", business_api)
    demo_install()
    set_model_options("rules", chunk_delay_s=0)
    coupon_tool = Tool.objects.get(name="issue_coupon")
    assert (coupon_tool.url, coupon_tool.status_url) == (
        f"{business_api}/coupons",
        f"{business_api}/coupons/status",
    )
    customer = Customer.objects.order_by("id").first()
    ApiRequestLog.objects.all().delete()  # the readiness probe
    key = api_key_for("coupon-e2e", ("support",))

    with api(live_stack, key) as client:
        session_id = create_session(client, "order-support")

        async def scenario() -> list[dict]:
            async with ws_connect(live_stack, session_id, key, after=0) as ws:
                posted = await asyncio.to_thread(
                    client.post,
                    f"/api/v1/sessions/{session_id}/messages/",
                    json={
                        "content": f"Please issue a coupon of 10 for customer {customer.pk}, the parcel was late."
                    },
                )
                assert posted.status_code == 202, posted.text
                return await collect_until(ws, until_turns_finished(1), timeout=30)

        frames = asyncio.run(scenario())
        messages = get_messages(client, session_id)

    started = [f["data"] for f in frames if f["type"] == "tool.started"]
    finished = [f["data"] for f in frames if f["type"] == "tool.finished"]
    assert [s["tool"] for s in started] == ["issue_coupon"]
    assert started[0]["input"]["customer_id"] == str(customer.pk)  # as the model sent it
    (done,) = finished
    assert (done["tool"], done["status"], done["call_id"]) == (
        "issue_coupon",
        "success",
        started[0]["call_id"],
    )
    assert sorted(done["coercions"]) == [
        'amount: "10" -> 10',
        f'customer_id: "{customer.pk}" -> {customer.pk}',
    ]
    started_at = next(f["seq"] for f in frames if f["type"] == "tool.started")
    finished_at = next(f["seq"] for f in frames if f["type"] == "tool.finished")
    assert started_at < finished_at < frames[-1]["seq"]
    assert frames[-1]["type"] == "turn.finished" and frames[-1]["data"]["stop_reason"] == "answer"

    coupon = Coupon.objects.get()  # exactly one
    call = ToolCall.objects.get(session_id=session_id)
    assert (coupon.customer_id, coupon.amount, coupon.idempotency_key) == (
        customer.pk,
        10,
        call.idempotency_key,
    )
    assert done["output"]["coupon_code"] == coupon.code and done["output"]["duplicate"] is False
    posts = list(
        ApiRequestLog.objects.filter(method="POST", path="/coupons").values_list(
            "idempotency_key", "status"
        )
    )
    assert posts == [(call.idempotency_key, 201)]
    assert call.idempotency_key.startswith(f"{session_id}:1:")
    assert messages[-1]["role"] == "assistant"
    assert (
        messages[-1]["content"]
        == f"Coupon {coupon.code} for 10.00 was issued to customer {customer.pk}."
    )

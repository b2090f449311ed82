"""Cross-tenant attempts over REST, the websocket and the admin, generated: another
owner's sessions, messages, events, checkpoints, forks, cancels, resumes, approvals,
tool calls and usage. Every one must fail (403/404, a refused websocket, the admin's
"does not exist") and no response may carry the other tenant's data; afterwards the
victim's records are as they were."""

import asyncio
import itertools
import json
import random
import time
import uuid
from typing import Any

import pytest
import websockets
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from approvals.models import Approval
from billing.models import CreditAccount, OwnerBudget
from record.models import Checkpoint, Event, Message, ModelCall, Session, ToolCall, Transition
from tests.e2e.support import api, create_session, post_message
from tests.factories import AgentFactory, ModelEndpointFactory, ToolFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECRET = f"alice-secret-{uuid.uuid4().hex}"
ATTEMPTS_MIN = 500


def _agent() -> str:
    ToolFactory(
        name="stamp",
        handler="builtin.current_time",
        side_effects=True,
        requires_approval=True,
        parameters={"type": "object", "properties": {"note": {"type": "string"}}},
    )
    slug = f"tenancy-{uuid.uuid4().hex[:8]}"
    AgentFactory(
        slug=slug,
        model=ModelEndpointFactory(name="rules", api="rules", options={}),
        tools=["stamp"],
        rules=[
            {"when": {"last_tool": "stamp"}, "answer": f"Stamped {SECRET}"},
            {"when": {"user": "stamp", "last_tool": None},
             "tool_calls": [{"tool": "stamp", "args": {"note": SECRET}}]},
            {"answer": f"Hello {SECRET}"},
        ],
    )  # fmt: skip
    return slug


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _snapshot(ids: list[str]) -> list[Any]:
    return [
        list(
            Session.objects.filter(pk__in=ids).order_by("pk").values_list("pk", "state", "version")
        ),
        Message.objects.filter(session_id__in=ids).count(),
        Event.objects.filter(session_id__in=ids).count(),
        list(Approval.objects.filter(session_id__in=ids).values_list("pk", "status")),
        Session.objects.filter(forked_from_id__in=ids).count(),
    ]


def _leaks(text: str) -> bool:
    return SECRET in text


def test_cross_tenant_attempts_all_fail(live_stack: Stack):
    rng = random.Random(14)
    slug = _agent()
    alice, bob = api_key_for("alice"), api_key_for("bob")

    # 1. Alice's tenant: a finished turn and one waiting for an approval.
    with api(live_stack, alice) as client:
        done = create_session(client, slug)
        post_message(client, done, f"hi {SECRET}")
        waiting = create_session(client, slug)
        post_message(client, waiting, f"stamp {SECRET}")
        _wait(lambda: Session.objects.get(pk=done).state == "finished", 30, "first turn")
        _wait(lambda: Session.objects.get(pk=waiting).state == "awaiting_approval", 30, "approval")
    victims = [done, waiting]
    approval = str(Approval.objects.get(session_id=waiting).pk)
    tool_call = str(ToolCall.objects.get(session_id=waiting).pk)
    steps = list(Checkpoint.objects.filter(session_id=done).values_list("step", flat=True))
    alice_user = Session.objects.get(pk=done).owner
    CreditAccount.objects.create(owner=alice_user, balance=1000, low_water_mark=10)
    OwnerBudget.objects.create(owner=alice_user, day_tokens=10**6)
    before = _snapshot(victims)
    with api(live_stack, bob) as client:
        bob_session = create_session(client, slug)
    outcomes: list[tuple[str, str, int, bool]] = []  # channel, what, status, leaked

    # 2. REST: Bob's key against Alice's ids (and ids of the wrong kind).
    ids = [*victims, approval, tool_call, str(uuid.uuid4())]
    rest = [
        ("GET", "/api/v1/sessions/{id}/", None),
        ("GET", "/api/v1/sessions/{id}/messages/?limit={n}", None),
        ("POST", "/api/v1/sessions/{id}/messages/", {"content": "take over {n}"}),
        ("GET", "/api/v1/sessions/{id}/events/?after={n}", None),
        ("POST", "/api/v1/sessions/{id}/cancel/", {}),
        ("POST", "/api/v1/sessions/{id}/fork/", {"checkpoint": "{step}"}),
        ("POST", "/api/v1/sessions/{id}/resume/", {}),
        ("GET", "/api/v1/sessions/{id}/checkpoints/", None),
        ("POST", "/api/v1/approvals/{id}/approve/", {"comment": "ok {n}"}),
        ("POST", "/api/v1/approvals/{id}/reject/", {"comment": "no {n}"}),
        ("POST", "/api/v1/approvals/{id}/review/", {"answer": "yes"}),
        ("POST", "/api/v1/approvals/{id}/withdraw/", {"comment": "mine {n}"}),
        ("POST", "/api/v1/approvals/{id}/change/", {"decision": "rejected", "comment": "{n}"}),
    ]
    requests = [(m, p, b, i) for (m, p, b), i in itertools.product(rest, ids)]
    requests += [rng.choice(requests) for _ in range(400 - len(requests))]
    with api(live_stack, bob) as client:
        for method, template, body, target in requests:
            n, step = rng.randint(0, 50), rng.choice(steps)
            path = template.format(id=target, n=n, step=step)
            payload = (
                json.loads(json.dumps(body).replace('"{step}"', str(step)).replace("{n}", str(n)))
                if body is not None
                else None
            )
            response = client.request(method, path, json=payload)
            outcomes.append(
                ("rest", f"{method} {path}", response.status_code, _leaks(response.text))
            )
        # Lists and usage: Bob's own, with nothing of Alice's in them.
        for path in ["/api/v1/sessions/", "/api/v1/approvals/", "/api/v1/usage/"] * 10:
            response = client.get(path)
            # (A tool call's id is a small integer: only the UUIDs are looked for.)
            ok = response.status_code in (200, 403) and not any(
                v in response.text for v in [*victims, approval]
            )
            what = f"GET {path} -> {response.status_code} {response.text[:300]}"
            outcomes.append(("rest", what, 404 if ok else 200, _leaks(response.text)))

    # 3. The websocket: Bob's key on Alice's sessions (any `after`), then frames naming them.
    async def websocket_attempts() -> list[tuple[str, str, int, bool]]:
        found: list[tuple[str, str, int, bool]] = []
        for target in [*victims, approval, tool_call] * 10:
            url = f"{live_stack.ws}/ws/sessions/{target}/?after={rng.randint(0, 5)}"
            text, status = "", 0
            try:
                async with websockets.connect(
                    url, additional_headers={"Authorization": f"Bearer {bob}"}, open_timeout=10
                ) as ws:
                    while True:
                        text += str(await asyncio.wait_for(ws.recv(), 5))
            except websockets.ConnectionClosed as closed:
                status = closed.rcvd.code if closed.rcvd else 1006
            except websockets.InvalidStatus as refused:
                status = refused.response.status_code
            except TimeoutError:
                status = 200  # the socket stayed open on another tenant's session
            found.append(("ws", url, status, _leaks(text) or f'"session_id": "{target}"' in text))
        # Bob's own socket, asked about Alice's session in its frames.
        url = f"{live_stack.ws}/ws/sessions/{bob_session}/"
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {bob}"}, open_timeout=10
        ) as ws:
            for target in victims * 5:
                frame = {"type": "user_message", "session_id": target, "content": "hi"}
                await ws.send(json.dumps(frame))
                await ws.send(json.dumps({"type": "cancel", "session_id": target}))
                await ws.send(json.dumps({"type": "resync", "after": 0, "session_id": target}))
            text = ""
            try:
                while True:
                    text += str(await asyncio.wait_for(ws.recv(), 2))
            except (TimeoutError, websockets.ConnectionClosed):
                pass
            found.append(("ws", "frames naming Alice's sessions", 404, _leaks(text)))
        return found

    outcomes += asyncio.run(websocket_attempts())

    # 4. The admin: a staff user of Bob's tenant, with every model permission, not a superuser.
    staff = get_user_model().objects.get(username="bob")
    staff.is_staff = True
    staff.set_password("pw-bob-staff")
    staff.save()
    staff.user_permissions.set(Permission.objects.all())
    admin = Client()
    admin.force_login(staff)
    objects = {
        "agent_sessions/session": victims,
        "agent_sessions/message": list(Message.objects.filter(session_id__in=victims).values_list("pk", flat=True)),
        "agent_sessions/toolcall": [tool_call],
        "agent_sessions/transition": list(Transition.objects.filter(session_id__in=victims).values_list("pk", flat=True)[:10]),
        "agent_sessions/checkpoint": list(Checkpoint.objects.filter(session_id__in=victims).values_list("pk", flat=True)[:10]),
        "agent_sessions/event": list(Event.objects.filter(session_id__in=victims).values_list("pk", flat=True)[:10]),
        "agent_sessions/modelcall": list(ModelCall.objects.filter(session_id__in=victims).values_list("pk", flat=True)),
        "approvals/approval": [approval],
        "billing/creditaccount": list(CreditAccount.objects.filter(owner=alice_user).values_list("pk", flat=True)),
        "billing/ownerbudget": list(OwnerBudget.objects.filter(owner=alice_user).values_list("pk", flat=True)),
        "accounts/apikey": list(alice_user.api_keys.values_list("pk", flat=True)),
    }  # fmt: skip
    pages: list[tuple[str, str, dict[str, Any] | None]] = []
    for model, pks in objects.items():
        for pk in pks:
            pages.append(("GET", f"/admin/{model}/{pk}/change/", None))
            pages.append(("GET", f"/admin/{model}/{pk}/history/", None))
            pages.append(("GET", f"/admin/{model}/{pk}/delete/", None))
        pages.append(("GET", f"/admin/{model}/?q={victims[0]}", None))
        pages.append(("GET", f"/admin/{model}/", None))
    for session_id in victims:
        pages.append(("POST", f"/admin/agent_sessions/session/{session_id}/cancel/", {}))
        for action in ("resume", "force_finish", "fork", "take_over", "hand_back"):
            pages.append(("POST", f"/admin/agent_sessions/session/{session_id}/operate/", {"action": action, "content": "x", "step": steps[0]}))  # fmt: skip
    pages.append(("GET", "/admin/billing/usagedaily/?group=user", None))
    for method, path, data in pages:
        response = admin.get(path) if method == "GET" else admin.post(path, data or {})
        body = response.content.decode(errors="replace")
        listed = path.endswith("/") and "/change/" not in path and "?" not in path.split("/")[-1]
        if response.status_code == 200 and (listed or "?q=" in path):
            # A list page of Bob's tenant: fine, as long as no row of Alice's is on it (a
            # search echoes its own query, so rows are told by their links).
            linked = any(f"{v}/change/" in body for v in [*victims, approval])
            status = 404 if not linked and not _leaks(body) else 200
        else:
            status = response.status_code
        outcomes.append(("admin", f"{method} {path}", status, _leaks(body)))

    # 5. Nothing got through.
    got_in = [o for o in outcomes if o[2] < 300 or o[3]]
    assert len(outcomes) >= ATTEMPTS_MIN, len(outcomes)
    channels = {c: sum(1 for o in outcomes if o[0] == c) for c in ("rest", "ws", "admin")}
    print(f"cross-tenant attempts: {channels}")  # shown with -s
    assert min(channels.values()) >= 30, channels
    assert got_in == [], got_in[:20]
    assert {o[2] for o in outcomes if o[0] == "rest"} <= {400, 403, 404, 405}, sorted(
        {o[2] for o in outcomes if o[0] == "rest"}
    )
    assert _snapshot(victims) == before

"""Agents together on the real stack (daphne, a Celery worker, beat, on the test database):
two `agent.<slug>` calls in one step run as two child sessions, over REST and the websocket;
a worker SIGKILLed while those children's side-effecting calls are in flight; a handoff; a
cancelled parent whose child is still running; the parent's admin page in Chromium.

The agents run offline (the `rules` model). The children's side effect is a notice sent to
an HTTP API in this process (`NoticeApi`): it records every request with its
Idempotency-Key and can hold a request long enough for the kill to land in the middle.
"""

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model

from record.models import Event, Message, Session, ToolCall
from tests.e2e.support import (
    Frame,
    api,
    collect_until,
    create_session,
    get_events,
    get_session,
    persisted,
    post_message,
    stack_logs,
    turns_finished,
    until_turns_finished,
    wait_events,
    ws_connect,
)
from tests.e2e.test_admin_pages import (
    CHROMIUM,
    HAVE_BROWSER,
    OPERATOR_PASSWORD,
    WIDTH,
    _login,
    chromium,
)
from tests.e2e.test_workflows_e2e import NoticeApi, _http_tool
from tests.factories import AgentFactory, ModelEndpointFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("AGENTS_SHOTS_DIR") or "/tmp/agents-e2e")

# The boss asks two agents at once, or one, or hands the conversation to billing.
BOSS_RULES: list[dict[str, Any]] = [
    {"when": {"user": "^ask both to notify (\\w+) and (\\w+)$", "last_tool": None},
     "tool_calls": [{"tool": "agent.researcher", "args": {"task": "notify {{ match.1 }}"}},
                    {"tool": "agent.writer", "args": {"task": "notify {{ match.2 }}"}}]},
    {"when": {"user": "^ask the researcher to notify (\\w+)$", "last_tool": None},
     "tool_calls": [{"tool": "agent.researcher", "args": {"task": "notify {{ match.1 }}"}}]},
    {"when": {"user": "bill me", "last_tool": None},
     "tool_calls": [{"tool": "transfer_to_billing", "args": {"reason": "a billing question"}}]},
    {"when": {"last_tool": "agent.writer"},
     "answer": "Both: {{ results.0.answer }} / {{ results.1.answer }}"},
    {"when": {"last_tool": "agent.researcher"}, "answer": "Researcher: {{ result.answer }}"},
    {"answer": "boss here ({{ user }})"},
]  # fmt: skip


def _notifier_rules(who: str) -> list[dict[str, Any]]:
    """A child agent: send the notice its task names, then say so."""
    return [
        {"when": {"user": "^notify (\\w+)$", "last_tool": None},
         "tool_calls": [{"tool": "send_notice", "args": {"customer": "{{ match.1 }}"}}]},
        {"when": {"last_tool": "send_notice"},
         "answer": f"{who} sent notice {{{{ result.notice }}}} to {{{{ result.customer }}}}"},
        {"answer": f"{who} here"},
    ]  # fmt: skip


def _agents(notices: NoticeApi, writer_latency_s: float = 0.0) -> None:
    """The boss, its two notifying agents and billing; the writer's model may be slower."""
    model = ModelEndpointFactory(name="rules", api="rules", options={})
    slower = ModelEndpointFactory(
        name="rules-writer", api="rules", options={"latency_s": writer_latency_s}
    )
    _http_tool(
        "send_notice",
        notices.http.url("/notices"),
        {"customer": {"type": "string"}},
        side_effects=True,
        status_url=notices.http.url("/notices/status"),
    )
    AgentFactory(
        slug="researcher", model=model, tools=["send_notice"], rules=_notifier_rules("researcher")
    )
    AgentFactory(
        slug="writer", model=slower, tools=["send_notice"], rules=_notifier_rules("writer")
    )
    AgentFactory(slug="billing", model=model, rules=[{"answer": "billing speaking ({{ user }})"}])
    AgentFactory(
        slug="boss",
        model=model,
        tools=["agent.researcher", "agent.writer"],
        handoffs=["billing"],
        rules=BOSS_RULES,
    )


def _children(session_id: str) -> dict[str, Session]:
    """The parent's children by agent slug (at most one each in these tests)."""
    found: dict[str, Session] = {}
    for child in Session.objects.filter(parent_id=session_id).select_related("agent"):
        assert child.agent.slug not in found, f"two {child.agent.slug} children"
        found[child.agent.slug] = child
    return found


def _gapless(events: list[Frame]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), [
        (e["seq"], e["type"]) for e in events
    ]


def _wait_state(
    client: httpx.Client, session_id: str, state: str, timeout: float, describe: Callable[[], str]
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        session = get_session(client, session_id)
        if session["state"] == state:
            return session
        if time.monotonic() > deadline:
            raise AssertionError(f"state {session['state']}, wanted {state}\n{describe()}")
        time.sleep(0.05)


# 1. Two agents as tools in one step ---------------------------------------------------------


def test_two_agent_calls_in_one_step_run_as_two_children_and_the_answer_combines_them(
    live_stack: Stack,
) -> None:
    logs = stack_logs(live_stack)
    key = api_key_for("alice")
    with NoticeApi(delay_s=0.3).running() as notices, api(live_stack, key) as client:
        _agents(notices)
        parent = create_session(client, "boss")

        async def watch() -> list[Frame]:
            async with ws_connect(live_stack, parent, key, after=0) as ws:
                post_message(client, parent, "ask both to notify ada and bob")
                return await collect_until(ws, until_turns_finished(1), 20, logs)

        frames = asyncio.run(watch())
        events = get_events(client, parent)
        body = get_session(client, parent)
        children = _children(parent)
        streams = {
            slug: wait_events(client, str(child.pk), turns_finished(1), 10, logs)
            for slug, child in children.items()
        }
        child_bodies = {slug: get_session(client, str(c.pk)) for slug, c in children.items()}

    researcher, writer = children["researcher"], children["writer"]
    calls = {c.tool_name: c.call_id for c in ToolCall.objects.filter(session_id=parent, turn=1)}
    # The parent's stream: both children started (in the same step), both finished, then
    # the answer that combines theirs.
    kinds = [f["type"] for f in persisted(frames)]
    started = [f["data"] for f in frames if f["type"] == "child.started"]
    finished = [f["data"] for f in frames if f["type"] == "child.finished"]
    assert sorted(started, key=lambda d: d["agent"]) == [
        {
            "call_id": calls["agent.researcher"],
            "session": str(researcher.pk),
            "agent": "researcher",
        },
        {"call_id": calls["agent.writer"], "session": str(writer.pk), "agent": "writer"},
    ]
    assert sorted(finished, key=lambda d: d["agent"]) == [
        {"call_id": calls["agent.researcher"], "session": str(researcher.pk),
         "agent": "researcher", "state": "finished"},
        {"call_id": calls["agent.writer"], "session": str(writer.pk),
         "agent": "writer", "state": "finished"},
    ]  # fmt: skip
    last_started = max(i for i, k in enumerate(kinds) if k == "child.started")
    first_finished = kinds.index("child.finished")
    assert last_started < first_finished, kinds
    answer = [
        f["data"]["content"]
        for f in frames
        if f["type"] == "message.completed" and f["data"]["role"] == "assistant"
    ][-1]
    by_customer = {n["customer"]: n["notice"] for n in notices.sent.values()}
    assert answer == (
        f"Both: researcher sent notice {by_customer['ada']} to ada"
        f" / writer sent notice {by_customer['bob']} to bob"
    )
    assert kinds.index("child.finished") < len(kinds) - 1 and kinds[-1] == "turn.finished"
    assert frames[-1]["data"]["stop_reason"] == "answer"
    # What streamed is what was kept.
    assert [(f["seq"], f["type"], f["data"]) for f in persisted(frames)] == [
        (e["seq"], e["type"], e["data"]) for e in events
    ]
    _gapless(events)

    # The API shows the tree.
    assert body["state"] == "finished" and body["parent"] is None
    assert sorted(body["children"]) == sorted([str(researcher.pk), str(writer.pk)])
    for slug, child_body in child_bodies.items():
        assert child_body["parent"] == parent and child_body["agent"] == slug
        assert child_body["state"] == "finished" and child_body["children"] == []

    # Each child's own events are on its own stream: its notice, its answer; no child.* there.
    for slug, customer in (("researcher", "ada"), ("writer", "bob")):
        stream = streams[slug]
        _gapless(stream)
        tools = [(e["type"], e["data"]["tool"]) for e in stream if e["type"].startswith("tool.")]
        assert tools == [("tool.started", "send_notice"), ("tool.finished", "send_notice")]
        said = [
            e["data"]["content"]
            for e in stream
            if e["type"] == "message.completed" and e["data"]["role"] == "assistant"
        ]
        assert said[-1] == f"{slug} sent notice {by_customer[customer]} to {customer}"
        assert not [e for e in stream if e["type"].startswith("child.")]
        assert stream[-1]["type"] == "turn.finished"
    assert Counter(n["customer"] for n in notices.sent.values()) == Counter(["ada", "bob"])


# 2. SIGKILL while the children run -------------------------------------------------------------


def test_a_worker_killed_while_the_children_run_starts_each_child_once_and_answers_once(
    live_stack: Stack,
) -> None:
    logs = stack_logs(live_stack, "worker", "beat")
    key = api_key_for("alice")
    with NoticeApi(delay_s=3.0).running() as notices, api(live_stack, key) as client:
        # The writer's model takes a second: after the restart the researcher ends first and
        # wakes the parent while the writer still runs, so the parent's step runs again over
        # a call whose child is running.
        _agents(notices, writer_latency_s=1.0)
        parent = create_session(client, "boss")
        post_message(client, parent, "ask both to notify ada and bob")
        # Both children's notices are at the API, unanswered: the children are mid-call.
        notices.wait_sent(2, 15, logs)
        victim = live_stack.procs["worker"]
        children = _children(parent)
        assert set(children) == {"researcher", "writer"}
        held = {slug: (c.state, c.lease_owner or "") for slug, c in children.items()}
        try:
            live_stack.stop("worker", signal.SIGKILL)
            assert victim.poll() == -signal.SIGKILL
            in_flight = {
                c.session.agent.slug: (c.status, c.dispatched_at is not None)
                for c in ToolCall.objects.filter(
                    session__parent_id=parent, status="executing"
                ).select_related("session__agent")
            }
            waiting = Session.objects.get(pk=parent)
        finally:
            live_stack.restart("worker")
        events = wait_events(client, parent, turns_finished(1), 25, logs)
        body = get_session(client, parent)
        ended = {slug: get_events(client, str(child.pk))[-1] for slug, child in children.items()}

    # The kill landed while both children were in their call, the parent waiting without a
    # worker (its lease given back).
    for slug, (state, owner) in held.items():
        assert state == "tool_wait" and f":{victim.pid}:" in owner, (slug, state, owner)
    assert in_flight == {"researcher": ("executing", True), "writer": ("executing", True)}
    assert (waiting.state, waiting.lease_owner) == ("tool_wait", None)

    # One child per call, each ran once: each notice sent once under its call's key; the
    # replacement worker probed the two it could not know about and sent nothing again.
    children = _children(parent)
    assert set(children) == {"researcher", "writer"}
    assert Session.objects.filter(parent_id=parent).count() == 2
    child_calls = list(ToolCall.objects.filter(session__parent_id=parent))
    keys = {c.idempotency_key for c in child_calls}
    assert len(child_calls) == 2 and {c.status for c in child_calls} == {"success"}
    assert notices.posts_by_key() == Counter(dict.fromkeys(keys, 1))
    assert sorted(notices.probed_keys()) == sorted(keys)
    assert [c.probe_outcome for c in child_calls] == ["done", "done"]
    assert Counter(n["customer"] for n in notices.sent.values()) == Counter(["ada", "bob"])
    for child in children.values():
        child.refresh_from_db()
        assert child.state == "finished" and child.turn == 1
    assert {e["type"] for e in ended.values()} == {"turn.finished"}
    gap = datetime.fromisoformat(ended["writer"]["ts"]) - datetime.fromisoformat(
        ended["researcher"]["ts"]
    )
    assert gap.total_seconds() > 0.5, gap  # the parent was woken while the writer ran

    # The parent got each answer once: one result per call, one child.finished per child,
    # one answer, one finished turn.
    parent_calls = list(ToolCall.objects.filter(session_id=parent))
    assert sorted(c.tool_name for c in parent_calls) == ["agent.researcher", "agent.writer"]
    assert {c.status for c in parent_calls} == {"success"}
    results = Counter(
        Message.objects.filter(session_id=parent, role="tool").values_list(
            "tool_call_id", flat=True
        )
    )
    assert results == Counter({c.call_id: 1 for c in parent_calls})
    finished = [e["data"] for e in events if e["type"] == "child.finished"]
    assert sorted((d["agent"], d["session"], d["state"]) for d in finished) == sorted(
        (slug, str(c.pk), "finished") for slug, c in children.items()
    )
    assert Counter(e["type"] for e in events)["child.started"] == 2
    assert Counter(e["type"] for e in events)["turn.finished"] == 1
    assert events[-1]["type"] == "turn.finished"
    assert events[-1]["data"]["stop_reason"] == "answer"
    by_customer = {n["customer"]: n["notice"] for n in notices.sent.values()}
    answers = Message.objects.filter(session_id=parent, role="assistant", seq__isnull=False)
    assert [m.content for m in answers if m.content] == [
        f"Both: researcher sent notice {by_customer['ada']} to ada"
        f" / writer sent notice {by_customer['bob']} to bob"
    ]
    assert body["state"] == "finished"
    _gapless(events)


# 3. A handoff ---------------------------------------------------------------------------------


def test_a_handoff_over_the_websocket_changes_who_answers(live_stack: Stack) -> None:
    logs = stack_logs(live_stack)
    key = api_key_for("alice")
    with NoticeApi(delay_s=0).running() as notices, api(live_stack, key) as client:
        _agents(notices)
        session = create_session(client, "boss")

        async def talk() -> list[Frame]:
            async with ws_connect(live_stack, session, key, after=0) as ws:
                post_message(client, session, "hello")
                frames = await collect_until(ws, until_turns_finished(1), 15, logs)
                post_message(client, session, "bill me")
                return frames + await collect_until(ws, until_turns_finished(1), 15, logs)

        frames = asyncio.run(talk())
        body = get_session(client, session)
        events = get_events(client, session)

    said = [
        f["data"]["content"]
        for f in frames
        if f["type"] == "message.completed"
        and f["data"]["role"] == "assistant"
        and f["data"]["content"]
    ]
    assert said == ["boss here (hello)", "billing speaking (bill me)"]
    changed = [f for f in frames if f["type"] == "agent.changed"]
    assert [f["data"] for f in changed] == [
        {"from": "boss", "to": "billing", "reason": "a billing question"}
    ]
    kinds = [f["type"] for f in persisted(frames)]
    # The handoff comes with the transfer's result, before the new agent's answer.
    answer_at = max(
        i
        for i, f in enumerate(persisted(frames))
        if f["type"] == "message.completed" and f["data"]["role"] == "assistant"
    )
    assert kinds.index("agent.changed") < answer_at, kinds
    assert body["agent"] == "billing"
    assert [(f["seq"], f["type"], f["data"]) for f in persisted(frames)] == [
        (e["seq"], e["type"], e["data"]) for e in events
    ]
    transfer = ToolCall.objects.get(session_id=session, tool_name="transfer_to_billing")
    assert transfer.status == "success"
    assert Event.objects.filter(session_id=session, type="agent.changed").count() == 1


# 4. Cancelling the parent while a child runs ----------------------------------------------------


def test_cancelling_the_parent_while_its_child_runs_cancels_both(live_stack: Stack) -> None:
    logs = stack_logs(live_stack, "worker", "beat")
    key = api_key_for("alice")
    with NoticeApi(delay_s=2.0).running() as notices, api(live_stack, key) as client:
        _agents(notices)
        parent = create_session(client, "boss")
        post_message(client, parent, "ask the researcher to notify ada")
        notices.wait_sent(1, 15, logs)  # the child is in its call
        [child] = Session.objects.filter(parent_id=parent)
        running = child.state
        cancelled = client.post(f"/api/v1/sessions/{parent}/cancel/")
        assert cancelled.status_code == 200, cancelled.text
        events = wait_events(client, parent, turns_finished(1), 15, logs)
        child_events = wait_events(client, str(child.pk), turns_finished(1), 15, logs)
        bodies = {s: get_session(client, s) for s in (parent, str(child.pk))}

    assert running == "tool_wait"
    assert cancelled.json()["cancelled"] is True
    assert bodies[parent]["state"] == "cancelled"
    assert bodies[str(child.pk)]["state"] == "cancelled"
    last = events[-1]
    assert last["type"] == "turn.finished" and last["data"]["stop_reason"] == "cancelled"
    child_last = child_events[-1]
    assert child_last["type"] == "turn.finished"
    assert child_last["data"]["stop_reason"] == "cancelled"
    assert "its parent was cancelled" in child_last["data"].get("reason", ""), child_last
    # The child's call in flight finished and was recorded (its effect happened once); the
    # child asked its model nothing after it, and the parent wrote no answer.
    [call] = ToolCall.objects.filter(session_id=child.pk)
    assert call.status == "success"
    assert notices.posts_by_key() == Counter({call.idempotency_key: 1})
    assert not Message.objects.filter(session_id=child.pk, role="assistant", content__startswith="researcher sent").exists()  # fmt: skip
    assert not Message.objects.filter(
        session_id=parent, role="assistant", content__startswith="Researcher"
    ).exists()
    _gapless(events)


# 5. The parent's page in the admin ---------------------------------------------------------------


@pytest.mark.skipif(
    not HAVE_BROWSER,
    reason=f"needs the playwright package and Chromium at {CHROMIUM} "
    "(apt-get install chromium; `playwright install` is not used)",
)
def test_the_parents_admin_page_lists_its_children_and_their_events(live_stack: Stack) -> None:
    """Screenshots go to AGENTS_SHOTS_DIR (default /tmp/agents-e2e), 1400 px wide."""
    get_user_model().objects.create_superuser("operator", "op@example.com", OPERATOR_PASSWORD)
    logs = stack_logs(live_stack)
    key = api_key_for("alice")
    with NoticeApi(delay_s=0.1).running() as notices, api(live_stack, key) as client:
        _agents(notices)
        parent = create_session(client, "boss")
        post_message(client, parent, "ask both to notify ada and bob")
        wait_events(client, parent, turns_finished(1), 15, logs)
        post_message(client, parent, "bill me")
        wait_events(client, parent, turns_finished(2), 15, logs)
    children = _children(parent)
    calls = dict(ToolCall.objects.filter(session_id=parent).values_list("tool_name", "call_id"))
    admin = f"{live_stack.http}/admin/agent_sessions/session"

    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, live_stack)
        page.goto(f"{admin}/{parent}/change/")
        listed = page.evaluate(
            "[...document.querySelectorAll('#ap-summary ul.ap-children li')].map(li => "
            "[li.innerText.trim(), li.querySelector('a').getAttribute('href'), "
            "li.getBoundingClientRect().height, parseFloat(getComputedStyle(li).fontSize)])"
        )
        agent = page.locator("#ap-summary dl.ap-facts dd").first.inner_text()
        rows = page.evaluate(
            "[...document.querySelectorAll('#ap-timeline tbody tr.event td.summary summary')]"
            ".map(s => s.innerText.trim())"
        )
        overflow = page.evaluate("[document.body.scrollWidth, window.innerWidth]")
        page.screenshot(path=str(SHOTS / "parent-session.png"), full_page=True)
        page.locator("#ap-summary").screenshot(path=str(SHOTS / "parent-session-summary.png"))
        # The timeline with its events only (the other kinds unticked).
        for kind in ("transition", "message", "toolcall", "checkpoint", "approval"):
            page.uncheck(f"#ap-timeline input[data-kind={kind}]")
        page.locator("#ap-timeline").screenshot(path=str(SHOTS / "parent-session-events.png"))
        # A child's page links back to its parent.
        page.click(f"#ap-summary ul.ap-children a[href*='{children['writer'].pk}']")
        page.wait_for_url(f"{admin}/{children['writer'].pk}/change/")
        back = page.locator("#ap-summary a[href*='" + parent + "']").inner_text()
        page.locator("#ap-summary").screenshot(path=str(SHOTS / "child-session-summary.png"))

    researcher, writer = children["researcher"], children["writer"]
    # One line per child, oldest first, each linking to its own page.
    assert [row[:2] for row in listed] == [
        [
            f"{str(c.pk)[:8]} {slug} · finished · call {calls[f'agent.{slug}']}",
            f"/admin/agent_sessions/session/{c.pk}/change/",
        ]
        for slug, c in (("researcher", researcher), ("writer", writer))
    ]
    assert all(height < 2.5 * font for _, _, height, font in listed), listed  # none wraps
    assert agent == "billing"  # handed over
    assert overflow[0] <= overflow[1], overflow
    # The timeline says who started, who finished and who took over, in a line each.
    wanted = [
        f"child.started · researcher started · session {str(researcher.pk)[:8]}"
        f" · call {calls['agent.researcher']}",
        f"child.started · writer started · session {str(writer.pk)[:8]}"
        f" · call {calls['agent.writer']}",
        f"child.finished · researcher finished · session {str(researcher.pk)[:8]}"
        f" · call {calls['agent.researcher']}",
        f"child.finished · writer finished · session {str(writer.pk)[:8]}"
        f" · call {calls['agent.writer']}",
        "agent.changed · boss → billing: a billing question",
    ]
    assert [r for r in rows if r.startswith(("child.", "agent."))] == wanted, rows
    assert back == parent[:8]

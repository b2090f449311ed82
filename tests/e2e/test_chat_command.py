"""`manage.py chat`: an operator's terminal view of a turn run by the real worker."""

import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from record.models import Session
from tests.demo_setup import DEMO_REQUEST, demo_install
from tests.stack import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _chat_process(live_stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`manage.py chat` as an operator runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "manage.py", "chat", *args],
        cwd=ROOT,
        env=live_stack.env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def _chat(live_stack, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process, against the same live stack (its worker runs the
    turn; the frames come through the same channel layer): a Django start-up less per call.
    A CommandError ends it as `manage.py` would, with status 1 and the message on stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("chat", *args, stdout=out, stderr=err)
    except CommandError as error:
        err.write(f"CommandError: {error}\n")
        code = 1
    return subprocess.CompletedProcess(["chat", *args], code, out.getvalue(), err.getvalue())


def test_chat_runs_the_demo_turn_through_the_worker_and_prints_its_events(live_stack):
    demo_install()
    done = _chat_process(live_stack, "--agent", "order-support", "--json", DEMO_REQUEST)
    assert done.returncode == 0, done.stderr + live_stack.log_tail("worker")
    frames = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    persisted = [f["seq"] for f in frames if f["seq"] is not None]
    assert persisted == sorted(persisted) and len(persisted) == len(set(persisted))
    assert frames[-1]["type"] == "turn.finished" and frames[-1]["data"]["stop_reason"] == "answer"
    tools = [f["data"]["tool"] for f in frames if f["type"] == "tool.finished"]
    assert tools.count("send_notification") == 3 and tools[-1] == "generate_report"
    # The turn really ran on the worker: the session it opened is finished in the database.
    session = Session.objects.get(pk=frames[-1]["session"])
    assert session.state == "finished" and session.turn == 1


def test_chat_continues_a_session_and_prints_a_readable_view(live_stack):
    demo_install()
    first = _chat(live_stack, "--agent", "order-support", DEMO_REQUEST)
    assert first.returncode == 0, first.stderr
    session_id = first.stderr.split("session ", 1)[1].split()[0]
    # Sessions belong to the `cli` user unless --user says otherwise; the stderr line says so.
    assert "owner cli" in first.stderr
    lines = first.stdout.splitlines()
    assert lines and all(line.strip() for line in lines), first.stdout  # no blank lines
    finished = [line for line in lines if "tool.finished: send_notification success in " in line]
    assert len(finished) == 3 and all(line.endswith(" ms") for line in finished), finished
    # Long arguments are cut with an ellipsis, not mid-character.
    started = [line for line in lines if "tool.started: generate_report(" in line]
    assert started and started[0].endswith("…)"), started
    # The final answer appears once (streamed, then only referred to).
    answer = "I found 3 orders with logistics exceptions"
    assert first.stdout.count(answer) == 1, first.stdout
    assert lines[-1].startswith("[") and "turn.finished: turn 1 answer" in lines[-1]

    # --session alone continues it: no --agent needed.
    again = _chat(live_stack, "--session", session_id, "hi again")
    assert again.returncode == 0, again.stderr
    assert "state.changed: finished -> processing" in again.stdout
    assert "turn.finished: turn 2" in again.stdout
    assert Session.objects.get(pk=session_id).turn == 2

    mismatch = _chat(live_stack, "--session", session_id, "--user", "demo", "hello")
    assert mismatch.returncode != 0 and "belongs to 'cli'" in mismatch.stderr


def test_chat_opens_a_session_for_the_user_named(live_stack):
    demo_install()
    done = _chat(live_stack, "--agent", "order-support", "--user", "demo", "hello")
    assert done.returncode == 0, done.stderr
    session_id = done.stderr.split("session ", 1)[1].split()[0]
    assert Session.objects.get(pk=session_id).owner.username == "demo"
    neither = _chat(live_stack, "hello")
    assert neither.returncode != 0 and "--agent SLUG" in neither.stderr
    assert "Traceback" not in neither.stderr


def test_chat_with_an_unknown_agent_fails_clearly(live_stack):
    done = _chat(live_stack, "--agent", "nope", "hello")
    assert done.returncode != 0
    assert "unknown agent 'nope'" in done.stderr and "Traceback" not in done.stderr

"""record.dispatch: the run's broker publish happens after commit, off the committing thread."""

import logging
import threading

import pytest
from django.db import transaction

from record import dispatch


class _Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.priorities: list[int] = []
        self.fail = fail
        self.done = threading.Event()

    def __call__(self, name: str, args: tuple[str], *, priority: int, **options: object) -> None:
        assert name == dispatch.RUN_TASK
        self.sent.append((args[0], threading.current_thread().name))
        self.priorities.append(priority)
        self.done.set()
        if self.fail:
            raise ConnectionError("broker down")


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    monkeypatch.setattr(dispatch, "task_send", rec)
    return rec


@pytest.mark.django_db
def test_publish_waits_for_commit_and_runs_on_the_sender_thread(
    recorder: _Recorder, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        dispatch.run_enqueue_on_commit("s-1")
        assert recorder.sent == []
    assert recorder.done.wait(5)
    (session_id, thread), *rest = recorder.sent
    assert (session_id, rest) == ("s-1", [])
    assert thread.startswith("run-enqueue")
    assert thread != threading.current_thread().name


@pytest.mark.django_db(transaction=True)
def test_rollback_publishes_nothing(recorder: _Recorder) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch.run_enqueue_on_commit("s-2")
        raise RuntimeError("rolled back")
    dispatch._sender.submit(lambda: None).result(5)  # everything queued before has run
    assert recorder.sent == []


@pytest.mark.django_db
def test_a_failed_publish_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks,
) -> None:
    rec = _Recorder(fail=True)
    monkeypatch.setattr(dispatch, "task_send", rec)
    with caplog.at_level(logging.WARNING, logger="record.dispatch"):
        with django_capture_on_commit_callbacks(execute=True):
            dispatch.run_enqueue_on_commit("s-3")
        dispatch._sender.submit(lambda: None).result(5)
    assert rec.sent and rec.sent[0][0] == "s-3"
    assert "could not enqueue the run of session s-3" in caplog.text


@pytest.mark.django_db
def test_a_run_carries_a_priority_from_the_sessions_value(
    recorder: _Recorder, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        for value in (1.0, 16.0, 0.25, 1000.0, 0.0, None):
            dispatch.run_enqueue_on_commit("s-4", value)
    dispatch._sender.submit(lambda: None).result(5)
    assert recorder.priorities == [5, 1, 7, 1, 9, 5]

"""runtime.tasks: a task is sent by name, from any process, whatever it imported."""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import redis
from django.conf import settings

from tests.stack import ROOT

SEND_FROM_A_WEB_LIKE_PROCESS = textwrap.dedent(
    """
    import sys
    import django

    django.setup()
    from approvals.dispatch import webhook_enqueue
    from memory.dispatch import owner_index_enqueue

    # As in the web process: the webhook task's module was never imported here, so a
    # lookup in this process's registry (how it used to be sent) finds nothing.
    from celery import current_app
    from celery.exceptions import NotRegistered

    assert "approvals.tasks" not in sys.modules
    try:
        current_app.tasks["approvals.tasks.webhook_send"]
    except NotRegistered:
        pass
    else:
        raise AssertionError("the scenario needs a process without the webhook task")
    webhook_enqueue({"approval_id": "a-1", "outcome": "approved"})
    assert owner_index_enqueue(owner_id=7, dims=1536)
    """
)


def test_a_process_that_never_imported_the_tasks_still_sends_them():
    """The approval webhooks decided over REST or in the admin were NotRegistered and lost."""
    queue = f"test-tasks-{uuid.uuid4().hex}"
    env = {**os.environ, "CELERY_QUEUE": queue}
    done = subprocess.run(
        [sys.executable, "-c", SEND_FROM_A_WEB_LIKE_PROCESS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "could not enqueue" not in done.stderr, done.stderr
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        messages = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]
    finally:
        client.delete(queue)
        client.close()
    sent = sorted(message["headers"]["task"] for message in messages)
    assert sent == ["approvals.tasks.webhook_send", "memory.tasks.owner_index_build"], messages

"""Handing an owner-index build to a worker; the task is sent by name (runtime/tasks.py)."""

import logging

from runtime.tasks import task_send

OWNER_INDEX_TASK = "memory.tasks.owner_index_build"


def owner_index_enqueue(*, owner_id: int, dims: int) -> bool:
    try:
        task_send(OWNER_INDEX_TASK, (owner_id, dims))
        return True
    except Exception:  # noqa: BLE001 - a broker down must not fail a write; search stays exact
        logging.getLogger(__name__).warning(
            "memory: could not enqueue the index build of owner %s", owner_id, exc_info=True
        )
        return False

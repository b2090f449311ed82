"""Celery entry points of memory: take ids, call one service."""

from celery import shared_task
from django.db import DatabaseError

from .services import memory_owner_index_build


@shared_task(
    name="memory.tasks.owner_index_build",
    ignore_result=True,
    autoretry_for=(DatabaseError,),
    retry_backoff=30,
    retry_backoff_max=1800,
    retry_jitter=True,
    max_retries=5,
)
def owner_index_build(owner_id: int, dims: int) -> str:
    return memory_owner_index_build(owner_id=owner_id, dims=dims).name

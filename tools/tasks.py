"""Celery entry points of tools: take ids, load the row, call one service."""

from contextlib import suppress

from celery import shared_task

from .env_access import HeaderEnvRefused
from .mcp import McpError
from .models import McpServer
from .services import mcp_server_refresh


@shared_task(name="tools.tasks.mcp_server_refresh", ignore_result=True)
def mcp_server_refresh_run(server_id: int, actor: str) -> None:
    """The admin's queued refresh, in a worker: the server's process or request runs here."""
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        return  # deleted since it was queued: nothing to list
    # A failure is recorded on the row, the trail and the worker's log; no retry (the operator's call).
    with suppress(McpError, HeaderEnvRefused):
        mcp_server_refresh(server=server, actor=actor)

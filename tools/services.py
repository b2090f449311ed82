"""Writes of the tools app: an MCP server's tools made to match what it lists."""

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from audit.models import AuditAction
from audit.services import SYSTEM, audit_record
from runtime import io_loop
from runtime.tasks import task_send

from .descriptions import description_problems, tool_warnings
from .env_access import HeaderEnvRefused
from .mcp import DISCOVERY_TIMEOUT_S, ListedTool, McpEndpoint, McpError, list_tools
from .models import McpServer, RefreshState, Tool, ToolKind

logger = logging.getLogger("tools.mcp")
REFRESH_TASK = "tools.tasks.mcp_server_refresh"

NAME_MAX_CHARS = 64  # Tool.name
# What a refresh reports as a change of the tool (roles and timeouts follow the server's row).
DIFFED_FIELDS = ("description", "parameters", "result_description", "side_effects", "idempotent")


@dataclass
class McpDiff:
    """What one refresh changed in a server's stored tools."""

    server: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"mcp {self.server}: added {name}" for name in self.added]
        out += [f"mcp {self.server}: removed {name}" for name in self.removed]
        out += [
            f"mcp {self.server}: changed {name} ({', '.join(fields)})"
            for name, fields in self.changed.items()
        ]
        out += [f"mcp {self.server}: skipped {reason}" for reason in self.skipped]
        if not (self.added or self.removed or self.changed or self.skipped):
            out.append(f"mcp {self.server}: tools unchanged")
        return out

    def warning_lines(self, *, each: bool = False, see: str = "") -> list[str]:
        """The description warnings: every one (`each`), or one line with their count.

        A third-party server's descriptions are not the operator's to fix, and
        dozens of lines on each apply hide the warnings that are; `see` says
        where the full list is.
        """
        if each or not self.warnings:
            return list(self.warnings)
        tools = len({line.split(": ", 1)[0] for line in self.warnings})
        count = len(self.warnings)
        line = (
            f"mcp server {self.server}: {count} description warning{'s' * (count != 1)} "
            f"on {tools} tool{'s' * (tools != 1)} (the server's own text)"
        )
        return [f"{line}; {see}" if see else line]


def mcp_tool_name(server: str, tool: str) -> str:
    return f"{server}.{tool}"


def _result_description(listed: ListedTool) -> str:
    schema = listed.output_schema or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and properties:
        return "An object with " + ", ".join(sorted(map(str, properties))) + "."
    return ""


def _schema_problem(schema: dict[str, Any]) -> str | None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is not valid JSON Schema ({exc.message})"
    if schema.get("type") != "object":
        return 'its input schema is not {"type": "object"}'
    return None


def mcp_tools_store(*, server: McpServer, listed: list[ListedTool]) -> McpDiff:
    """Make the server's Tool rows match its listing, in the caller's transaction.

    1. Each listed tool becomes (or updates) the row `<server>.<tool>`, kind
       mcp, its input schema as parameters, roles from the server's
       `tool_roles` or `roles`; one whose name would not fit, whose schema is
       unusable, or whose name another tool holds, is skipped and said so.
    2. Rows of tools the server no longer lists are deleted.
    3. Description problems come back as warnings (never errors for MCP tools).
    """
    diff = McpDiff(server=server.name)
    existing = {t.mcp_tool: t for t in Tool.objects.filter(mcp_server=server)}
    for tool in listed:
        name = mcp_tool_name(server.name, tool.name)
        problem = None
        if len(name) > NAME_MAX_CHARS:
            problem = f"has a name of {len(name)} characters; at most {NAME_MAX_CHARS} fit"
        else:
            problem = _schema_problem(tool.input_schema)
        if problem is None and (Tool.objects.filter(name=name).exclude(mcp_server=server).exists()):
            problem = "has the name of another tool"
        if problem is not None:
            diff.skipped.append(f"{name}: {problem}")
            continue
        values: dict[str, Any] = {
            "description": tool.description,
            "parameters": tool.input_schema,
            "result_description": _result_description(tool),
            "kind": ToolKind.MCP,
            "timeout_s": server.timeout_s,
            "roles": server.roles_for(tool.name),
            # Unannotated tools may change things (MCP's default): no blind retry after a timeout.
            "side_effects": tool.read_only is not True,
            "idempotent": bool(tool.read_only or tool.idempotent),
        }
        row = existing.pop(tool.name, None)
        if row is None:
            Tool.objects.create(name=name, mcp_server=server, mcp_tool=tool.name, **values)
            diff.added.append(name)
        else:
            changed = [k for k, v in values.items() if getattr(row, k) != v]
            for key in changed:
                setattr(row, key, values[key])
            if changed:
                row.save()
            reported = [k for k in changed if k in DIFFED_FIELDS]
            if reported:
                diff.changed[name] = reported
        diff.warnings += tool_warnings(
            name,
            description_problems(
                description=tool.description,
                parameters=tool.input_schema,
                result_description=values["result_description"],
                output_schema=tool.output_schema,
            ),
        )
    for gone in existing.values():
        diff.removed.append(gone.name)
        gone.delete()
    McpServer.objects.filter(pk=server.pk).update(
        refresh_state=RefreshState.OK, refreshed_at=timezone.now(), last_error=""
    )
    return diff


def mcp_server_list(*, endpoint: McpEndpoint) -> list[ListedTool]:
    """Ask the server for its tools from sync code (no transaction open: it is a network call)."""
    return io_loop.run(
        list_tools(endpoint), timeout=max(endpoint.timeout_s, DISCOVERY_TIMEOUT_S) + 5
    )


def _tool_names(server: McpServer) -> list[str]:
    return sorted(Tool.objects.filter(mcp_server=server).values_list("name", flat=True))


def mcp_server_refresh_queue(*, server: McpServer, actor: str, user_id: int | None) -> None:
    """A person asked for a refresh: mark it queued, audit it, and hand it to a worker.

    Nothing here lists the tools: a stdio server's process and a URL's request run in a
    worker (tools/tasks.py), never in the web process that took the click.
    """
    now = timezone.now()
    with transaction.atomic():
        McpServer.objects.filter(pk=server.pk).update(
            refresh_state=RefreshState.QUEUED, refresh_queued_at=now
        )
        audit_record(
            action=AuditAction.MCP_REFRESH_QUEUED,
            actor=actor,
            user_id=user_id,
            object_type=McpServer._meta.label_lower,
            object_id=server.pk,
            object_repr=server.name,
            before={"refresh_state": server.refresh_state},
            after={"refresh_state": RefreshState.QUEUED},
        )
        transaction.on_commit(lambda: _refresh_send(server, actor))


class RefreshNotQueued(Exception):
    """The broker did not take the refresh's task (recorded on the row as the outcome)."""


def _refresh_send(server: McpServer, actor: str) -> None:
    try:
        task_send(REFRESH_TASK, (server.pk, actor))
    except Exception as exc:
        logger.warning("mcp server %s: refresh not queued", server.name, exc_info=True)
        error = f"not queued: {type(exc).__name__}"
        McpServer.objects.filter(pk=server.pk, refresh_state=RefreshState.QUEUED).update(
            refresh_state=RefreshState.FAILED, refreshed_at=timezone.now(), last_error=error
        )
        raise RefreshNotQueued(f"mcp {server.name}: refresh {error} (is the broker up?)") from exc


def mcp_server_refresh(*, server: McpServer, actor: str = SYSTEM) -> McpDiff:
    """List the server's tools now and store them, with the outcome on the row and the trail.

    Run by a worker (the admin's queued refresh) or a test; McpUnreachable or McpToolError
    (recorded on the row as its error's class, never the answer's text) if the server
    cannot be asked or refuses.
    """
    before = _tool_names(server)
    try:
        listed = mcp_server_list(endpoint=McpEndpoint.from_model(server))
    except (McpError, HeaderEnvRefused) as exc:
        summary = exc.summary if isinstance(exc, McpError) else str(exc)
        # The whole (scrubbed) text for whoever reads the worker's log; the row gets the class.
        logger.warning("mcp server %s: refresh failed: %s", server.name, exc)
        with transaction.atomic():
            McpServer.objects.filter(pk=server.pk).update(
                refresh_state=RefreshState.FAILED,
                refreshed_at=timezone.now(),
                last_error=summary[:2000],
            )
            _refresh_audit(server, actor, before, before, {"outcome": "failed", "error": summary})
        raise
    with transaction.atomic():
        diff = mcp_tools_store(server=server, listed=listed)
        outcome = {
            "outcome": "ok",
            "added": diff.added,
            "removed": diff.removed,
            "changed": diff.changed,
            "skipped": diff.skipped,
            "description_warnings": len(diff.warnings),
        }
        _refresh_audit(server, actor, before, _tool_names(server), outcome)
    return diff


def _refresh_audit(
    server: McpServer, actor: str, before: list[str], after: list[str], data: dict[str, Any]
) -> None:
    audit_record(
        action=AuditAction.MCP_REFRESHED,
        actor=actor,
        object_type=McpServer._meta.label_lower,
        object_id=server.pk,
        object_repr=server.name,
        before={"tools": before},
        after={"tools": after},
        data=data,
    )

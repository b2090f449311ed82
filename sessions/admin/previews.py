"""The confirmation pages of the session's risky controls: a fork's preview (the checkpoint,
what the fork copies, the side-effecting calls after it that a continued run may repeat)
and a hand run's (the tool, its risk, approval and cost). Each posts back to the session's
operate view with `confirm=yes`; nothing happens before that."""

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from accounts.admin_access import MESSAGE_CONTENT, holds
from record.models import Session

from ..previews import fork_preview, tool_run_preview


def _context(
    model_admin: admin.ModelAdmin, request: HttpRequest, session: Session
) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": Session._meta,
        "session": session,
        "content": holds(request, MESSAGE_CONTENT),
    }


def fork_preview_page(
    model_admin: admin.ModelAdmin, request: HttpRequest, session: Session, step: int
) -> TemplateResponse:
    """The fork's preview, with its confirmation (NotFound: no such checkpoint)."""
    preview = fork_preview(session=session, step=step)
    context = {
        **_context(model_admin, request, session),
        "title": f"Fork session {str(session.pk)[:8]} at step {step}?",
        "preview": preview,
        "step": step,
    }
    return TemplateResponse(request, "admin/agent_sessions/session/fork_preview.html", context)


def tool_run_preview_page(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    session: Session,
    tool_name: str,
    arguments: Any,
) -> TemplateResponse:
    """The hand run's preview, with its confirmation (NotFound: not one of the session's tools)."""
    preview = tool_run_preview(session=session, tool_name=tool_name, arguments=arguments)
    context = {
        **_context(model_admin, request, session),
        "title": f"Run {preview.tool.name} by hand on session {str(session.pk)[:8]}?",
        "preview": preview,
        "arguments_json": json.dumps(preview.arguments, ensure_ascii=False, indent=2),
        "arguments_raw": json.dumps(preview.arguments, ensure_ascii=False),
    }
    return TemplateResponse(request, "admin/agent_sessions/session/tool_run_preview.html", context)

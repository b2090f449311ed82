"""Prompt samples in the admin: read-only. The view permission lists them (when, which
model, how many tokens); what was sent and received takes `view_prompt_content` too. A
staff user who is not a superuser reaches only their own tenant's samples, as with
sessions and memory."""

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from accounts.admin_access import PROMPT_CONTENT, ContentMaskedAdmin, OwnerFilter, masked
from accounts.tenancy import TenantScopedAdmin
from audit.edits import AuditedAdmin

from .models import PromptSample


@admin.register(PromptSample)
class PromptSampleAdmin(ContentMaskedAdmin, AuditedAdmin, TenantScopedAdmin, admin.ModelAdmin):
    list_display = (
        "created_at", "owner", "session_id", "turn", "iteration", "endpoint", "model", "tokens",
    )  # fmt: skip
    list_filter = ("endpoint", ("owner", OwnerFilter))
    list_select_related = ("owner",)
    search_fields = ("=session_id", "=trace_id")
    date_hierarchy = "created_at"
    fields = (
        "created_at", "owner", "session_id", "turn", "iteration", "endpoint", "model", "trace_id",
        "input_tokens", "output_tokens", "request_pretty", "response_pretty",
    )  # fmt: skip
    readonly_fields = fields
    content_permission = PROMPT_CONTENT
    content_fields = {"request_pretty": "request_hidden", "response_pretty": "response_hidden"}
    # A deleted sample's entry says which it was, never what the prompt said.
    audit_withheld = frozenset({"request", "response"})
    request_hidden = masked("request", PROMPT_CONTENT)
    response_hidden = masked("response", PROMPT_CONTENT)

    @admin.display(description="tokens in/out")
    def tokens(self, obj: PromptSample) -> str:
        return f"{obj.input_tokens}/{obj.output_tokens}"

    @admin.display(description="request")
    def request_pretty(self, obj: PromptSample) -> str:
        return format_html(
            "<pre style='white-space:pre-wrap'>{}</pre>",
            json.dumps(obj.request, indent=2, ensure_ascii=False),
        )

    @admin.display(description="response")
    def response_pretty(self, obj: PromptSample) -> str:
        return format_html(
            "<pre style='white-space:pre-wrap'>{}</pre>",
            json.dumps(obj.response, indent=2, ensure_ascii=False),
        )

    # Only the explicit view permission (or superuser) opens it; staff status alone does not.
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return bool(
            user.is_active and user.is_staff and user.has_perm("observability.view_promptsample")
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

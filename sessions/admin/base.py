"""What every page of a session's rows shares: the id search and the read-only history."""

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .display import session_link


class SessionIdSearch(admin.ModelAdmin):
    """A full session id in the search box is an exact, indexed lookup."""

    session_lookup = "session_id"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        try:
            session_id = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(**{self.session_lookup: session_id}), False


class ReadOnlyAdmin(SessionIdSearch):
    """History rows: viewable, never added, changed or deleted by hand."""

    list_per_page = 100
    show_full_result_count = False
    search_help_text = (
        "Paste a full session id to see only that session's rows, or search the text."
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="session", ordering="session")
    def session_short(self, obj: Any) -> str:
        return session_link(obj.session_id)

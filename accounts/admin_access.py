"""What the operators' console lets a staff user see and do beyond Django's four model
permissions.

Every admin action declares the permission it needs (`@admin.action(permissions=["x"])`
with a `has_x_permission` method on its ModelAdmin); "view" never changes anything.
What people said (messages, tool calls, events, memory, sampled prompts) sits behind a
view permission of its own: without it a row is listed, its content is masked, and the
search leaves the content out (a search that finds rows would tell the content).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .tenancy import tenant_scope

MESSAGE_CONTENT = "agent_sessions.view_message_content"
MEMORY_CONTENT = "memory.view_memory_content"
PROMPT_CONTENT = "observability.view_prompt_content"
VIEW_USERS = "auth.view_user"


def holds(request: HttpRequest, perm: str) -> bool:
    """The request's user holds `perm` (a superuser holds every one; an inactive user none)."""
    return bool(request.user.has_perm(perm))


def hidden_text(perm: str) -> str:
    return f"(hidden: needs the {perm.split('.', 1)[-1]} permission)"


def masked(label: str, perm: str) -> Callable[[Any, Any], str]:
    """A read-only stand-in for a field whose content needs `perm` to be seen."""

    @admin.display(description=label)
    def stand_in(model_admin: Any, obj: Any) -> str:
        return hidden_text(perm)

    return stand_in


def _swap(fields: Sequence[Any], swaps: Mapping[str, str]) -> list[Any]:
    # fields and fieldsets may hold tuples (fields side by side on one line).
    return [
        tuple(swaps.get(f, f) for f in field)
        if isinstance(field, tuple)
        else swaps.get(field, field)
        for field in fields
    ]


class ContentMaskedAdmin:
    """A ModelAdmin mixin: each field named in `content_fields` is replaced by its stand-in
    (a `masked(...)` method of the admin) for a user without `content_permission`, in the
    list, the change page and the fieldsets; `content_search_fields` leave the search."""

    # The methods return Any: each overrides a ModelAdmin's (or an inline's) own, whose
    # stub types differ between the two.

    content_permission = ""
    content_fields: Mapping[str, str] = {}
    content_search_fields: Sequence[str] = ()

    def shows_content(self, request: HttpRequest) -> bool:
        return holds(request, self.content_permission)

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)  # type: ignore[misc]
        return shown if self.shows_content(request) else _swap(shown, self.content_fields)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        return fields if self.shows_content(request) else _swap(fields, self.content_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        if self.shows_content(request):
            return fields
        # A stand-in is a method, so it is read-only wherever the field it replaces shows.
        return list(
            dict.fromkeys([*_swap(fields, self.content_fields), *self.content_fields.values()])
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if self.shows_content(request):
            return fieldsets
        return [
            (name, {**options, "fields": _swap(options["fields"], self.content_fields)})
            for name, options in fieldsets
        ]

    def get_search_fields(self, request: HttpRequest) -> Any:
        fields = super().get_search_fields(request)  # type: ignore[misc]
        if self.shows_content(request):
            return fields
        return [f for f in fields if f not in self.content_search_fields]


def may_view(request: HttpRequest, model: str) -> bool:
    """What the admin itself asks before it opens a change page of `model`
    ("app_label.model"): its view or change permission."""
    app, name = model.split(".", 1)
    return holds(request, f"{app}.view_{name}") or holds(request, f"{app}.change_{name}")


class ViewableLinksAdmin:
    """A ModelAdmin (or inline) mixin: each field named in `link_fields` (field ->
    (the "app_label.model" it links to, its stand-in)) is replaced by its stand-in, a
    method showing the same as plain text, for a user who may not view that model's pages:
    a link there would lead to a 403."""

    link_fields: Mapping[str, tuple[str, str]] = {}

    def _link_swaps(self, request: HttpRequest) -> dict[str, str]:
        return {
            field: stand_in
            for field, (model, stand_in) in self.link_fields.items()
            if not may_view(request, model)
        }

    def get_list_display(self, request: HttpRequest) -> Any:
        return _swap(super().get_list_display(request), self._link_swaps(request))  # type: ignore[misc]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return _swap(super().get_fields(request, obj), self._link_swaps(request))  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        swaps = self._link_swaps(request)
        fields = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        return list(dict.fromkeys([*_swap(fields, swaps), *swaps.values()]))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        swaps = self._link_swaps(request)
        return [
            (name, {**options, "fields": _swap(options["fields"], swaps)})
            for name, options in super().get_fieldsets(request, obj)  # type: ignore[misc]
        ]


class OwnerFilter(admin.RelatedFieldListFilter):
    """The owner filter names owners only to who may view users (auth.view_user), and then
    only owners of rows they can see. For anyone else it lists nobody; a link that filters
    by owner id (`?owner__id__exact=N`) still works."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[Any]:
        if not holds(request, VIEW_USERS):
            return []
        # From the bare table, by the indexed owner column: the list's own queryset carries
        # its per-row aggregates, which the distinct owners do not need.
        rows = tenant_scope(model_admin.model._default_manager.all(), request.user, self.field_path)
        owners = rows.order_by().values(f"{self.field_path}__pk").distinct()
        return list(
            field.get_choices(
                include_blank=False,
                limit_choices_to={"pk__in": owners},
                ordering=self.field_admin_ordering(field, request, model_admin),
            )
        )

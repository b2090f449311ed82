"""Admin form pieces shared by the apps' admins."""

import json
from typing import Any

from django import forms
from django.db import models
from django.forms.fields import InvalidJSONInput
from django.utils.html import format_html


class PrettyJSONField(forms.JSONField):
    """JSON shown indented, so schemas and rules are readable and editable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault(
            "widget",
            forms.Textarea(attrs={"rows": 14, "cols": 90, "style": "font-family: monospace"}),
        )
        super().__init__(*args, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        return json.dumps(value, ensure_ascii=False, indent=2, cls=self.encoder)


JSON_FIELD = {models.JSONField: {"form_class": PrettyJSONField}}


BREAKER_COLOURS = {"closed": "#15803d", "half_open": "#b45309", "open": "#dc2626"}


def breaker_badge(state: str, failures: int, until: str = "") -> str:
    """A circuit breaker's state as a coloured word, the details in its tooltip."""
    title = f"{failures} recent failure(s)" + (f"; open until {until}" if until else "")
    label = state.replace("_", "-") + (f" ({failures})" if failures and state == "closed" else "")
    # The state never breaks ("half-" alone on a line reads wrong); the time after it
    # may wrap, so a list column holding it stays narrow enough for the page.
    return format_html(
        '<span class="ap-breaker" title="{}" style="color:{};font-weight:600">'
        '<span style="white-space:nowrap">{}</span>{}</span>',
        title,
        BREAKER_COLOURS.get(state, "#6b7280"),
        label,
        f" until {until}" if until else "",
    )


class CountOrDefault(forms.IntegerField):
    """A count whose empty input keeps the column's default (0 = no limit), so forms
    posted without the newer limit fields still save."""

    def __init__(self, *, default: int, **kwargs: Any) -> None:
        kwargs.pop("required", None)
        kwargs.setdefault("min_value", 0)
        super().__init__(required=False, **kwargs)
        self.default = default

    def clean(self, value: Any) -> int:
        cleaned = super().clean(value)
        return self.default if cleaned is None else int(cleaned)


def optional_count_field(db_field: models.Field, **kwargs: Any) -> forms.Field | None:
    """The form field of a rate limit or a degraded output limit: empty keeps the default."""
    if db_field.name.startswith("rate_limit_") or db_field.name == "degraded_max_tokens":
        return CountOrDefault(
            default=int(db_field.default),
            label=db_field.verbose_name.capitalize(),
            help_text=db_field.help_text,
        )
    return None

"""Admin form pieces shared by the apps' admins."""

import json
from typing import Any

from django import forms
from django.db import models
from django.forms.fields import InvalidJSONInput


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

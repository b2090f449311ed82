"""Renderers beyond JSON for the few operations that answer in another format."""

import json
from typing import Any

from rest_framework.renderers import BaseRenderer


class SvgRenderer(BaseRenderer):
    """An SVG drawing as is; an error (any data that is not the drawing) in the one JSON error
    shape, with its own content type, whatever the client asked for."""

    media_type = "image/svg+xml"
    format = "svg"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: dict[str, Any] | None = None,
    ) -> bytes:
        if isinstance(data, str):
            return data.encode()
        response = (renderer_context or {}).get("response")
        if response is not None:
            response["Content-Type"] = "application/json"
        return json.dumps(data, ensure_ascii=False).encode()

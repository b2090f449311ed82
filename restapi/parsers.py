"""The API's only body parser: JSON, decoded within the bounds of record/json_limits.py."""

from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from record.json_limits import JsonRejected, json_loads


class BoundedJSONParser(JSONParser):
    """DRF's JSONParser recurses without bound (a RecursionError, a 500) and lets
    `1e400` through as infinity; this one refuses both. Text that is not JSON is
    a ParseError (malformed_json); JSON out of bounds is a JsonRejected, which
    the exception handler answers with 400 invalid_input and its path."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> Any:
        encoding = get_encoding(parser_context or {})
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            return json_loads(text)
        except JsonRejected:
            raise
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None

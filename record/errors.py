"""Domain errors the edges turn into the public error shape (DESIGN.md)."""

from typing import Any


class DomainError(Exception):
    code = "error"
    status = 400

    def __init__(
        self, message: str, *, details: dict[str, Any] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if code:
            self.code = code


class InvalidInput(DomainError):
    code = "invalid_input"
    status = 400


class NotFound(DomainError):
    code = "not_found"
    status = 404


class Conflict(DomainError):
    code = "conflict"
    status = 409


class PayloadTooLarge(DomainError):
    code = "payload_too_large"
    status = 413


class Forbidden(DomainError):
    code = "forbidden"
    status = 403

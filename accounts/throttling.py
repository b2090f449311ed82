"""DRF throttles backed by the shared limits in Redis (accounts/limits.py)."""

from typing import TYPE_CHECKING

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

if TYPE_CHECKING:
    # A default throttle class is imported while rest_framework.views loads.
    from rest_framework.views import APIView

from . import limits
from .models import ApiKey


class ApiKeyRateThrottle(BaseThrottle):
    """Requests one API key may make per window, on every REST endpoint."""

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Request, view: "APIView") -> bool:
        if not isinstance(request.auth, ApiKey):
            return True
        self._wait = limits.api_request_retry_after(key_id=request.auth.pk)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


class SessionCreateThrottle(BaseThrottle):
    """Sessions one API key may create per window; only the creating method counts."""

    methods = frozenset({"POST"})

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Request, view: "APIView") -> bool:
        if request.method not in self.methods or not isinstance(request.auth, ApiKey):
            return True
        self._wait = limits.session_create_retry_after(key_id=request.auth.pk)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait

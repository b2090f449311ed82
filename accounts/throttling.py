"""DRF throttles backed by the shared limits in Redis (accounts/limits.py)."""

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from . import limits
from .models import ApiKey


class SessionCreateThrottle(BaseThrottle):
    """Sessions one API key may create per window; only the creating method counts."""

    methods = frozenset({"POST"})

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        if request.method not in self.methods or not isinstance(request.auth, ApiKey):
            return True
        self._wait = limits.session_create_retry_after(key_id=request.auth.pk)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait

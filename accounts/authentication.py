from rest_framework import authentication, exceptions

from . import limits
from .services import api_key_authenticate


class SlowedDown(exceptions.Throttled):
    """A 429 whose message says when to retry once (DRF appends its own "Expected
    available in N seconds." to the detail, which then said it twice)."""

    extra_detail_singular = extra_detail_plural = "retry in {wait} s"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <api key>`; request.auth is the ApiKey row."""

    keyword = "Bearer"

    def authenticate(self, request):  # type: ignore[no-untyped-def]
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword.lower():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        address = limits.client_address(
            peer=request.META.get("REMOTE_ADDR"),
            forwarded_for=request.META.get("HTTP_X_FORWARDED_FOR"),
        )
        result = api_key_authenticate(raw=parts[1], address=address)
        if result.retry_after_s is not None:
            raise SlowedDown(wait=result.retry_after_s, detail=f"{result.slow_down_message};")
        if result.api_key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return (result.api_key.owner, result.api_key)

    def authenticate_header(self, request) -> str:  # type: ignore[no-untyped-def]
        return self.keyword

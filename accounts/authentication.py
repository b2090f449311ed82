from rest_framework import authentication, exceptions

from .models import ApiKey
from .services import api_key_lookup


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
        key: ApiKey | None = api_key_lookup(raw=parts[1])
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return (key.owner, key)

    def authenticate_header(self, request) -> str:  # type: ignore[no-untyped-def]
        return self.keyword

from dataclasses import dataclass

from django.contrib.auth import get_user_model

from .models import ApiKey, Role, generate_api_key, hash_api_key


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    raw: str


def api_key_create(*, username: str, roles: list[str], name: str = "") -> IssuedKey:
    """Create (or reuse) the user and issue a new key; the raw key is returned once."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    for role in roles:
        if role.strip():
            Role.objects.get_or_create(name=role.strip())
    raw = generate_api_key()
    key = ApiKey.objects.create(
        owner=user,
        name=name,
        prefix=raw[:10],
        key_hash=hash_api_key(raw),
        # Keep the caller's order (deduplicated): the first role is a new session's default.
        roles=list(dict.fromkeys(r.strip() for r in roles if r.strip())),
    )
    return IssuedKey(api_key=key, raw=raw)


def api_key_lookup(*, raw: str) -> ApiKey | None:
    if not raw:
        return None
    return (
        ApiKey.objects.select_related("owner")
        .filter(key_hash=hash_api_key(raw), is_active=True, owner__is_active=True)
        .first()
    )


def unknown_roles(roles: list[str]) -> list[str]:
    known = set(Role.objects.values_list("name", flat=True))
    return [r for r in roles if r not in known]

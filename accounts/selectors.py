"""Named reads of API keys."""

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from .models import PREFIX_CHARS, ApiKey


def api_keys_with_prefix(*, prefix: str) -> QuerySet[ApiKey]:
    """Keys whose stored prefix starts with `prefix` (a whole key given counts as its prefix)."""
    return (
        ApiKey.objects.select_related("owner")
        .filter(prefix__startswith=prefix[:PREFIX_CHARS])
        .order_by("pk")
    )


def user_exists(*, username: str) -> bool:
    return get_user_model().objects.filter(username=username).exists()


def api_key_is_active(*, key_id: int) -> bool:
    """Active, and its owner too (what authentication requires)."""
    return ApiKey.objects.filter(pk=key_id, is_active=True, owner__is_active=True).exists()


def api_key_roles(*, key_id: int) -> list[str]:
    """The key's roles as the database holds them now (none for a key that is gone)."""
    roles = ApiKey.objects.filter(pk=key_id).values_list("roles", flat=True).first()
    return list(roles or [])


def approver_groups(*, user_id: int) -> list[str] | None:
    """The approver groups of an active approver; None for a user who is not one."""
    from .models import Approver

    row = (
        Approver.objects.filter(user_id=user_id, is_active=True, user__is_active=True)
        .values_list("groups", flat=True)
        .first()
    )
    if row is None:
        return None
    return list(row) or ["approvers"]


def queue_viewer_groups(*, user_id: int) -> tuple[bool, list[str] | None]:
    """Whether this signed-in user may see the approvals queue in the admin, and its groups
    (None: every group). An active staff superuser sees every group; an active staff
    approver their groups; anyone else nothing."""
    from django.contrib.auth import get_user_model

    row = (
        get_user_model()
        .objects.filter(pk=user_id, is_active=True, is_staff=True)
        .values_list("is_superuser", flat=True)
        .first()
    )
    if row is None:
        return False, []
    if row:
        return True, None
    groups = approver_groups(user_id=user_id)
    return (groups is not None), groups or []


def api_key_approver_groups(*, key_id: int) -> list[str] | None:
    """`approver_groups` of this key's owner while the key is active too: one query for
    what an approvers' socket must still hold before each frame it sends."""
    from .models import Approver

    row = (
        Approver.objects.filter(
            is_active=True,
            user__is_active=True,
            user__api_keys__pk=key_id,
            user__api_keys__is_active=True,
        )
        .values_list("groups", flat=True)
        .first()
    )
    if row is None:
        return None
    return list(row) or ["approvers"]

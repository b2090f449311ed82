import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models

KEY_PREFIX = "ap_"
# How many leading characters of a key are stored to recognise it.
PREFIX_CHARS = 10


def hash_api_key(raw: str) -> str:
    # Keys carry 256 bits of randomness, so a fast unsalted hash is enough
    # and lets authentication look the key up by index.
    return hashlib.sha256(raw.encode()).hexdigest()


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class Role(models.Model):
    """A role a caller's key may hold; tools name the roles that may use them."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """A caller's credential. Only the hash is stored; the key is shown once."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a key.")
    key_hash = models.CharField(max_length=64, unique=True)
    roles = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    # A session's value orders the broker's queues and the claims on waiting credits: a
    # client sets it above its agent's value only as far as an operator grants here.
    max_value = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="The highest session value this key may ask for. Empty: no more than the "
        "agent's own value (the default a session gets).",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        # Beyond Django's four: revoking is not an edit (it closes the key's sockets at once).
        permissions = [("revoke_apikey", "Can revoke API keys (closes their websockets)")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.owner})"


class Approver(models.Model):
    """A user whose keys may decide approvals, for the groups named here."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="approver"
    )
    groups = ArrayField(
        models.CharField(max_length=50),
        default=list,
        blank=True,
        help_text="Approver groups (a tool's approval_escalate_to names one); empty means 'approvers'.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"approver {self.user} ({', '.join(self.groups) or 'approvers'})"

"""Which environment variables a tool's headers may read.

A header written `{env: NAME}` is filled from the worker's environment at call
time. The worker's environment also holds the database URL, the Django secret
key and every model key, so only names with a configured prefix
(TOOL_SECRET_ENV_PREFIXES) or on the allow-list (TOOL_SECRET_ENV_ALLOW) may be
read. apply_config, the admin form and the executor all ask this module.
"""

from typing import Any

from django.conf import settings


def header_env_allowed(name: str) -> bool:
    prefixes = [p for p in settings.TOOL_SECRET_ENV_PREFIXES if p]
    return name in settings.TOOL_SECRET_ENV_ALLOW or any(name.startswith(p) for p in prefixes)


def header_env_rule() -> str:
    """The rule in words, for error messages."""
    prefixes = [p for p in settings.TOOL_SECRET_ENV_PREFIXES if p]
    allowed = list(settings.TOOL_SECRET_ENV_ALLOW)
    parts = []
    if prefixes:
        parts.append("names starting with " + " or ".join(prefixes))
    if allowed:
        parts.append("the names listed in TOOL_SECRET_ENV_ALLOW (" + ", ".join(allowed) + ")")
    rule = " or ".join(parts) if parts else "none (TOOL_SECRET_ENV_PREFIXES and ALLOW are empty)"
    return f"tool headers may read only {rule}"


def refused_header_envs(headers: Any) -> list[tuple[str, str]]:
    """(header, variable) for each `{env: NAME}` header whose variable tools may not read."""
    if not isinstance(headers, dict):
        return []
    refused = []
    for header, value in headers.items():
        if isinstance(value, dict):
            name = str(value.get("env", ""))
            if not header_env_allowed(name):
                refused.append((str(header), name))
    return refused


class HeaderEnvRefused(ValueError):
    """A header reads an environment variable tools may not read."""


def header_values(headers: Any) -> dict[str, str]:
    """The headers to send: `{env: NAME}` read from the environment now, under the rule above."""
    import os

    if not isinstance(headers, dict):
        return {}
    refused = refused_header_envs(headers)
    if refused:
        names = ", ".join(f"{header} reads {name}" for header, name in refused)
        raise HeaderEnvRefused(f"header {names}, but {header_env_rule()}")
    return {
        str(name): (
            os.environ.get(str(value.get("env", "")), "") if isinstance(value, dict) else str(value)
        )
        for name, value in headers.items()
    }

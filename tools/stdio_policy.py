"""What a stdio MCP server may start, and the environment it starts with.

A stdio server's command runs on the worker's host as the worker's user, so which
programs may run is the deployer's decision: its first word must be on
MCP_STDIO_COMMANDS (compared as written; an empty list starts none). The config file
(apply_config), the admin form (superusers only) and the process start itself ask
`command_problem`, so a row written any other way still starts nothing else.

The child's environment is built here, not inherited: the variables its entry declares
(`env`, a value or `{env: NAME}` read from the worker's environment under the rule of
tool headers, tools/env_access.py) over a fixed base holding no secret. Without it the
child would see the worker's SECRET_KEY, DATABASE_URL and model keys.
"""

import os
import re
from typing import Any

from django.conf import settings

from .env_access import header_env_allowed, header_env_rule

# The base every child gets (the SDK's own minimum, which it merges in anyway): PATH so a
# launcher (npx, uvx, a shell wrapper) finds its interpreter, HOME for a server's caches and
# config, the user's names and the terminal type some runtimes read at start. None holds a secret.
BASE_ENV = ("PATH", "HOME", "LOGNAME", "USER", "SHELL", "TERM")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def allowed_commands() -> list[str]:
    return [c for c in settings.MCP_STDIO_COMMANDS if c]


def command_rule() -> str:
    """The allow-list in words, for error messages."""
    allowed = allowed_commands()
    if not allowed:
        return "MCP_STDIO_COMMANDS is empty: no stdio server may start on this deployment"
    return (
        "a stdio server may start only an executable on MCP_STDIO_COMMANDS ("
        + ", ".join(allowed)
        + ")"
    )


def command_problem(command: Any) -> str | None:
    """Why this command may not start (None: it may)."""
    if not isinstance(command, list | tuple) or not command:
        return "give the executable and its arguments as a list"
    if not all(isinstance(part, str) and part and "\x00" not in part for part in command):
        return "each word must be a non-empty string"
    if command[0] not in allowed_commands():
        return f"{command[0]} is not allowed: {command_rule()}"
    return None


def env_problems(env: Any) -> list[str]:
    """What is wrong with a stdio server's declared environment, one line per variable."""
    if env in (None, {}):
        return []
    if not isinstance(env, dict):
        return ['give a JSON object of variable names to values or to {"env": "NAME"}']
    problems = []
    for name, value in env.items():
        if not ENV_NAME.match(str(name)):
            problems.append(f"{name}: not a variable name")
        elif isinstance(value, dict):
            source = value.get("env")
            if set(value) != {"env"} or not isinstance(source, str) or not source:
                problems.append(f'{name}: give a string or {{"env": "NAME"}}')
            elif not header_env_allowed(source):
                problems.append(f"{name} reads {source}, but {header_env_rule()}")
        elif not isinstance(value, str) or "\x00" in value:
            problems.append(f'{name}: give a string or {{"env": "NAME"}}')
    return problems


def child_env(env: Any) -> dict[str, str]:
    """The whole environment of the child: the base, then what its entry declares
    (checked by `env_problems` first)."""
    found = {name: os.environ[name] for name in BASE_ENV if name in os.environ}
    for name, value in (env or {}).items():
        if isinstance(value, dict):
            found[str(name)] = os.environ.get(str(value.get("env", "")), "")
        else:
            found[str(name)] = str(value)
    return found

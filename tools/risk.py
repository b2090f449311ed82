"""How risky one tool call is: the tool's declared level, or an assessment (runtime-mechanisms 3.3).

Levels: 0 read-only, 1 side-effecting, 2 side-effecting through a write
method (POST/PUT/PATCH/DELETE) or with money-like arguments, 3 always asks a
person. A tool that failed often lately goes up one level. Pure functions:
the caller supplies the recent failure counts.
"""

import re
from dataclasses import dataclass
from typing import Any

from .execution import ToolSnapshot

HIGHEST = 3
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# An argument whose name says money makes a side effect one that can cost someone.
MONEY_NAME = re.compile(
    r"(amount|price|cost|refund|payment|pay|total|balance|fee|charge|credit|money|currency|"
    r"iban|card|salary|invoice|discount|coupon_value)",
    re.IGNORECASE,
)
# "12.50 EUR", "$3", "€ 10": a value that reads as money.
MONEY_VALUE = re.compile(
    r"^\s*([$€£¥]\s*\d|\d[\d.,]*\s*(usd|eur|gbp|cny|rmb|jpy|[$€£¥])\s*$)", re.I
)
# At least this many recent calls, this share of them failed: the tool is unreliable now.
FAILURE_MIN_CALLS = 4
FAILURE_RATE_HIGH = 0.5


@dataclass(frozen=True)
class Risk:
    level: int
    why: str


@dataclass(frozen=True)
class FailureCount:
    failed: int
    total: int

    @property
    def high(self) -> bool:
        return self.total >= FAILURE_MIN_CALLS and self.failed / self.total >= FAILURE_RATE_HIGH


def money_arguments(arguments: Any) -> list[str]:
    """Names (dotted paths) of the arguments that look like money."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                name = f"{path}.{key}" if path else str(key)
                if MONEY_NAME.search(str(key)) and inner not in (None, "", [], {}):
                    found.append(name)
                else:
                    walk(inner, name)
        elif isinstance(value, list):
            for i, inner in enumerate(value[:50]):
                walk(inner, f"{path}[{i}]")
        elif isinstance(value, str) and MONEY_VALUE.search(value):
            found.append(path or "(value)")

    walk(arguments, "")
    return found


def assess_risk(tool: ToolSnapshot, arguments: Any, failures: FailureCount | None = None) -> Risk:
    """The call's risk level and a sentence saying why."""
    if tool.risk_level is not None:
        return Risk(tool.risk_level, f"declared by {tool.name}")
    if not tool.side_effects:
        level, why = 0, "read-only"
    else:
        money = money_arguments(arguments)
        write = tool.kind == "http" and tool.method.upper() in WRITE_METHODS
        if write and money:
            level, why = 2, f"side effect via {tool.method.upper()}, money-like {', '.join(money)}"
        elif write:
            level, why = 2, f"side effect via {tool.method.upper()}"
        elif money:
            level, why = 2, f"side effect with money-like {', '.join(money)}"
        else:
            level, why = 1, "side effect"
    if failures is not None and failures.high and level < HIGHEST:
        level += 1
        why += f"; +1: {failures.failed} of its last {failures.total} calls failed"
    return Risk(level, why)

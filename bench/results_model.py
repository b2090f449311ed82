"""The shape of a benchmark's result: figures (some with a target) plus details."""

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    key: str
    label: str
    value: float | None
    unit: str = ""
    target: str = ""  # e.g. "<= 3"; empty when the figure is informational
    ok: bool | None = None  # None: no target

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if isinstance(self.value, float) and math.isnan(self.value):
            data["value"] = None
        return data


def figure(
    key: str,
    label: str,
    value: float | None,
    unit: str = "",
    *,
    le: float | None = None,
    ge: float | None = None,
) -> Figure:
    """A figure, checked against `<= le` or `>= ge` when given (a missing value fails)."""
    target = ""
    ok: bool | None = None
    if le is not None:
        target = f"<= {le:g}"
        ok = value is not None and not math.isnan(value) and value <= le
    elif ge is not None:
        target = f">= {ge:g}"
        ok = value is not None and not math.isnan(value) and value >= ge
    return Figure(key=key, label=label, value=value, unit=unit, target=target, ok=ok)


@dataclass
class Result:
    name: str
    title: str
    params: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "params": self.params,
            "figures": [f.as_dict() for f in self.figures],
            "details": self.details,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }

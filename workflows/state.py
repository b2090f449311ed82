"""A workflow run's state: what `Session.workflow_state` keeps between node steps.

Stored as JSON (the row's column and each node step's checkpoint), read into `RunState` by
the node phase (engine/phases/node.py) and written back by its move. The stored shape is
the one runs have always had, so a run started before this type existed loads unchanged:

    {"values": {name: output, "input": ...}, "active": [node, ...],
     "visits": {node: n}, "progress": {node: {...}}, "status": {node: status},
     "error"?: {"node": id, "message": text}, "last_output"?: any, "result"?: any,
     "deadline_at"?: unix seconds}

A key the run never set is left out (a result of null and no result differ); keys this
type does not know are kept as they were.
"""

from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

# A key the run has not set (the result of a run still going, its last output before its
# first node finished): left out of the stored state, not stored as null.
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


class RunError(TypedDict):
    node: str
    message: str


@dataclass
class RunState:
    """Where a workflow run stands. `progress` is each active node's own, shaped by its kind
    (its call, a map's items, a parallel node's branches, a retry's pause)."""

    values: dict[str, Any] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    visits: dict[str, int] = field(default_factory=dict)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    error: RunError | None = None
    last_output: Any = UNSET
    result: Any = UNSET
    deadline_at: float | None = None
    # Keys of a newer or older shape, kept as they were.
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, start: str, input: Any, *, deadline_at: float | None = None) -> "RunState":
        """A run's first state: its input, its start node active."""
        return cls(
            values={"input": input},
            active=[start],
            visits={start: 1},
            status={start: "active"},
            deadline_at=deadline_at,
        )

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None, start: str) -> "RunState":
        """The stored state read into a copy the step may change (`start`: the definition's
        start node, active when nothing says otherwise)."""
        data = _copy(raw or {})
        error = data.pop("error", None)
        deadline = data.pop("deadline_at", None)
        return cls(
            values=data.pop("values", {}),
            active=data.pop("active", [start]),
            visits=data.pop("visits", {start: 1}),
            progress=data.pop("progress", {}),
            status=data.pop("status", {}),
            error=cast(RunError, error) if isinstance(error, dict) else None,
            last_output=data.pop("last_output", UNSET),
            result=data.pop("result", UNSET),
            deadline_at=float(deadline) if deadline is not None else None,
            other=data,
        )

    def to_json(self) -> dict[str, Any]:
        """The stored shape (see the module docstring)."""
        data: dict[str, Any] = {
            **self.other,
            "values": self.values,
            "active": self.active,
            "visits": self.visits,
            "progress": self.progress,
            "status": self.status,
        }
        if self.error is not None:
            data["error"] = self.error
        if self.last_output is not UNSET:
            data["last_output"] = self.last_output
        if self.result is not UNSET:
            data["result"] = self.result
        if self.deadline_at is not None:
            data["deadline_at"] = self.deadline_at
        return data


def _copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value

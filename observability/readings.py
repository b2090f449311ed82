"""What an app hands the scrape-time collector: gauges read from its own tables.

Apps that own the rows (sessions, approvals, billing) define a function returning
a list of `Gauge`s and name it in `settings.METRICS_SOURCES`; this app loads them
by name, so it imports none of them.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    # (label values, value) pairs; label values in the order of `labels`.
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

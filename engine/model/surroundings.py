"""The world around a step (runtime-mechanisms 2.3): whether it is one of the agent's peak
hours, the host's CPU load and available memory, and each offered tool's recent health
(success rate and p50 latency from the platform's own ToolCall records, its breaker, its
declared `sla_rate` and what is left of its declared `quota`).

Cheap on purpose, since every model step and every held tool step reads it: the host's
figures are read at most once a second (runtime/health.py), the tools' in one aggregate
query at most every `ENV_TOOL_STATS_TTL_S` per process, the peak hour is arithmetic.

`Situation` is what of it can move enough to re-plan: the peak hour, the host's pressure,
the tools under their SLA or out of quota. A model step records it in the checkpoint's
`seen`, and a change after a pause is a drift (engine/model/environment.py).
"""

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection
from django.utils import timezone

from memory.layers import HostFacts, ToolFacts
from record.models import Agent, ToolCall
from runtime.health import host_load, host_pressure
from runtime.peak_hours import is_peak, time_zone
from tools.execution import ToolSnapshot, tool_breaker

# A tool's recent health: its latest finished calls within the window (as the risk
# assessment reads them, engine/gates/risk.py).
RECENT_CALLS = 50
RECENT_WINDOW = "1 hour"


def env_clock() -> datetime:
    """The environment layer's now: the host's, shifted by ENV_CLOCK_SHIFT_S (rehearsals)."""
    return timezone.now() + timedelta(seconds=settings.ENV_CLOCK_SHIFT_S)


def agent_time_zone(agent: Agent) -> tuple[str, ZoneInfo]:
    """The agent's `timezone` if it names a zone, else BILLING_TIME_ZONE."""
    for name in (agent.timezone, str(getattr(settings, "BILLING_TIME_ZONE", "UTC"))):
        zone = time_zone(name) if name else None
        if zone is not None:
            return name, zone
    return "UTC", ZoneInfo("UTC")


def peak_hour(agent: Agent, now: datetime | None = None) -> bool | None:
    """Is it one of the agent's peak hours, in its time zone? None: it declares none."""
    if not agent.peak_hours:
        return None
    return is_peak(agent.peak_hours, (now or env_clock()).astimezone(agent_time_zone(agent)[1]))


@dataclass(frozen=True)
class ToolHealth:
    finished: int  # of its latest calls (RECENT_CALLS within RECENT_WINDOW)
    succeeded: int
    p50_ms: int | None
    used: int | None  # calls sent in its quota's current period; None: no quota

    @property
    def rate(self) -> float | None:
        return self.succeeded / self.finished if self.finished else None


# Per process: (tool name, quota period) -> (read at, health).
_health: dict[tuple[str, str], tuple[float, ToolHealth]] = {}


def cache_reset() -> None:
    _health.clear()


def tools_health(tools: dict[str, ToolSnapshot]) -> dict[str, ToolHealth]:
    """Each tool's recent health, the stale ones read in one query."""
    now = time.monotonic()
    ttl = settings.ENV_TOOL_STATS_TTL_S
    wanted = {name: (name, t.quota_per if t.quota_calls else "") for name, t in tools.items()}
    stale = [key for key in wanted.values() if now - _health.get(key, (-1e9, None))[0] >= ttl]
    if stale:
        for key, health in _health_read(stale).items():
            _health[key] = (now, health)
    return {name: _health[key][1] for name, key in wanted.items() if key in _health}


def _health_read(keys: list[tuple[str, str]]) -> dict[tuple[str, str], ToolHealth]:
    table = ToolCall._meta.db_table
    zone = str(getattr(settings, "BILLING_TIME_ZONE", "UTC"))
    with connection.cursor() as cursor:
        cursor.execute(
            # SQL names from model metadata (constants); every value is a bound parameter.
            # A call refused (by an approver, for credits, for a drift) or answered from the
            # cache never reached the service: neither counts.
            f"""SELECT n.name, n.per, count(r.status),
                       count(r.status) FILTER (WHERE r.status = 'success'),
                       percentile_disc(0.5) WITHIN GROUP (ORDER BY r.elapsed_ms),
                       CASE WHEN n.per <> '' THEN (
                           SELECT count(*) FROM "{table}" q
                            WHERE q.tool_name = n.name AND q.status <> 'rejected'
                              AND NOT q.cached
                              AND q.created_at >= date_trunc(n.per, now() AT TIME ZONE %s)
                                                  AT TIME ZONE %s) END
                  FROM unnest(%s::text[], %s::text[]) AS n(name, per)
                  LEFT JOIN LATERAL (
                       SELECT status, elapsed_ms FROM "{table}" c
                        WHERE c.tool_name = n.name AND c.status NOT IN ('executing', 'rejected')
                          AND NOT c.cached
                          AND c.created_at > now() - interval '{RECENT_WINDOW}'
                        ORDER BY c.id DESC LIMIT %s) r ON true
                 GROUP BY n.name, n.per""",  # nosec B608
            [zone, zone, [k[0] for k in keys], [k[1] for k in keys], RECENT_CALLS],
        )
        return {
            (name, per): ToolHealth(finished, succeeded, p50, used)
            for name, per, finished, succeeded, p50, used in cursor.fetchall()
        }


def below_sla(tool: ToolSnapshot, health: ToolHealth | None) -> bool:
    """Is the tool's recent success rate under its declared sla_rate (over enough calls)?"""
    return (
        tool.sla_rate is not None
        and health is not None
        and health.finished >= settings.ENV_SLA_MIN_CALLS
        and health.succeeded < tool.sla_rate * health.finished
    )


def tool_facts(
    tools: dict[str, ToolSnapshot], health: dict[str, ToolHealth], open_: set[str]
) -> dict[str, ToolFacts]:
    """Per offered tool, what there is to say (nothing said: no key)."""
    facts: dict[str, ToolFacts] = {}
    for name, tool in sorted(tools.items()):
        seen = health.get(name)
        fact: ToolFacts = {}
        if seen is not None and seen.rate is not None:
            fact["success_rate"] = round(seen.rate, 3)
            fact["calls"] = seen.finished
        if seen is not None and seen.p50_ms is not None:
            fact["p50_ms"] = seen.p50_ms
        if tool.sla_rate is not None:
            fact["sla_rate"] = tool.sla_rate
        if tool.quota_calls:
            fact["quota"] = f"{tool.quota_calls}/{tool.quota_per}"
            used = seen.used if seen is not None and seen.used is not None else 0
            fact["quota_left"] = max(tool.quota_calls - used, 0)
        fact["breaker"] = "open" if name in open_ else "closed"
        facts[name] = fact
    return facts


@dataclass(frozen=True)
class Surroundings:
    is_peak_hour: bool | None  # None: the agent declares no peak hours
    host: HostFacts
    pressure: list[str]  # "cpu", "memory": past ENV_HOST_CPU_HIGH / ENV_HOST_MEM_LOW_MB
    tools: dict[str, ToolFacts]
    below_sla: list[str]
    quota_out: list[str]


def surroundings(
    agent: Agent, tools: dict[str, ToolSnapshot], now: datetime | None = None
) -> Surroundings:
    load = host_load()
    health = tools_health(tools)
    open_ = set(tool_breaker().known_open(sorted(tools)))
    facts = tool_facts(tools, health, open_)
    return Surroundings(
        is_peak_hour=peak_hour(agent, now),
        host={"cpu_load": load.cpu_load, "mem_available_mb": load.mem_available_mb},
        pressure=host_pressure(load),
        tools=facts,
        below_sla=sorted(n for n, t in tools.items() if below_sla(t, health.get(n))),
        quota_out=sorted(n for n, f in facts.items() if f.get("quota_left") == 0),
    )

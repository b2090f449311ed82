"""Printing, saving (bench/results/*.json) and the latest full run's figures (bench/FIGURES.md)."""

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from .environment import ROOT
from .results_model import Figure, Result

RESULTS = ROOT / "bench" / "results"
# The latest full run's figures live in a file of their own: the README keeps the prose and
# the targets' summary within a page, whatever number of figures a run measures.
FIGURES = ROOT / "bench" / "FIGURES.md"
START = "<!-- bench:figures:start (written by `make bench`; edits here are overwritten) -->"
END = "<!-- bench:figures:end -->"


# ---------------------------------------------------------------------- machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    connection.close()
    valkey = ""
    try:
        import redis
        from django.conf import settings

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3)
        info = client.info("server")
        valkey = str(info.get("valkey_version") or info.get("redis_version") or "")
        client.close()
    except Exception:  # noqa: BLE001
        pass
    import django

    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": _ram_gib(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgresql": pg,
        "pgvector": row[0] if row else "",
        "valkey": valkey,
        "os": f"{platform.system()} {platform.release()}",
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "git": _git("rev-parse", "--short", "HEAD")
        + ("+dirty" if _git("status", "--porcelain") else ""),
    }


# ---------------------------------------------------------------------- text
def fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, int) or (
        isinstance(value, float) and value.is_integer() and abs(value) >= 100
    ):
        text = f"{int(value)}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def verdict(fig: Figure) -> str:
    if fig.ok is None:
        return ""
    return "PASS" if fig.ok else "FAIL"


def rows(results: list[Result]) -> list[tuple[str, str, str, str, str]]:
    out = []
    for result in results:
        if result.error:
            out.append((result.name, "error", _first_line(result.error)[:100], "", "ERROR"))
            continue
        for fig in result.figures:
            target = f"{fig.target} {fig.unit}".strip() if fig.target else ""
            out.append((result.name, fig.label, fmt(fig.value, fig.unit), target, verdict(fig)))
    return out


def table(results: list[Result]) -> str:
    header = ("benchmark", "figure", "value", "target", "result")
    body = rows(results)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), line]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def result_lines(result: Result) -> str:
    if result.error:
        return f"  {result.name}: ERROR {result.error}"
    parts = [f"  {result.name} ({result.seconds:.1f} s)"]
    for fig in result.figures:
        mark = f"  [{verdict(fig)} {fig.target}]" if fig.target else ""
        parts.append(f"    {fig.label}: {fmt(fig.value, fig.unit)}{mark}")
    return "\n".join(parts)


# ---------------------------------------------------------------------- files
def document(
    results: list[Result],
    *,
    args: dict[str, Any],
    stamp: str,
    seconds: float,
    setup: dict[str, Any],
) -> dict[str, Any]:
    return {
        "timestamp": stamp,
        "argv": sys.argv[1:],
        "options": args,
        "machine": machine(),
        "setup": setup,
        "seconds": round(seconds, 1),
        "results": [r.as_dict() for r in results],
    }


def save(doc: dict[str, Any], stamp: str) -> list[Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, default=str) + "\n"
    paths = [RESULTS / f"{stamp}.json", RESULTS / "latest.json"]
    for path in paths:
        path.write_text(text)
    return paths


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        START,
        "",
        f"Run `{doc['timestamp']}` (commit {m['git'] or 'unknown'}), {doc['seconds']:.0f} s in all, "
        f"`{' '.join(['python -m bench', *doc['argv']])}`.",
        "",
        f"Machine: {m['nproc']} CPUs (`nproc`), {m['cpu']}, {m['ram_gib']} GiB RAM, {m['os']}; "
        f"Python {m['python']}, Django {m['django']}, PostgreSQL {m['postgresql']} (pgvector {m['pgvector'] or '-'}), "
        f"Valkey {m['valkey'] or '-'}; load average at the end {', '.join(str(x) for x in m['loadavg_at_end'])}.",
        "",
        _load_line(doc),
        "",
        "| benchmark | figure | value | target | result |",
        "| --- | --- | --- | --- | --- |",
    ]
    for result in doc["results"]:
        if result["error"]:
            error = _first_line(result["error"])[:160].replace("|", "/")
            lines.append(f"| {result['name']} | error | {error} | | ERROR |")
            continue
        for fig in result["figures"]:
            target = f"{fig['target']} {fig['unit']}".strip() if fig["target"] else ""
            ok = "" if fig["ok"] is None else ("PASS" if fig["ok"] else "**FAIL**")
            target = target.replace("<=", "≤").replace(">=", "≥")
            lines.append(
                f"| {result['name']} | {fig['label']} | {fmt(fig['value'], fig['unit'])} | {target} | {ok} |"
            )
    params = "; ".join(
        f"{r['name']}: " + ", ".join(f"{k}={v}" for k, v in r["params"].items())
        for r in doc["results"]
        if r["params"]
    )
    lines += ["", f"Parameters: {params}.", "", END]
    return "\n".join(lines)


def _load_line(doc: dict[str, Any]) -> str:
    """Other people's load, per benchmark: busy share before and during, and the CPU reference loop."""
    background = doc.get("setup", {}).get("background_load_before_run") or {}
    parts = []
    references: list[float] = []
    for r in doc["results"]:
        details = r.get("details") or {}
        before = details.get("background_before") or {}
        if isinstance(before.get("cpu_reference_ms"), int | float):
            references.append(before["cpu_reference_ms"])
        bits = []
        if before.get("busy_pct") is not None:
            bits.append(f"{before['busy_pct']:.0f}% busy before")
        if isinstance(details.get("machine_cpu_busy_pct"), int | float):
            bits.append(f"{details['machine_cpu_busy_pct']:.0f}% during")
        if before.get("cpu_reference_ms") is not None:
            bits.append(f"reference loop {before['cpu_reference_ms']} ms")
        if bits:
            parts.append(f"{r['name']} ({', '.join(bits)})")
    text = (
        f"Load from other processes: {background.get('busy_pct', 'n/a')}% of the CPUs busy before the run "
        f"(load average {background.get('loadavg_1m', 'n/a')})"
    )
    if parts:
        text += "; " + "; ".join(parts)
    spread = (
        f"; it went from {min(references):g} to {max(references):g} ms in this run"
        if references
        else ""
    )
    return (
        text
        + ". The reference loop is the CPU time of a fixed pure-Python loop (best of 3) just before each "
        f"benchmark{spread}: larger means slower (shared) cores, and the CPU-time figures grow with it."
    )


def readme_update(doc: dict[str, Any]) -> None:
    """Write the run's figures to bench/FIGURES.md (the README links to it)."""
    FIGURES.write_text(
        "# Latest full run of `make bench`\n\n"
        "Written by `make bench` (a full run without errors); what the figures mean and the\n"
        "targets' summary: [README.md](README.md).\n\n" + markdown(doc) + "\n"
    )

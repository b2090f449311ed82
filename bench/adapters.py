"""Benchmark `adapters`: model adapter overhead on a streamed answer, against bare httpx.

A local server (`bench/sse_server.py`, a process of its own) streams one
pre-rendered answer of 2,000 text chunks in OpenAI or Anthropic format. This
process reads it, on one asyncio loop, three ways, interleaved in every
repetition (the order rotates):

- `adapter`: `llm.adapter_for(EndpointConfig(...)).stream(request)`,
  every event consumed (the adapter's own HTTP plumbing: the shared client,
  the per-read timeouts, the SSE parser and the translation into typed events);
- `complete`: `adapter.complete(request)`, the same plus assembling the
  ChatResponse (what the engine calls);
- `bare`: the minimal work any client must do with the same stream: one
  `httpx.AsyncClient`, `client.stream("POST", ...)`, `aiter_lines()`, and
  `json.loads` of each `data:` line.

Figure: median adapter time / median bare time per stream, per wire format.
Two deliveries: `burst` (the server sends the whole body at once: the client
reads as fast as it can, so wall time is the client's work; the target is on
this one) and `paced` (one send per event, 250 µs apart, as a provider streams:
wall time is the server's pace, so the figure is the client process's CPU time
per stream, adapter against bare).
"""

import asyncio
import json
import os
import sys
import time
from typing import Any

import httpx

from .procs import Processes, free_port
from .results_model import Result, figure
from .stats import percentile, summary

APIS = ("openai", "anthropic")
VARIANTS = ("adapter", "complete", "bare")
PACED_VARIANTS = ("adapter", "bare")  # a paced stream takes ~0.6 s: the two that matter
PACED_GAP_US = 250


def _wait_port(port: int, procs: Processes, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs._check_alive()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sse_server did not listen on {port}:\n{procs.log_tail('sse-server')}")


def _request() -> Any:
    from llm.types import ChatMessage, ChatRequest

    return ChatRequest(
        messages=(
            ChatMessage(role="system", content="You are a benchmark."),
            ChatMessage(role="user", content="Say 2,000 words."),
        )
    )


async def _bare(client: httpx.AsyncClient, url: str, api: str, body: dict[str, Any]) -> int:
    """What any client must do: read the lines, parse each data line's JSON."""
    parsed = 0
    headers = {"Accept": "text/event-stream"}
    if api == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                json.loads(data)
                parsed += 1
    return parsed


async def _adapter_stream(adapter: Any, request: Any) -> int:
    events = 0
    async for _event in adapter.stream(request):
        events += 1
    return events


async def _adapter_complete(adapter: Any, request: Any) -> int:
    response = await adapter.complete(request)
    return len(response.text)


async def _measure(
    base: str, reps: int, mode: str, variants: tuple[str, ...], warmup: bool = True
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]], dict[str, Any]]:
    from llm import EndpointConfig, adapter_for

    request = _request()
    query = "?mode=burst" if mode == "burst" else f"?mode=paced&gap_us={PACED_GAP_US}"
    adapters: dict[str, Any] = {
        "openai": adapter_for(
            EndpointConfig(name="bench-openai", api="openai", base_url=f"{base}/v1", model="m")
        ),
        "anthropic": adapter_for(
            EndpointConfig(name="bench-anthropic", api="anthropic", base_url=base, model="m")
        ),
    }
    # The adapters append their path to base_url; the query string rides on a patched url().
    for adapter in adapters.values():
        plain = adapter.url
        adapter.url = lambda plain=plain: plain() + query
    bodies = {api: adapters[api].payload(request, stream=True) for api in APIS}
    urls = {api: adapters[api].url() for api in APIS}
    wall: dict[str, dict[str, list[float]]] = {a: {v: [] for v in variants} for a in APIS}
    cpu: dict[str, dict[str, list[float]]] = {a: {v: [] for v in variants} for a in APIS}
    counts: dict[str, Any] = {}
    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=500, max_keepalive_connections=100)
    ) as client:

        async def one(api: str, variant: str) -> int:
            if variant == "bare":
                return await _bare(client, urls[api], api, bodies[api])
            if variant == "complete":
                return await _adapter_complete(adapters[api], request)
            return await _adapter_stream(adapters[api], request)

        # Warm-up: imports, connection setup paths, the first SSE parse.
        for api in APIS:
            for variant in variants if warmup else ():
                counts[f"{api}/{variant}"] = await one(api, variant)
        for rep in range(reps):
            for api in APIS:
                turn = rep % len(variants)
                order = variants[turn:] + variants[:turn]
                for variant in order:
                    started, started_cpu = time.perf_counter(), time.process_time()
                    await one(api, variant)
                    wall[api][variant].append((time.perf_counter() - started) * 1000)
                    cpu[api][variant].append((time.process_time() - started_cpu) * 1000)
    return wall, cpu, counts


def run(
    procs: Processes, *, reps: int, paced_reps: int, chunks: int = 2000, paced_warmup: bool = True
) -> Result:
    """The burst series, then the paced one (its warm-up optional: the burst's ran the same
    code paths in this process just before)."""
    from .runs import MachineLoad

    result = Result(
        name="adapters",
        title=f"Model adapter overhead on a streamed answer of {chunks} chunks, against bare httpx",
        params={
            "chunks": chunks,
            "burst_reps": reps,
            "paced_reps": paced_reps,
            "paced_gap_us": PACED_GAP_US,
        },
    )
    port = free_port()
    procs.start(
        "sse-server",
        [sys.executable, "-m", "bench.sse_server", "--port", str(port), "--chunks", str(chunks)],
    )
    _wait_port(port, procs)
    base = f"http://127.0.0.1:{port}"
    load = MachineLoad()
    load.start()
    burst_wall, burst_cpu, counts = asyncio.run(_measure(base, reps, "burst", VARIANTS))
    paced_wall, paced_cpu, _ = asyncio.run(
        _measure(base, paced_reps, "paced", PACED_VARIANTS, warmup=paced_warmup)
    )
    machine = load.stop()
    procs.stop("sse-server")

    def med(values: list[float]) -> float:
        return percentile(values, 50)

    figures = []
    details: dict[str, Any] = {"events_or_chars_per_stream": counts}
    for api in APIS:
        ratio = med(burst_wall[api]["adapter"]) / med(burst_wall[api]["bare"])
        figures.append(
            figure(
                f"{api}_burst_ratio",
                f"{api}: adapter.stream / bare httpx, median wall per stream (burst)",
                ratio,
                "x",
                le=1.2,
            )
        )
    for api in APIS:
        figures.append(
            figure(
                f"{api}_burst_cpu_ratio",
                f"{api}: adapter.stream / bare httpx, median client CPU per stream (burst)",
                med(burst_cpu[api]["adapter"]) / med(burst_cpu[api]["bare"]),
                "x",
            )
        )
    for api in APIS:
        figures.append(
            figure(
                f"{api}_burst_adapter_ms",
                f"{api}: adapter.stream, median per {chunks}-chunk stream (burst)",
                med(burst_wall[api]["adapter"]),
                "ms",
            )
        )
        figures.append(
            figure(
                f"{api}_burst_bare_ms",
                f"{api}: bare httpx, median per {chunks}-chunk stream (burst)",
                med(burst_wall[api]["bare"]),
                "ms",
            )
        )
    for api in APIS:
        figures.append(
            figure(
                f"{api}_paced_cpu_ratio",
                f"{api}: adapter.stream / bare httpx, median client CPU per stream "
                f"(paced, {PACED_GAP_US} µs apart)",
                med(paced_cpu[api]["adapter"]) / med(paced_cpu[api]["bare"]),
                "x",
            )
        )
    result.figures = figures
    for label, wall, cpu in (
        ("burst", burst_wall, burst_cpu),
        ("paced", paced_wall, paced_cpu),
    ):
        details[label] = {
            api: {
                variant: {
                    "wall_ms": summary(wall[api][variant]),
                    "client_cpu_ms": summary(cpu[api][variant]),
                    "wall_us_per_chunk_p50": round(med(wall[api][variant]) * 1000 / chunks, 2),
                    "cpu_us_per_chunk_p50": round(med(cpu[api][variant]) * 1000 / chunks, 2),
                }
                for variant in wall[api]
            }
            for api in APIS
        }
        details[label]["ratios"] = {
            api: {
                **{
                    f"{variant}_over_bare_{kind}": round(
                        med(values[api][variant]) / med(values[api]["bare"]), 3
                    )
                    for variant in wall[api]
                    if variant != "bare"
                    for kind, values in (("wall", wall), ("cpu", cpu))
                },
                # Per repetition (same rep, neighbouring runs): how stable the ratio is.
                "adapter_over_bare_wall_per_rep": [
                    round(a / b, 3)
                    for a, b in zip(wall[api]["adapter"], wall[api]["bare"], strict=True)
                ],
            }
            for api in APIS
        }
    details["pid"] = os.getpid()
    details.update(machine)
    result.details = details
    result.notes.append(
        "Client CPU is this process's (the server is another process); the ratios are medians over "
        "interleaved repetitions on one event loop."
    )
    return result

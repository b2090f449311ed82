"""Benchmark `memory`: long-term memory search with the owner filter on, small and large owners.

`--memory-items` random 256-dim vectors (default 100,000; 1,000,000 is an
option) written with COPY, in two cases, one after the other:
1. uniform: round-robin over 1,000 owners (every owner small: the exact scan);
2. skewed: LARGE_OWNERS owners with `--memory-large-items` items each (default
   max(items / 20, 2 x MEMORY_EXACT_SCAN_MAX): 50,000 at 1,000,000) and the rest
   round-robin over the other owners, rows shuffled so each owner's items are
   scattered over the table as in real life. The large owners' own HNSW indexes
   are built through `memory_owner_index_build`, the service the Celery task calls
   (build time per index reported).

Measured for random owners and random query vectors, K = 10, through the production
path (`memory.selectors.memory_nearest`, path "auto"): p50 / p95 latency (targets:
p95 <= 10 ms at 100,000 items, <= 20 ms at 1,000,000) and recall@10 against an exact
scan with the same owner filter (>= 0.95), for small and large owners separately.
For the record also the exact scan of a large owner: what it gets while its index
is being built.
"""

import random
import time
from typing import Any

from .results_model import Figure, Result, figure
from .runs import MachineLoad
from .stats import percentile, summary

OWNERS = 1000
LARGE_OWNERS = 4
K = 10
BUILD_MEM = "2GB"  # the machine has 24 GB; a 50,000-item graph of 256 dims needs ~0.2 GB


INTRINSIC_DIMS = 16
NOISE = 0.3  # per coordinate, against basis coordinates of 1: ~7 % of the norm


class Vectors:
    """Random vectors of `dims` coordinates, of two kinds (cosine ignores the norm).

    "random": isotropic gaussian, intrinsic dimension = `dims`: the worst case for
    any approximate index (every point is about as far as any other).
    "lowrank": a random combination of INTRINSIC_DIMS fixed gaussian directions plus
    isotropic noise: the shape of real text embeddings, whose intrinsic dimension
    is far below their width.
    """

    def __init__(self, kind: str, dims: int, seed: int) -> None:
        self.kind, self.dims = kind, dims
        self.rng = random.Random(seed)
        basis_rng = random.Random(0)  # the same directions for the items and the queries
        self.basis = [[basis_rng.gauss(0, 1) for _ in range(dims)] for _ in range(INTRINSIC_DIMS)]

    def __call__(self) -> list[float]:
        gauss = self.rng.gauss
        if self.kind == "random":
            return [gauss(0, 1) for _ in range(self.dims)]
        v = [gauss(0, NOISE) for _ in range(self.dims)]
        for direction in self.basis:
            z = gauss(0, 1)
            v = [x + z * a for x, a in zip(v, direction, strict=True)]
        return v


def _owners() -> list[int]:
    from django.contrib.auth import get_user_model

    User = get_user_model()
    User.objects.bulk_create(
        [User(username=f"bench-mem-{i}") for i in range(OWNERS)], ignore_conflicts=True
    )
    return list(
        User.objects.filter(username__startswith="bench-mem-")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _load(rows: list[int], vectors: Vectors, seed: float) -> float:
    """One item per entry of `rows` (its owner), the vectors made by the server; returns seconds.

    1. The owners go in with COPY (a column of integers), the basis directions too.
    2. INSERT ... SELECT draws each vector in PostgreSQL (random_normal, pgvector's
       element-wise `*` and `sum`), the same distribution as `Vectors` draws the
       queries from: a million 256-dim vectors in Python took ~12 minutes.
    3. VACUUM ANALYZE.
    """
    from django.db import connection

    from memory.models import MemoryItem, MemoryOwnerIndex
    from memory.selectors import vector_literal

    table = MemoryItem._meta.db_table
    dims = vectors.dims
    if vectors.kind == "random":
        draw = f"(SELECT array_agg(random_normal()) FROM generate_series(1, {dims}) WHERE r.i > 0)"
    else:
        noise = (
            f"(SELECT array_agg(random_normal(0, {NOISE})) FROM generate_series(1, {dims}) "
            "WHERE r.i > 0)::vector"
        )
        # `WHERE r.i > 0` ties each subquery to its row: drawn again for every item.
        draw = (
            f"{noise} + (SELECT sum(array_fill(random_normal()::real, ARRAY[{dims}])::vector * b.v) "
            "FROM bench_basis b WHERE r.i > 0)"
        )
    with connection.cursor() as cursor:
        # A clean table: a DELETE of a million rows would leave a million dead tuples.
        # CASCADE: the items' versions (and any later table pointing at them) go too.
        cursor.execute(f'TRUNCATE "{table}", "{MemoryOwnerIndex._meta.db_table}" CASCADE')
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexname LIKE %s",
            [table, "memory\\_owner\\_%"],
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{name}"')
        started = time.perf_counter()
        cursor.execute("DROP TABLE IF EXISTS bench_rows, bench_basis")
        cursor.execute("CREATE UNLOGGED TABLE bench_rows (i int PRIMARY KEY, owner_id bigint)")
        cursor.execute("CREATE UNLOGGED TABLE bench_basis (j int, v vector)")
        with cursor.copy("COPY bench_rows (i, owner_id) FROM STDIN") as copy:
            for i, owner in enumerate(rows, start=1):
                copy.write_row((i, owner))
        with cursor.copy("COPY bench_basis (j, v) FROM STDIN") as copy:
            for j, direction in enumerate(vectors.basis):
                copy.write_row((j, vector_literal(direction)))
        cursor.execute("SELECT setseed(%s)", [seed])
        # Identifiers and numbers from this module; no outside values.
        cursor.execute(
            f'INSERT INTO "{table}" (owner_id, tag, subject, content, embedding, dims, '  # nosec B608
            "embedding_model, importance, confidence, source, source_key, created_at, updated_at) "
            f"SELECT r.owner_id, 'fact', '', 'bench item ' || r.i, {draw}::vector, {dims}, "
            "'bench', 0.5, 0.8, 'bench', '', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z' "
            "FROM bench_rows r ORDER BY r.i"
        )
        cursor.execute("DROP TABLE bench_rows, bench_basis")
        cursor.execute(f'VACUUM ANALYZE "{table}"')
        return time.perf_counter() - started


def _search(
    owners: list[int], vectors: Vectors, queries: int
) -> tuple[list[float], list[float], list[float]]:
    """Per query: production-path latency (ms), its recall@10, and the exact scan's latency."""
    from memory.selectors import memory_nearest

    rng = random.Random(vectors.rng.random())
    latencies: list[float] = []
    recalls: list[float] = []
    exact_ms: list[float] = []
    for _ in range(queries):
        owner = rng.choice(owners)
        query = vectors()
        started = time.perf_counter()
        hits = memory_nearest(owner_id=owner, vector=query, model="bench", k=K)
        latencies.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        exact = memory_nearest(owner_id=owner, vector=query, model="bench", k=K, path="exact")
        exact_ms.append((time.perf_counter() - started) * 1000)
        truth = {h.item_id for h in exact}
        recalls.append(len(truth & {h.item_id for h in hits}) / max(1, len(truth)))
    return latencies, recalls, exact_ms


def _measured(
    owners: list[int], kind: str, dims: int, queries: int, seed: int
) -> tuple[list[float], list[float], list[float], dict[str, Any]]:
    _search(owners, Vectors(kind, dims, seed + 100), 20)  # warm-up: caches, plans
    load = MachineLoad()
    load.start()
    latencies, recalls, exact_ms = _search(owners, Vectors(kind, dims, seed), queries)
    return latencies, recalls, exact_ms, load.stop()


def _latency_figures(
    key: str, label: str, ms: list[float], recalls: list[float], target_p95: float
) -> list[Figure]:
    return [
        figure(f"{key}_p50_ms", f"{label}, p50", percentile(ms, 50), "ms"),
        figure(f"{key}_p95_ms", f"{label}, p95", percentile(ms, 95), "ms", le=target_p95),
        figure(
            f"{key}_recall_at_10",
            f"{label}, recall@10 vs exact scan (owner filter on)",
            sum(recalls) / len(recalls),
            ge=0.95,
        ),
    ]


def run(
    *,
    items: int,
    dims: int,
    queries: int,
    large_items: int | None = None,
    large_owners: int = LARGE_OWNERS,
    data: str = "lowrank",
) -> Result:
    """1. Uniform case: load, measure. 2. Skewed case: load, build the large owners'
    indexes through the service, measure small and large owners separately."""
    from django.conf import settings
    from django.db import connection

    from memory.services import memory_owner_index_build

    limit = int(settings.MEMORY_EXACT_SCAN_MAX)
    large_items = large_items or max(items // 20, 2 * limit)
    result = Result(
        name="memory",
        title=f"Memory search with the owner filter at {items:,} items of {OWNERS:,} owners "
        f"({data} vectors)",
        params={
            "items": items,
            "data": data,
            "owners": OWNERS,
            "dims": dims,
            "queries": queries,
            "k": K,
            "exact_scan_max": limit,
            "large_owners": large_owners,
            "large_owner_items": large_items,
            "hnsw_ef_search": settings.MEMORY_HNSW_EF_SEARCH,
        },
    )
    target_p95 = 10.0 if items <= 100_000 else 20.0
    owners = _owners()
    timings: dict[str, float] = {}

    # 1. Uniform.
    uniform_rows = [owners[i % OWNERS] for i in range(items)]
    timings["uniform_load_s"] = _load(uniform_rows, Vectors(data, dims, 1), seed=0.1)
    del uniform_rows
    print(f"bench memory: uniform load {timings['uniform_load_s']:.0f} s", flush=True)
    uni_ms, uni_recall, _, uni_machine = _measured(owners, data, dims, queries, seed=3)

    # 2. Skewed: large owners' items scattered among everyone else's.
    large, small = owners[:large_owners], owners[large_owners:]
    rest = items - large_owners * large_items
    rows = [o for o in large for _ in range(large_items)] + [
        small[i % len(small)] for i in range(max(0, rest))
    ]
    random.Random(7).shuffle(rows)
    timings["skewed_load_s"] = _load(rows, Vectors(data, dims, 11), seed=0.2)
    del rows
    print(f"bench memory: skewed load {timings['skewed_load_s']:.0f} s", flush=True)
    builds: list[float] = []
    for owner in large:
        started = time.perf_counter()
        memory_owner_index_build(owner_id=owner, dims=dims, maintenance_work_mem=BUILD_MEM)
        builds.append(time.perf_counter() - started)
        print(f"bench memory: owner index built in {builds[-1]:.1f} s", flush=True)
    small_ms, small_recall, _, small_machine = _measured(small, data, dims, queries, seed=13)
    large_ms, large_recall, large_exact_ms, large_machine = _measured(
        large, data, dims, queries, seed=17
    )
    connection.close()
    per_small = rest // len(small)
    result.figures = [
        *_latency_figures(
            "uniform", f"uniform ({items // OWNERS:,} items per owner)", uni_ms, uni_recall,
            target_p95,
        ),
        *_latency_figures(
            "small", f"skewed, small owners (~{per_small:,} items)", small_ms, small_recall,
            target_p95,
        ),
        *_latency_figures(
            "large", f"skewed, large owners ({large_items:,} items, own HNSW)", large_ms,
            large_recall, target_p95,
        ),
        figure(
            "large_exact_p95_ms",
            "large owner scanned exactly (before its index is ready), p95",
            percentile(large_exact_ms, 95),
            "ms",
        ),
        figure("owner_index_build_s", "one large owner's index build, mean", sum(builds) / len(builds), "s"),
        figure("skewed_load_s", f"load of {items:,} items (server-drawn vectors) + VACUUM ANALYZE", timings["skewed_load_s"], "s"),
    ]  # fmt: skip
    details: dict[str, Any] = {
        "uniform_ms": summary(uni_ms),
        "small_ms": summary(small_ms),
        "large_ms": summary(large_ms),
        "large_exact_ms": summary(large_exact_ms),
        "large_recall_min": min(large_recall),
        "owner_index_build_s": [round(b, 1) for b in builds],
        "load_s": {k: round(v, 1) for k, v in timings.items()},
        "machine": {"uniform": uni_machine, "small": small_machine, "large": large_machine},
    }
    result.details = details
    result.notes = [
        f"Exact-scan limit {limit:,} items: small owners are scanned exactly (recall 1.0); "
        f"the {large_owners} large owners go through their own HNSW index "
        f"(ef_search {settings.MEMORY_HNSW_EF_SEARCH}).",
        f"Data {data!r}: "
        + (
            "isotropic gaussian vectors, the worst case for HNSW recall."
            if data == "random"
            else f"intrinsic dimension {INTRINSIC_DIMS} + noise, like real text embeddings."
        ),
    ]
    return result

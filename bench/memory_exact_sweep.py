"""`python -m bench.memory_exact_sweep [background items]`: the exact scan's cost by owner size.

How MEMORY_EXACT_SCAN_MAX was chosen: one owner each of 1,000 / 2,000 / 5,000 /
10,000 / 20,000 items of 256 dims, their rows shuffled among 100,000 (default)
items of 1,000 other owners (an owner's items scattered over the table, as in
real life), then 100 exact searches (K = 10) per owner after 20 warm-up ones:
p50 / p95 / max in ms. Uses its own database (`agentplatform_bench_memsweep`).
"""

import os
import random
import sys
import time

SIZES = (1000, 2000, 5000, 10000, 20000)
DIMS = 256
K = 10


def main(background: int) -> None:
    os.environ.setdefault("BENCH_DATABASE_NAME", "agentplatform_bench_memsweep")
    from . import environment

    environment.prepare("bench-memsweep")
    environment.django_setup()
    from django.contrib.auth import get_user_model
    from django.db import connection

    from memory.models import MemoryItem
    from memory.selectors import memory_nearest, vector_literal

    from .runs import MachineLoad

    rng = random.Random(1)

    def vector() -> list[float]:
        return [rng.gauss(0, 1) for _ in range(DIMS)]

    User = get_user_model()
    User.objects.bulk_create(
        [User(username=f"bg{i}") for i in range(1000)] + [User(username=f"sz{s}") for s in SIZES]
    )
    others = list(User.objects.filter(username__startswith="bg").values_list("pk", flat=True))
    owner = {s: User.objects.get(username=f"sz{s}").pk for s in SIZES}
    rows = [others[i % len(others)] for i in range(background)]
    for size in SIZES:
        rows += [owner[size]] * size
    rng.shuffle(rows)
    table = MemoryItem._meta.db_table
    started = time.perf_counter()
    with connection.cursor() as cursor:
        with cursor.copy(
            f'COPY "{table}" (owner_id, tag, subject, content, embedding, dims, embedding_model, '
            "importance, confidence, source, source_key, created_at, updated_at) FROM STDIN"
        ) as copy:
            for i, owner_id in enumerate(rows):
                copy.write_row(
                    (
                        owner_id, "fact", "", f"i{i}", vector_literal(vector()), DIMS, "bench",
                        0.5, 0.8, "bench", "", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z",
                    )
                )  # fmt: skip
        cursor.execute(f'VACUUM ANALYZE "{table}"')
    print(f"loaded {len(rows):,} items in {time.perf_counter() - started:.0f} s", flush=True)
    load = MachineLoad()
    load.start()
    print("| owner's items | exact scan p50 | p95 | max |\n|---|---|---|---|")
    for size in SIZES:
        for _ in range(20):
            memory_nearest(owner_id=owner[size], vector=vector(), model="bench", k=K, path="exact")
        ms = []
        for _ in range(100):
            query = vector()
            started = time.perf_counter()
            memory_nearest(owner_id=owner[size], vector=query, model="bench", k=K, path="exact")
            ms.append((time.perf_counter() - started) * 1000)
        ms.sort()
        print(f"| {size:,} | {ms[50]:.2f} ms | {ms[95]:.2f} ms | {ms[-1]:.2f} ms |", flush=True)
    print(load.stop())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)

"""The pool_alloc workload: allocation inside a capture, cugraphrt's pool against CuPy's
``MemoryPool`` (host time per allocation; a regression guard: what allocation costs users is
capture time, targeted by ``capture_time`` and the real models' capture rows)."""

from __future__ import annotations

import functools
from time import perf_counter

import cupy
import numpy as np

import cugraphrt

from .spec import Context, RowBuilder, Target, Workload, keep
from .workloads_cupy import cugraphrt_capture, cupy_capture, random_array

__all__ = ["POOL_ALLOC", "alloc_pattern"]

US = 1e6
ALLOC_SYSTEMS = ("cugraphrt", "cupy_pool")
ALLOC_CALLS, ALLOC_WINDOW = 2000, 16


def alloc_pattern(sizes: list[int]) -> None:
    """``cupy.empty`` of each size; each array dies ``ALLOC_WINDOW`` allocations later."""
    live: list[object] = [None] * ALLOC_WINDOW
    empty, f32 = cupy.empty, np.float32
    for index, n in enumerate(sizes):
        live[index % ALLOC_WINDOW] = empty(n, dtype=f32)


def run_pool_alloc(ctx: Context) -> None:
    """Allocation throughput inside a capture: cugraphrt's pool vs CuPy's MemoryPool.

    Both sides run the same pattern inside a stream capture on the same stream: cugraphrt's
    capture routes ``cupy.empty`` to a cugraphrt pool, CuPy's plain capture leaves it to
    CuPy's default MemoryPool, pre-warmed with the same pattern so that neither side calls
    ``cudaMalloc`` in the timed loop. Timing inside a capture for both keeps the comparison
    on the allocator alone.
    """
    # 30 rounds in --quick (a round is about 15 ms a side): with 10, one report of
    # 2026-11-29 read 2.618x [2.145, 2.777] on a noisy host beside 2.257x [2.236, 2.277].
    repeats = ctx.repeats(full=60, quick=30)
    rng = np.random.default_rng(7)
    sizes = [int(n) for n in rng.integers(16, 16385, ALLOC_CALLS)]  # 64 B to 64 KiB
    stream = cupy.cuda.Stream(non_blocking=True)
    marker = random_array(1, seed=8)
    with stream:
        cupy.add(marker, 1, out=marker)
        for _ in range(3):  # fills CuPy's pool for this stream; a second pass splits blocks
            alloc_pattern(sizes)  # differently, so repeat until every request finds one
    pool = cugraphrt.graph_pool_handle()  # keeps its segments between captures
    row = RowBuilder(f"{ALLOC_CALLS} empty() alloc+free", "us", ALLOC_SYSTEMS, "cupy_pool",
                     "cugraphrt")
    batches = {
        "cugraphrt": keep(_alloc_batch, functools.partial(cugraphrt_capture, pool=pool),
                          stream, sizes, marker),
        "cupy_pool": keep(_alloc_batch, cupy_capture, stream, sizes, marker),
    }
    row.measure(batches, repeats, scale=US, warmup=1)
    ctx.emit(row.build())


def _alloc_batch(capture, stream, sizes: list[int], marker) -> float:
    def timed() -> float:
        start = perf_counter()
        alloc_pattern(sizes)
        elapsed = perf_counter() - start
        cupy.add(marker, 1, out=marker)  # one node, so the capture is not empty
        return elapsed

    graph, elapsed = capture(stream, timed)
    if isinstance(graph, cugraphrt.Graph):
        graph.reset()
    return elapsed / len(sizes)


POOL_ALLOC = Workload(
    "pool_alloc", f"{ALLOC_CALLS} cupy.empty() of 64 B-64 KiB inside a capture; host time per "
    "allocation (a regression guard: what users pay is capture time, see capture_time and "
    "the real models)", ALLOC_SYSTEMS, "cupy_pool",
    (Target("cugraphrt", "cupy_pool", 2.60),), run_pool_alloc, own=("cugraphrt",))

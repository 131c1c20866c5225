"""Real-model CuPy workload: 50 conjugate-gradient iterations on a 512x512 Poisson problem.

The solver is plain CuPy: a 5-point Laplacian kernel, reductions and elementwise updates,
with alpha and beta kept on the device as 0-d arrays, so an iteration never waits for the
host and the whole solve captures into one graph (``cugraphrt.make_graphed``). About 13
kernels per iteration, 650 per solve: eager CuPy pays a Python launch for each, the graph one
launch in all. Systems: ``cupy_eager``, ``cugraphrt`` (copy the right-hand side in, replay)
and ``gpu_floor`` (events around the graph's replays, back to back).
"""

from __future__ import annotations

import functools
from time import perf_counter

import cupy

import cugraphrt

from .poisson import laplacian
from .spec import Context, Workload, check_close, cycling
from .timing import device_sync, gpu_batch, host_batch, single
from .workloads_cupy import random_array
from .workloads_real import CAPTURE, MEMORY, MS, PER_CALL, ROTATION, US, MiB, emit_all, rows_of

__all__ = ["REAL_CG", "poisson_cg", "laplacian"]

GRID, ITERATIONS = 512, 50
SYSTEMS = ("cupy_eager", "cugraphrt", "gpu_floor")
STEP_METRIC = f"{PER_CALL} {ITERATIONS} it. {GRID}x{GRID}"
#: The graph replays the eager kernels in the eager order (the reductions included).
CG_TOL = 1e-5

def poisson_cg(b: cupy.ndarray, iterations: int = ITERATIONS) -> cupy.ndarray:
    """``iterations`` steps of conjugate gradients on ``laplacian(x) = b`` from ``x = 0``."""
    x = cupy.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = cupy.sum(r * r)
    for _ in range(iterations):
        ap = laplacian(p)
        alpha = rr / cupy.sum(p * ap)
        x += alpha * p
        r -= alpha * ap
        rr_next = cupy.sum(r * r)
        p = r + (rr_next / rr) * p
        rr = rr_next
    return x


def run_cg(ctx: Context) -> None:
    """Eager CuPy CG vs the same solve captured with cugraphrt.make_graphed."""
    rows = rows_of({STEP_METRIC: ("us", SYSTEMS, "cupy_eager"),
                    CAPTURE: ("ms", SYSTEMS[:2], "cugraphrt"),
                    MEMORY: ("MiB", SYSTEMS[:2], "cugraphrt")}, "cugraphrt")
    for metric in (CAPTURE, MEMORY):
        rows[metric].unavailable("cupy_eager", "eager: no graph")
    try:
        _cg_rows(ctx, rows)
    finally:
        emit_all(ctx, rows)


def _cg_rows(ctx: Context, rows) -> None:
    calls = ctx.repeats(full=4, quick=2)
    stream = cupy.cuda.Stream(non_blocking=True)
    rhs = [random_array((GRID, GRID), seed=60 + i) for i in range(ROTATION)]
    per_call = rows[STEP_METRIC]
    with stream:
        expected = poisson_cg(rhs[1])  # compiles the kernels before any capture
        ctx.step("capture")
        graphed = per_call.setup("cugraphrt", lambda: _graphed(rhs, expected))
        batches = {"cupy_eager": functools.partial(
            host_batch, cycling(poisson_cg, rhs), calls, include_sync=True)}
        if graphed is None:
            per_call.unavailable("gpu_floor", "needs the cugraphrt graph")
        else:
            rows[MEMORY].set("cugraphrt",
                             single(graphed.graph.pool().stats().reserved_bytes / MiB))
            batches["cugraphrt"] = functools.partial(
                host_batch, cycling(graphed, rhs), calls, include_sync=True)
            batches["gpu_floor"] = functools.partial(gpu_batch, graphed.graph.replay, calls,
                                                     stream)
        ctx.step("measure")
        per_call.measure(batches, ctx.repeats(full=15, quick=5), scale=US)
        del graphed, batches
        ctx.step("capture time")
        rows[CAPTURE].measure({"cugraphrt": functools.partial(_capture_time, rhs[0])},
                              ctx.repeats(full=5, quick=2), scale=MS, warmup=1)


def _graphed(rhs, expected):
    graphed = cugraphrt.make_graphed(poisson_cg, (rhs[0].copy(),))
    check_close(cupy.asnumpy(graphed(rhs[1])), cupy.asnumpy(expected), "cg replay", CG_TOL)
    return graphed


def _capture_time(sample) -> float:
    """Wall seconds of make_graphed (3 warm-ups, capture, instantiate), synchronized; the
    graph is destroyed after the clock stops."""
    device_sync()
    start = perf_counter()
    graphed = cugraphrt.make_graphed(poisson_cg, (sample,))
    device_sync()
    seconds = perf_counter() - start
    del graphed
    return seconds


REAL_CG = Workload(
    "real_cg", f"CuPy conjugate gradients, {ITERATIONS} iterations of a {GRID}x{GRID} Poisson "
    f"problem (~650 kernels), eager vs one graph: wall time per solve (no target: what "
    f"graphing saves)", SYSTEMS, "cupy_eager", (), run_cg, own=("cugraphrt", "gpu_floor"))

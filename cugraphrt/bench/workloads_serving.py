"""serving: one graphed callable fed a stream of mixed batch sizes (shape buckets).

A server does not see one batch size. Two models, the torch_infer conv net (torch) and the
cupy_mlp MLP (CuPy), are each fed the same deterministic stream of 400 batch sizes drawn
from 1..32 (:func:`batch_sizes`). Systems, per model:

* ``eager``: every call eager.
* ``today``: one graph captured at 32 (``make_graphed`` / ``graph_module`` without buckets);
  every other size runs the eager function, which is what a graphed callable gives a
  server without buckets.
* ``bucketed``: ``buckets="pow2"`` (1, 2, 4, ..., 32), every bucket captured before timing
  with ``capture_all()``; a call of size n replays the smallest bucket >= n.
* ``oracle``: a graph at every exact size 1..32 in one shared cugraphrt pool, picked from a
  dict: no padding at all, the bound that bucketing is measured against.
* ``torch_buckets`` (conv net): vLLM's way by hand: a ``torch.cuda.graph`` per bucket,
  largest first, in one ``torch.cuda.graph_pool_handle()``, every bucket's static input a
  view of one buffer of the largest size, inputs padded by hand, outputs kept as weak
  references as vLLM keeps them (:func:`~cugraphrt.bench.torch_common.weak_ref`: the next
  capture may reuse their memory).

A repeat is one pass over the whole stream between two device events
(:func:`~cugraphrt.bench.timing.gpu_batch`): per-call time = the pass / 400. The events
bill a host-bound system for the time the device waits on it, as a server's clock would.
Every system's outputs are checked against eager on the unpadded input before timing.

The targets are against the independent reference, the vLLM-style torch family (conv net):
per-call time, and the device memory the whole family holds by ``cudaMemGetInfo`` (caches
emptied before and after each build, as a server reclaims them). The other rows are
information, cugraphrt against cugraphrt: the same per-call numbers against the oracle,
the pool memory of all buckets against the largest bucket captured alone, and (conv net)
the time to capture every bucket against capturing them with ``torch.cuda.graph`` into one
shared pool, warm-ups included for both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

import cugraphrt

from .family_memory import device_rows
from .spec import (
    Context,
    RowBuilder,
    SystemUnavailable,
    Target,
    Workload,
    check_close,
    cycling,
    keep,
    verify,
)
from .timing import gpu_batch, single
from .torch_common import (
    adapter_function,
    capture_batch,
    convnet,
    release_torch,
    torch_module,
)
from .vllm_style import VllmGraphs
from .workloads_cupy import MLP_LAYERS, MLP_WIDTH, mlp_forward, mlp_params, random_array
from .workloads_torch import INFER_TOL

__all__ = ["SERVING", "batch_sizes", "HandBuckets", "run_serving"]

US, MS, MIB = 1e6, 1e3, float(1 << 20)
STREAM_LENGTH, MAX_BATCH, STREAM_SEED = 400, 32, 0
#: What ``buckets="pow2"`` gives for a sample of 32; torch_buckets captures the same ones.
BUCKETS = (1, 2, 4, 8, 16, 32)
#: Checked against eager before timing: an exact bucket, light and heavy padding (3 in 4,
#: 17 in 32), and the size today's single graph was captured at.
VERIFY_SIZES = (1, 3, 17, 32)
CONVNET, MLP = "convnet", f"mlp {MLP_LAYERS}x{MLP_WIDTH}"
#: Thumbnails: a serving conv net whose calls are launch-bound, the regime graphs are for. At
#: 32x32 its batch-32 kernels alone take about a third of an eager call on an H200, which
#: caps any graph's gain near 3x whatever the runtime does.
IMAGE = 16
CONVNET_SYSTEMS = ("eager", "today", "bucketed", "oracle", "torch_buckets")
MLP_SYSTEMS = CONVNET_SYSTEMS[:4]
MLP_TOL = 1e-4  # float32 cuBLAS at another batch size may pick another kernel


def batch_sizes(length: int = STREAM_LENGTH, max_batch: int = MAX_BATCH,
                seed: int = STREAM_SEED) -> list[int]:
    """The request stream: ``length`` batch sizes drawn uniformly from ``1..max_batch``.

    ``numpy.random.RandomState`` keeps the stream identical across NumPy versions.
    """
    sizes = np.random.RandomState(seed).randint(1, max_batch + 1, size=length)
    return [int(n) for n in sizes]


@dataclass(frozen=True)
class _Served:
    """One model as every system sees it.

    ``graph(sample, **options)`` is ``make_graphed`` or ``graph_module`` bound to the model;
    ``inputs`` maps each batch size to an input of that size; ``timed_pass(call, inputs)``
    returns device seconds per call of one pass.
    """

    name: str
    eager: Callable[[Any], Any]
    graph: Callable[..., Any]
    inputs: dict[int, Any]
    copy: Callable[[Any], Any]
    to_host: Callable[[Any], np.ndarray]
    timed_pass: Callable[[Callable[[Any], Any], list], float]
    tol: float
    torch_buckets: Callable[[], Callable[[Any], Any]] | None = None
    release: Callable[[], None] = lambda: None


class _Rows:
    """The rows of one model: per-call time, the same against the oracle, pool memory."""

    def __init__(self, name: str, systems: tuple[str, ...]) -> None:
        self.per_call = RowBuilder(f"{name} per call", "us", systems, "today", "bucketed")
        self.oracle = RowBuilder(f"{name} vs oracle", "us", ("oracle", "bucketed"), "oracle",
                                 "bucketed")
        self.memory = RowBuilder(f"{name} pool reserved", "MiB", ("largest_alone", "bucketed"),
                                 "largest_alone", "bucketed")
        self.device = RowBuilder(f"{name} device, build", "MiB", ("torch_buckets", "bucketed"),
                                 "torch_buckets", "bucketed")
        self.emptied = RowBuilder(f"{name} device, emptied", "MiB",
                                  ("torch_buckets", "bucketed"), "torch_buckets", "bucketed")

    def all(self) -> tuple[RowBuilder, ...]:
        return self.per_call, self.oracle, self.memory, self.device, self.emptied


# -- the systems ---------------------------------------------------------------------------


def _today(served: _Served) -> Callable[[Any], Any]:
    graphed = served.graph(served.copy(served.inputs[MAX_BATCH]))
    eager = served.eager

    def call(x):
        # The eager function itself for other sizes: a graphed callable would warn first.
        return graphed(x) if x.shape[0] == MAX_BATCH else eager(x)

    return call


def _bucketed(served: _Served, **options) -> Any:
    bucketed = served.graph(served.copy(served.inputs[MAX_BATCH]), **options)
    bucketed.capture_all(progress=False)
    return bucketed


def _pow2(served: _Served) -> Any:
    bucketed = _bucketed(served, buckets="pow2")
    if tuple(bucketed.buckets) != BUCKETS:
        raise RuntimeError(f"buckets='pow2' for a sample of {MAX_BATCH} gave "
                           f"{tuple(bucketed.buckets)} (expected {BUCKETS})")
    return bucketed


def _oracle(served: _Served) -> Callable[[Any], Any]:
    pool = cugraphrt.graph_pool_handle()
    # Largest first, like the buckets: smaller graphs reuse the larger ones' temporaries.
    graphs = {n: served.graph(served.copy(served.inputs[n]), pool=pool)
              for n in range(MAX_BATCH, 0, -1)}
    return lambda x: graphs[x.shape[0]](x)


class HandBuckets:
    """Bucketed torch graphs the way vLLM builds them, by hand.

    A ``torch.cuda.graph`` per bucket (:class:`~cugraphrt.bench.vllm_style.VllmGraphs`: one
    warm-up and the capture on one stream, largest first, one
    ``torch.cuda.graph_pool_handle()``), each bucket's static input a view of the first rows
    of one buffer sized for the largest bucket; a call of size n copies its input into the
    first n rows of the smallest bucket >= n, zeroes the rest, replays, and returns the
    first n rows of the output.

    Parameters
    ----------
    torch : module
    model : torch.nn.Module
        In eval mode; captured under the caller's grad mode.
    sample : torch.Tensor
        Gives the trailing shape, dtype and device of the inputs.
    buckets : tuple of int
        Sorted bucket sizes.
    """

    def __init__(self, torch, model, sample, buckets: tuple[int, ...]) -> None:
        self.buffer = sample.new_zeros((max(buckets), *sample.shape[1:]))
        self.graphs = VllmGraphs(torch, model, lambda size: (self.buffer[:size],),
                                 buckets).graphs
        self.route = {n: min(b for b in buckets if b >= n) for n in range(1, max(buckets) + 1)}

    def __call__(self, x):
        n = x.shape[0]
        size = self.route[n]
        self.buffer[:n].copy_(x)
        if n < size:
            self.buffer[n:size].zero_()  # the pad rows, as buckets' default pad=0
        graph, out = self.graphs[size]
        graph.replay()
        return out[:n]


# -- rows ----------------------------------------------------------------------------------


def _serve(ctx: Context, served: _Served, rows: _Rows) -> None:
    """Measure and emit the rows of one model (inside its stream and grad mode)."""
    calls: dict[str, Any] = {}
    try:
        calls = _per_call(ctx, served, rows.per_call)
    finally:
        ctx.emit(rows.per_call.build())
    for system in rows.oracle.row.systems:  # the same samples, against the other reference
        rows.oracle.row.cells[system] = rows.per_call.row.cells[system]
    ctx.emit(rows.oracle.build())
    ctx.step(f"{served.name}: memory")
    try:
        _memory(served, calls.get("bucketed"), rows.memory)
    finally:
        ctx.emit(rows.memory.build())
    if served.torch_buckets is not None:
        ctx.step(f"{served.name}: device memory")
        try:
            device_rows(rows.device, rows.emptied, "serving")
        finally:
            ctx.emit(rows.device.build())
            ctx.emit(rows.emptied.build())


def _per_call(ctx: Context, served: _Served, row: RowBuilder) -> dict[str, Any]:
    expected = {n: served.to_host(served.eager(served.inputs[n])) for n in VERIFY_SIZES}
    builders: dict[str, Callable[[], Any]] = {
        "today": lambda: _today(served), "bucketed": lambda: _pow2(served),
        "oracle": lambda: _oracle(served)}
    if served.torch_buckets is not None:
        builders["torch_buckets"] = served.torch_buckets
    calls: dict[str, Any] = {"eager": served.eager}
    for system, build in builders.items():
        ctx.step(f"{served.name}: capture {system}")
        call = row.setup(system, build)
        if call is not None and verify(row, system, functools.partial(
                _check, served, call, expected, system)):
            calls[system] = call
    requests = [served.inputs[n] for n in batch_sizes()]
    ctx.step(f"{served.name}: measure")
    row.measure({system: keep(served.timed_pass, call, requests)
                 for system, call in calls.items()},
                ctx.repeats(full=15, quick=5), scale=US)
    return calls


def _check(served: _Served, call, expected: dict, system: str) -> None:
    for n, want in expected.items():
        # Copied to the host before the next call: outputs live until the next call only.
        check_close(served.to_host(call(served.inputs[n])), want,
                    f"{system} {served.name} batch {n}", served.tol)


def _memory(served: _Served, bucketed, row: RowBuilder) -> None:
    if bucketed is None:
        row.unavailable_all("needs the bucketed system")
        return
    row.set("bucketed", single(bucketed.stats().pool.reserved_bytes / MIB))
    alone = row.setup("largest_alone", lambda: _reserved_alone(served))
    if alone is not None:
        row.set("largest_alone", single(alone / MIB))


def _reserved_alone(served: _Served) -> int:
    largest = _bucketed(served, buckets=[MAX_BATCH])
    return largest.stats().pool.reserved_bytes


def _capture_time(ctx: Context, torch, served: _Served, row: RowBuilder) -> None:
    builds = {"torch_buckets": served.torch_buckets, "bucketed": lambda: _pow2(served)}
    batches = {system: keep(capture_batch, torch, lambda: None, lambda _, b=build: b())
               for system, build in builds.items()}
    ctx.step(f"{served.name}: capture time")
    row.measure(batches, ctx.repeats(full=5, quick=3), scale=MS, warmup=1)


# -- the two models ------------------------------------------------------------------------


def run_mlp(ctx: Context) -> None:
    """The CuPy half: the cupy_mlp MLP (no dropout) on one non-blocking stream."""
    stream = cupy.cuda.Stream(non_blocking=True)
    forward = functools.partial(mlp_forward, mlp_params((MLP_WIDTH,) * (MLP_LAYERS + 1), 50))
    served = _Served(
        MLP, forward,
        graph=lambda sample, **options: cugraphrt.make_graphed(forward, (sample,), **options),
        inputs={n: random_array((n, MLP_WIDTH), seed=60 + n) for n in range(1, MAX_BATCH + 1)},
        copy=lambda x: x.copy(), to_host=cupy.asnumpy,
        timed_pass=functools.partial(_timed_pass, stream), tol=MLP_TOL)
    with stream:
        forward(served.inputs[MAX_BATCH])  # cuBLAS handle and kernels, billed to no system
        _serve(ctx, served, _Rows(MLP, MLP_SYSTEMS))


def run_convnet(ctx: Context) -> None:
    """The torch half: the torch_infer conv net on one torch side stream, under no_grad."""
    rows = _Rows(CONVNET, CONVNET_SYSTEMS)
    capture = RowBuilder(f"{CONVNET} capture {len(BUCKETS)} buckets", "ms",
                         ("torch_buckets", "bucketed"), "torch_buckets", "bucketed")
    try:
        torch = torch_module()
        graph_module = adapter_function("graph_module")
    except SystemUnavailable as exc:
        for row in (*rows.all(), capture):
            row.unavailable_all(str(exc))
            ctx.emit(row.build())
        return
    torch.manual_seed(0)
    model = convnet(torch).cuda().eval()
    inputs = {n: torch.randn(n, 3, IMAGE, IMAGE, device="cuda")
              for n in range(1, MAX_BATCH + 1)}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    served = _Served(
        CONVNET, model,
        graph=lambda sample, **options: graph_module(model, (sample,), **options),
        inputs=inputs, copy=lambda x: x.clone(), to_host=lambda y: y.float().cpu().numpy(),
        timed_pass=functools.partial(_timed_pass, stream.cuda_stream), tol=INFER_TOL,
        torch_buckets=lambda: HandBuckets(torch, model, inputs[MAX_BATCH], BUCKETS),
        release=functools.partial(release_torch, torch))
    try:
        with torch.no_grad(), torch.cuda.stream(stream):
            model(inputs[MAX_BATCH])  # cuDNN handle and kernels, billed to no system
            _serve(ctx, served, rows)
            try:
                _capture_time(ctx, torch, served, capture)
            finally:
                ctx.emit(capture.build())
    finally:
        release_torch(torch)


def _timed_pass(stream, call, inputs: list) -> float:
    return gpu_batch(cycling(call, inputs), len(inputs), stream)


def run_serving(ctx: Context) -> None:
    """Both models; the conv net runs even if the MLP crashed, then the crash is raised."""
    error: Exception | None = None
    try:
        run_mlp(ctx)
    except Exception as exc:  # noqa: BLE001 - run the torch half anyway, then report
        error = exc
    run_convnet(ctx)
    if error is not None:
        raise error


# The targets are against the independent reference, the vLLM-style torch family (issue 41):
# its per-call time, and the device memory it holds. Against cugraphrt's own oracle and the
# largest bucket alone, and against today's eager fallback (a host-bound reference that moves
# with the host), the rows are information.
SERVING = Workload(
    "serving", f"{STREAM_LENGTH} requests of batch 1..{MAX_BATCH} through one graphed callable; "
    "device time per call (events around the stream), pool and device MiB, capture ms",
    (*CONVNET_SYSTEMS, "largest_alone"), "today",
    (Target("bucketed", "torch_buckets", 1.05, metric=f"{CONVNET} per call"),
     Target("bucketed", "torch_buckets", 1.00, metric=f"{CONVNET} device, build"),
     Target("bucketed", "torch_buckets", 1.00, metric=f"{CONVNET} device, emptied")),
    run_serving, own=("today", "bucketed", "oracle", "largest_alone"))

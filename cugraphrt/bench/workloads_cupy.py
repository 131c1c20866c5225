"""CuPy workloads: replay, chain, cupy_mlp and the CuPy half of pool_sharing (pool_alloc:
:mod:`cugraphrt.bench.workloads_alloc`).

Every system of a row runs in this process on the same GPU, on one non-blocking stream,
interleaved batch by batch (see :mod:`cugraphrt.bench.timing`). Inputs are drawn on the host
from fixed seeds (never zeros), and a graph's result is checked against eager CuPy before it
is timed: a fast graph that computes something else must not make the table.
"""

from __future__ import annotations

import contextlib
import functools
import gc

import cupy
import numpy as np

import cugraphrt
from cugraphrt._memory.blocks import ALIGNMENT

from .several_devices import several_devices_path
from .spec import (
    Context,
    Row,
    RowBuilder,
    Target,
    Workload,
    check_close,
    cycling,
    keep,
    measure_together,
)
from .timing import device_sync, gpu_batch, host_batch, single

__all__ = ["REPLAY", "CHAIN", "CUPY_MLP", "POOL_SHARING", "cugraphrt_capture", "cupy_capture",
           "random_array"]

US = 1e6
MIB = float(1 << 20)
#: Distinct input sets cycled through, so that every call copies fresh data into a graph's
#: static inputs (passing the static input itself would skip the copy and flatter graphs).
ROTATION = 8


def random_array(shape, seed: int, scale: float = 1.0) -> cupy.ndarray:
    """Normal float32 values drawn on the host (no cuRAND state involved).

    Synchronizes the current stream: the workloads then use the array on non-blocking
    streams, which do not wait for the legacy default stream's upload.
    """
    rng = np.random.default_rng(seed)
    array = cupy.asarray(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
    cupy.cuda.get_current_stream().synchronize()
    return array


def cupy_capture(stream, fn):
    """Capture ``fn()`` with CuPy's own stream capture: ``(cupy.cuda.graph.Graph, result)``."""
    with stream:
        stream.begin_capture()
        try:
            result = fn()
        except BaseException:
            try:
                stream.end_capture()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
            raise
        return stream.end_capture(), result


def cugraphrt_capture(stream, fn, pool=None):
    """Capture ``fn()`` into a :class:`cugraphrt.Graph`: ``(graph, result)``."""
    graph = cugraphrt.Graph()
    with cugraphrt.graph(graph, pool=pool, stream=stream):
        result = fn()
    return graph, result


def _launch_batch(launch, stream, calls: int, *kept) -> float:
    with stream:
        return host_batch(launch, calls)


def _wall_batch(call, stream, calls: int, *kept) -> float:
    with stream:
        return host_batch(call, calls, include_sync=True)


def _gpu_batch(launch, stream, calls: int, *kept) -> float:
    return gpu_batch(launch, calls, stream)


# -- replay ----------------------------------------------------------------------------------

REPLAY_SYSTEMS = ("cugraphrt", "cupy_graph", "torch_graph", "cugraphrt_launcher",
                  "cugraphrt_several")
REPLAY_METRIC, LAUNCHER_METRIC = "graph launch", "launcher"
SEVERAL_METRIC = "graph launch, several devices"


def run_replay(ctx: Context) -> None:
    """Host time of one launch of a one-kernel graph from Python: ``Graph.replay()``,
    ``Graph.launcher()``'s launcher and ``Graph.replay()`` down the several-device path
    against CuPy's ``Graph.launch`` (and torch's replay), the five interleaved in one
    rotation, so the three rows divide by the same CuPy samples."""
    # A round of four systems took about 1 ms, so 15 rounds (the old --quick count)
    # spanned 15 ms: one burst of host activity covered most of them (an H100 host read the
    # launcher at 1.00x [0.77, 1.29] that way, then 0.92x [0.91, 0.94] in the next run).
    calls, repeats = 100, ctx.repeats(full=200, quick=60)
    stream = cupy.cuda.Stream(non_blocking=True)
    replay = RowBuilder(REPLAY_METRIC, "us", REPLAY_SYSTEMS[:3], "cupy_graph", "cugraphrt")
    launcher = RowBuilder(LAUNCHER_METRIC, "us", ("cugraphrt_launcher", "cupy_graph"),
                          "cupy_graph", "cugraphrt_launcher")
    several = RowBuilder(SEVERAL_METRIC, "us", ("cugraphrt_several", "cupy_graph"),
                         "cupy_graph", "cugraphrt_several")
    ctx.step("capture")
    batches = {
        "cugraphrt": replay.setup("cugraphrt",
                                  lambda: _one_kernel(cugraphrt_capture, stream, calls)),
        "cupy_graph": replay.setup("cupy_graph",
                                   lambda: _one_kernel(cupy_capture, stream, calls)),
        "torch_graph": replay.setup("torch_graph", lambda: _torch_one_kernel(calls)),
        "cugraphrt_launcher": launcher.setup(
            "cugraphrt_launcher",
            lambda: _one_kernel(cugraphrt_capture, stream, calls, launcher=True)),
        "cugraphrt_several": several.setup(
            "cugraphrt_several",
            lambda: _one_kernel(cugraphrt_capture, stream, calls, several=True)),
    }
    ctx.step("measure")
    measure_together((replay, launcher, several), batches, repeats, scale=US)
    ctx.emit(replay.build())
    ctx.emit(launcher.build())
    ctx.emit(several.build())


def _one_kernel(capture, stream, calls: int, launcher: bool = False, several: bool = False):
    x = random_array(1024, seed=1)
    with stream:
        cupy.add(x, 1, out=x)  # compile and load the kernel before capturing it
    graph, _ = capture(stream, lambda: cupy.add(x, 1, out=x))
    if launcher:
        launch = graph.launcher(stream)
    else:
        launch = graph.replay if isinstance(graph, cugraphrt.Graph) else graph.launch
    with stream:
        before = x.copy()
        with several_devices_path() if several else contextlib.nullcontext():
            launch()  # one launch adds exactly 1: the timed call does the captured work
    stream.synchronize()
    check_close(cupy.asnumpy(x), cupy.asnumpy(before) + 1, "one-kernel launch", tol=1e-7)
    return keep(_several_batch if several else _launch_batch, launch, stream, calls, x, graph)


def _several_batch(launch, stream, calls: int, *kept) -> float:
    with several_devices_path(), stream:
        return host_batch(launch, calls)


def _torch_one_kernel(calls: int):
    from .torch_common import one_kernel_replay

    return one_kernel_replay(calls)


# -- chain ---------------------------------------------------------------------------------

CHAIN_SYSTEMS = ("cupy_eager", "cugraphrt", "cupy_graph", "gpu_floor")
CHAIN_PAIRS = 100  # 200 kernels: a multiply and an add per pair


def chain(x: cupy.ndarray) -> None:
    """200 dependent in-place elementwise updates (no allocation, so no pool involved)."""
    for _ in range(CHAIN_PAIRS):
        cupy.multiply(x, 0.999, out=x)
        cupy.add(x, 0.001, out=x)


def run_chain(ctx: Context) -> None:
    """Wall time per call of 200 chained updates on 1024 floats, eager and as graphs."""
    calls, repeats = ctx.repeats(full=20, quick=8), ctx.repeats(full=40, quick=10)
    stream = cupy.cuda.Stream(non_blocking=True)
    row = RowBuilder("200 updates x1024", "us", CHAIN_SYSTEMS, "cupy_graph", "cugraphrt")
    x = random_array(1024, seed=2)
    with stream:
        chain(x)  # compile both kernels
    batches = {"cupy_eager": keep(_wall_batch, functools.partial(chain, x), stream, calls, x)}
    ctx.step("capture")
    graphs = {system: row.setup(system, functools.partial(_chain_graph, capture, stream))
              for system, capture in (("cugraphrt", cugraphrt_capture),
                                      ("cupy_graph", cupy_capture))}
    for system, built in graphs.items():
        if built is not None:
            launch, *kept = built
            batches[system] = keep(_wall_batch, launch, stream, calls, *kept)
    if graphs["cugraphrt"] is None:
        row.unavailable("gpu_floor", "needs the cugraphrt graph")
    else:
        launch, *kept = graphs["cugraphrt"]
        batches["gpu_floor"] = keep(_gpu_batch, launch, stream, calls, *kept)
    ctx.step("measure")
    row.measure(batches, repeats, scale=US)
    ctx.emit(row.build())


def _chain_graph(capture, stream):
    x = random_array(1024, seed=3)
    graph, _ = capture(stream, lambda: chain(x))
    launch = graph.replay if isinstance(graph, cugraphrt.Graph) else graph.launch
    start = random_array(1024, seed=4)
    with stream:
        expected = start.copy()
        chain(expected)
        x[...] = start
        launch()
    stream.synchronize()
    check_close(cupy.asnumpy(x), cupy.asnumpy(expected), "chain replay", tol=1e-6)
    return launch, x, graph


# -- cupy_mlp ------------------------------------------------------------------------------

MLP_SYSTEMS = ("cupy_eager", "cugraphrt", "gpu_floor")
MLP_BATCH, MLP_WIDTH, MLP_LAYERS, KEEP_PROB = 64, 512, 4, 0.9


def mlp_params(widths, seed: int) -> list[tuple[cupy.ndarray, cupy.ndarray]]:
    """Weights and biases of an MLP with layer widths ``widths`` (input first)."""
    return [(random_array((n_in, n_out), seed + i, scale=n_in ** -0.5),
             random_array(n_out, seed + 100 + i, scale=0.1))
            for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True))]


def mlp_forward(params, x: cupy.ndarray, bernoulli=None) -> cupy.ndarray:
    """Matmul + bias + ReLU per hidden layer; dropout too when given a ``bernoulli`` draw
    (``cugraphrt.random.bernoulli``, whose draws are fresh on every replay)."""
    h = x
    for index, (w, b) in enumerate(params):
        h = h @ w + b
        if index < len(params) - 1:
            h = cupy.maximum(h, 0)
            if bernoulli is not None:
                h = h * bernoulli(KEEP_PROB, size=h.shape) * (1.0 / KEEP_PROB)
    return h


def run_cupy_mlp(ctx: Context) -> None:
    """A pure-CuPy MLP forward (cuBLAS matmul, dropout): eager vs cugraphrt.make_graphed."""
    calls, repeats = 2 * ROTATION, ctx.repeats(full=40, quick=10)
    stream = cupy.cuda.Stream(non_blocking=True)
    metric = f"forward {MLP_LAYERS}x{MLP_WIDTH} b{MLP_BATCH}"
    row = RowBuilder(metric, "us", MLP_SYSTEMS, "cupy_eager", "cugraphrt")
    params = mlp_params((MLP_WIDTH,) * (MLP_LAYERS + 1), seed=20)
    inputs = [random_array((MLP_BATCH, MLP_WIDTH), seed=30 + i) for i in range(ROTATION)]
    # Imported here: once loaded, every capture prepares the default generator.
    from cugraphrt.random import bernoulli

    forward = functools.partial(mlp_forward, params, bernoulli=bernoulli)
    with stream:
        forward(inputs[0])  # cuBLAS handle, kernels, the generator's module
    batches = {"cupy_eager": keep(_wall_batch, cycling(forward, inputs), stream, calls)}
    ctx.step("capture")
    graphed = row.setup("cugraphrt", lambda: _graphed_mlp(forward, inputs, stream))
    if graphed is None:
        row.unavailable("gpu_floor", "needs the cugraphrt graph")
    else:
        batches["cugraphrt"] = keep(_wall_batch, cycling(graphed, inputs), stream, calls)
        batches["gpu_floor"] = keep(_gpu_batch, graphed.graph.replay, stream, calls, graphed)
    ctx.step("measure")
    row.measure(batches, repeats, scale=US)
    ctx.emit(row.build())


def _graphed_mlp(forward, inputs, stream):
    from cugraphrt import random as cgrandom

    with stream:
        graphed = cugraphrt.make_graphed(forward, (inputs[0].copy(),))
        # Same seed, same draws: the replay must equal the eager forward, dropout included.
        cgrandom.manual_seed(1234)
        device_sync()
        expected = forward(inputs[1]).copy()
        cgrandom.manual_seed(1234)
        device_sync()
        actual = graphed(inputs[1]).copy()
    stream.synchronize()
    check_close(cupy.asnumpy(actual), cupy.asnumpy(expected), "cupy_mlp replay", tol=1e-4)
    return graphed


# -- pool_sharing (CuPy half) --------------------------------------------------------------

SHARE_BATCHES = (256, 512, 768, 1024, 1280, 1536, 1792, 2048)
SHARE_WIDTHS = (1024, 2048, 2048, 2048, 1024)
BLOCK_ALIGN = ALIGNMENT  # the pool's block granularity


def run_pool_sharing(ctx: Context) -> None:
    """Reserved memory of 8 graphs (8 batch sizes): separate pools vs one shared pool."""
    error: Exception | None = None
    try:
        for row in cupy_pool_rows(ctx):
            ctx.emit(row)
    except Exception as exc:  # noqa: BLE001 - run the torch half anyway, then report
        error = exc
    from . import workloads_torch

    for row in workloads_torch.torch_pool_rows(ctx, SHARE_BATCHES, SHARE_WIDTHS):
        ctx.emit(row)
    if error is not None:
        raise error


def cupy_pool_rows(ctx: Context) -> list[Row]:
    """The CuPy rows of pool_sharing: pool reserved bytes and device memory used.

    Both rows are information (issue 51): the bound is cugraphrt's own (the device memory of
    the largest graph captured alone into a cugraphrt pool, plus the outputs the other graphs
    keep alive), so a ratio to it compares cugraphrt with itself. The pool-sharing target is
    the torch row's, against torch's own shared pool.
    """
    ctx.step("cupy graphs")
    systems = ("cugraphrt_separate", "cugraphrt_shared", "bound")
    reserved = RowBuilder("cupy mlp x8 reserved", "MiB", systems, "bound", "cugraphrt_shared")
    device = RowBuilder("cupy mlp x8 device", "MiB", systems, "bound", "cugraphrt_shared")
    stream = cupy.cuda.Stream(non_blocking=True)
    forward = functools.partial(mlp_forward, mlp_params(SHARE_WIDTHS, seed=40))
    statics = {b: random_array((b, SHARE_WIDTHS[0]), seed=b) for b in SHARE_BATCHES}
    with stream:
        for b in SHARE_BATCHES:
            forward(statics[b])
    separate = _capture_set(forward, statics, stream, shared=False)
    shared = _capture_set(forward, statics, stream, shared=True)
    for name, use in (("cugraphrt_separate", separate), ("cugraphrt_shared", shared)):
        reserved.set(name, single(use["reserved"] / MIB))
        device.set(name, single(use["device"] / MIB))
    # The bounds: what the largest graph needs alone (its peak in the pool; its device
    # memory, captured alone into a pool of its own), plus the outputs the other graphs keep
    # alive.
    largest = max(SHARE_BATCHES)
    kept = sum(-(-nbytes // BLOCK_ALIGN) * BLOCK_ALIGN
               for b, nbytes in separate["outputs"].items() if b != largest)
    alone = _capture_set(forward, {largest: statics[largest]}, stream, shared=False)
    reserved.set("bound", single((separate["peak_largest"] + kept) / MIB))
    device.set("bound", single((alone["device"] + kept) / MIB))
    return [reserved.build(), device.build()]


def _capture_set(forward, statics, stream, shared: bool) -> dict:
    release_memory()
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    pool = cugraphrt.graph_pool_handle() if shared else None
    graphs, outputs = [], {}
    for b in sorted(statics, reverse=True):  # largest first: later graphs reuse its blocks
        graph, outputs[b] = cugraphrt_capture(stream, lambda b=b: forward(statics[b]), pool)
        graphs.append(graph)
    device_sync()
    pools = {p.id: p for p in (g.pool() for g in graphs)}
    use = {
        "reserved": sum(p.stats().reserved_bytes for p in pools.values()),
        "device": free_before - cupy.cuda.runtime.memGetInfo()[0],
        "peak_largest": graphs[0].pool().stats().peak_active_bytes,
        "outputs": {b: out.nbytes for b, out in outputs.items()},
    }
    del graphs, outputs, pools, pool
    release_memory()
    return use


def release_memory() -> None:
    """Collect garbage and give cached device memory back, so deltas start from a floor."""
    gc.collect()
    device_sync()
    cugraphrt.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()


# -- the workloads -------------------------------------------------------------------------

REPLAY = Workload(
    "replay", "one-kernel graph launched from Python; host time per launch; rows: "
    "Graph.replay(), Graph.launcher()'s launcher, and Graph.replay() down the path of a "
    "process that sees several GPUs (emulated where it sees one), each against CuPy's "
    "Graph.launch",
    REPLAY_SYSTEMS, "cupy_graph",
    (Target("cugraphrt", "cupy_graph", 1.15, metric=REPLAY_METRIC),
     Target("cugraphrt_launcher", "cupy_graph", 1.00, metric=LAUNCHER_METRIC),
     Target("cugraphrt_several", "cupy_graph", 1.15, metric=SEVERAL_METRIC)), run_replay,
    own=("cugraphrt", "cugraphrt_launcher", "cugraphrt_several"))
CHAIN = Workload(
    "chain", "200 chained elementwise updates on 1024 floats; wall time per call",
    CHAIN_SYSTEMS, "cupy_graph", (Target("cugraphrt", "cupy_graph", 1.02),), run_chain,
    own=("cugraphrt", "gpu_floor"))
CUPY_MLP = Workload(
    "cupy_mlp", "pure-CuPy MLP forward with cuBLAS matmul and dropout; wall time per call "
    "(no target: how much graphing saves)", MLP_SYSTEMS, "cupy_eager", (), run_cupy_mlp,
    own=("cugraphrt", "gpu_floor"))
POOL_SHARING = Workload(
    "pool_sharing", "8 graphs at 8 batch sizes: separate pools vs one shared pool; MiB "
    "(targets on device memory by cudaMemGetInfo; reserved rows: each pool's own count)",
    ("cugraphrt_separate", "cugraphrt_shared", "bound", "torch_separate", "torch_shared"),
    "bound",
    (Target("cugraphrt_shared", "torch_shared", 1.00, metric="torch mlp x8 device"),),
    run_pool_sharing, own=("cugraphrt_separate", "cugraphrt_shared", "bound"))

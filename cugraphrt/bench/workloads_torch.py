"""PyTorch workloads: torch_infer, torch_train, capture_time, the torch half of pool_sharing
and the torch column of replay.

torch and cugraphrt_torch are imported inside the functions, never at module import: without
them the cells read ``n/a (torch not installed)`` and the run goes on. All systems of a row
run on one torch side stream, on copies of one model with the same weights, and each
graphed system's output (or gradients) is checked against eager before it is timed.
"""

from __future__ import annotations

import copy
import functools
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cugraphrt

from .spec import (
    Context,
    Row,
    RowBuilder,
    SystemUnavailable,
    Target,
    Workload,
    check_close,
    cycling,
    describe,
    keep,
    rotating,
    verify,
)
from .timing import gpu_batch, host_batch, single
from .torch_common import (
    CAPTURE_BUILDS,
    WARMUP_ITERS,
    HandGraph,
    adapter_function,
    capture_batch,
    convnet,
    graph_builds,
    mlp,
    one_kernel_replay,
    release_torch,
    torch_module,
)

__all__ = ["TORCH_INFER", "TORCH_TRAIN", "CAPTURE_TIME", "torch_pool_rows",
           "one_kernel_replay"]

US, MS, MIB = 1e6, 1e3, float(1 << 20)
ROTATION = 8


# -- torch_infer ---------------------------------------------------------------------------

INFER_SYSTEMS = ("torch_eager", "torch_graph", "torch_compile", "cugraphrt_torch", "gpu_floor")
#: Convolutions run in TF32 by default (cudnn.allow_tf32) and torch.compile may pick other
#: kernels: a looser bound than float32's, still far below a wrong result's.
INFER_TOL = 2e-3


@dataclass(frozen=True)
class _Variant:
    metric: str
    build: Callable[[Any], Any]  # torch -> nn.Module
    shape: tuple[int, ...]
    compile_in_quick: bool  # torch.compile is the slowest setup: only the MLP in --quick


INFER_VARIANTS = (
    _Variant("mlp 4x512 b32", lambda torch: mlp(torch, (512,) * 5), (32, 512), True),
    _Variant("convnet b32", convnet, (32, 3, 32, 32), False),
    _Variant("cpu-bound 16x128 b8", lambda torch: mlp(torch, (128,) * 17), (8, 128), False),
)


def run_torch_infer(ctx: Context) -> None:
    """Inference: eager vs hand-written graph vs torch.compile vs cugraphrt_torch."""
    first_error: Exception | None = None
    for variant in INFER_VARIANTS:
        ctx.step(variant.metric)
        row = RowBuilder(variant.metric, "us", INFER_SYSTEMS, "torch_graph", "cugraphrt_torch")
        try:
            torch = torch_module()
        except SystemUnavailable as exc:
            row.unavailable_all(str(exc))
            ctx.emit(row.build())
            continue
        try:
            _infer_row(ctx, torch, variant, row)
        except Exception as exc:  # noqa: BLE001 - measure the other variants, then report
            first_error = first_error or exc
        finally:
            ctx.emit(row.build())
            _reset_compiled(torch)
            release_torch(torch)
    if first_error is not None:
        raise first_error


def _infer_row(ctx: Context, torch, variant: _Variant, row: RowBuilder) -> None:
    calls, repeats = 4 * ROTATION, ctx.repeats(full=40, quick=10)
    torch.manual_seed(0)
    model = variant.build(torch).cuda().eval()
    inputs = [torch.randn(variant.shape, device="cuda") for _ in range(ROTATION)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        model(inputs[0])  # cuBLAS / cuDNN handles and kernels, outside every system's time
        expected = model(inputs[1]).cpu().numpy()
        builds = graph_builds(row, torch, model, inputs[0])
        compiled = _compiled(ctx, row, torch, model, variant, inputs)
        calls_of = {"torch_eager": [model], "torch_graph": builds["torch_graph"],
                    "torch_compile": None if compiled is None else [compiled],
                    "cugraphrt_torch": builds["cugraphrt_torch"]}
        batches: dict[str, Callable[[], float] | None] = {}
        for system, fns in calls_of.items():
            if fns is None or not all(verify(row, system, functools.partial(
                    _check_output, fn, inputs[1], expected, f"{system} {variant.metric}"))
                    for fn in fns):
                batches[system] = None
                continue
            batches[system] = rotating([keep(_wall_batch, cycling(fn, inputs), calls)
                                        for fn in fns])
        hands = builds["torch_graph"]
        if batches["torch_graph"] is None or not hands:
            row.unavailable("gpu_floor", "needs the hand-written torch graph")
        else:
            batches["gpu_floor"] = rotating([keep(gpu_batch, hand.graph.replay, calls,
                                                  stream.cuda_stream) for hand in hands])
        ctx.step(f"{variant.metric}: measure")
        row.measure(batches, repeats, scale=US)


def _check_output(fn, x, expected, what: str) -> None:
    check_close(fn(x).float().cpu().numpy(), expected, what, tol=INFER_TOL)


def _compiled(ctx: Context, row: RowBuilder, torch, model, variant: _Variant, inputs):
    if ctx.quick and not variant.compile_in_quick:
        row.unavailable("torch_compile", "skipped in --quick")
        return None
    ctx.step(f"{variant.metric}: torch.compile")

    def build():
        try:
            fn = torch.compile(copy.deepcopy(model), mode="reduce-overhead", dynamic=False)
            for x in inputs[:WARMUP_ITERS + 2]:  # compile, warm up, record the CUDA graph
                fn(x)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a compiler failure makes the cell n/a
            print(f"cugraphrt bench: torch.compile failed on {variant.metric!r}:",
                  file=sys.stderr)
            traceback.print_exc()
            raise SystemUnavailable(f"torch.compile failed: {describe(exc)}") from None
        return fn

    return row.setup("torch_compile", build)


def _reset_compiled(torch) -> None:
    # Frees the compiled graphs' CUDA-graph pools before the next variant is measured.
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - only memory is at stake
        pass


def _wall_batch(call, calls: int) -> float:
    return host_batch(call, calls, include_sync=True)


# -- torch_train ---------------------------------------------------------------------------

TRAIN_SYSTEMS = ("torch_eager", "torch_graphed", "cugraphrt_torch")
#: Within 1.05x of torch.cuda.make_graphed_callables, torch_infer's bound against torch's
#: graph. The step is ~600 us of host-bound work (the eager loss, autograd's engine,
#: AccumulateGrad) in which the two systems are at parity: 13 --quick reports of 2026-11-28
#: and 29 on H200s (docs/results) read 0.944x to 1.031x, median 1.005x, so the 1.00x bound
#: held before read host jitter, PASS in 6 of them and MISS in 7. cugraphrt's step runs
#: checks torch's lacks (the output alias check, the alias guard's storage counts) in about
#: the time its shorter call path saves. It was 0.95x before issue 41.
TRAIN_TARGET = 1.05


def run_torch_train(ctx: Context) -> None:
    """Forward + backward: eager vs torch's and cugraphrt_torch's make_graphed_callables."""
    row = RowBuilder("mlp 4x512 b32 fwd+bwd", "us", TRAIN_SYSTEMS, "torch_graphed",
                     "cugraphrt_torch")
    try:
        torch = torch_module()
    except SystemUnavailable as exc:
        row.unavailable_all(str(exc))
        ctx.emit(row.build())
        return
    try:
        _train_row(ctx, torch, row)
    finally:
        ctx.emit(row.build())
        release_torch(torch)


def _train_row(ctx: Context, torch, row: RowBuilder) -> None:
    # A step is ~0.5 ms of host-bound work. On a two-H200 host (2026-11-29) the per-round
    # ratio's sd was 0.10-0.21, so the median of 20 rounds erred by ~4% (1.25 sd/sqrt(n)):
    # nine reports read 0.979x-1.074x. 80 rounds halve that, for ~4 s more of --quick.
    calls, repeats = 4 * ROTATION, ctx.repeats(full=120, quick=80)
    torch.manual_seed(0)
    base = mlp(torch, (512,) * 5).cuda().train()
    pairs = [(torch.randn(32, 512, device="cuda"), torch.randn(32, 512, device="cuda"))
             for _ in range(ROTATION)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = copy.deepcopy(base)
        expected = _gradients(torch, eager, pairs[1])
        sample = (pairs[0][0].clone(),)
        modules = {
            "torch_eager": eager,
            "torch_graphed": row.setup("torch_graphed", lambda: _graphed_copy(
                torch.cuda.make_graphed_callables, base, sample)),
            "cugraphrt_torch": row.setup("cugraphrt_torch", lambda: _graphed_copy(
                adapter_function("make_graphed_callables"), base, sample)),
        }
        batches = {}
        for system, module in modules.items():
            checked = module is not None and verify(row, system, functools.partial(
                _check_gradients, torch, module, pairs[1], expected, f"{system} gradients"))
            if checked:
                step = functools.partial(_train_step, torch, module, list(module.parameters()))
                batches[system] = keep(_wall_batch, cycling(step, pairs), calls)
        ctx.step("measure")
        row.measure(batches, repeats, scale=US)


def _graphed_copy(make_graphed_callables, base, sample):
    # Each system graphs its own copy: make_graphed_callables replaces the module's forward.
    return make_graphed_callables(copy.deepcopy(base), sample, num_warmup_iters=WARMUP_ITERS)


def _train_step(torch, module, params, pair) -> None:
    x, y = pair
    for p in params:  # what optimizer.zero_grad(set_to_none=True) does
        p.grad = None
    torch.nn.functional.mse_loss(module(x), y).backward()


def _check_gradients(torch, module, pair, expected, what: str) -> None:
    check_close(_gradients(torch, module, pair), expected, what, tol=1e-4)


def _gradients(torch, module, pair):
    params = list(module.parameters())
    _train_step(torch, module, params, pair)
    return torch.cat([p.grad.reshape(-1) for p in params]).cpu().numpy()


# -- capture_time --------------------------------------------------------------------------

CAPTURE_SYSTEMS = ("torch", "cugraphrt_torch")
INFER_CAPTURE = "infer mlp 4x512 b32"
TRAIN_CAPTURE = "train mlp 4x512 b32"
#: The MLP rows' targets, from the host work a build adds (issue 51). torch builds this MLP's
#: graph in about 1.3 ms (inference) and 6 ms (training) on an H200; cugraphrt_torch's build
#: adds about 0.34 ms of host work of its own there (2026-11-28,
#: docs/experiments/capture_time_steps.py): the pool and its torch MemPool, the capture
#: registry and its bookkeeping at the end, the call path, the checks. No step of it takes
#: more than 0.05 ms; it is the floor of a runtime kept in Python (docs/performance.md,
#: "Capture time"). On builds of real models that cost is a few percent, and their capture
#: rows keep the product target CAPTURE_TARGET. Here it is 26% and 15%: the targets bound
#: the floor, so that growth of it still reads MISS. The inference bound was 1.30, the floor
#: itself: the 14 --quick reports on H200s since the warm-ups moved into the graph's pool
#: (2026-11-28/29, docs/results) read 1.231x to 1.343x, median 1.30x, and it passed half of
#: them. 1.40 sits above that spread; 0.1 ms more host work per build still reads MISS.
MLP_CAPTURE_TARGETS = {INFER_CAPTURE: 1.40, TRAIN_CAPTURE: 1.20}


def run_capture_time(ctx: Context) -> None:
    """Capture + instantiate time, warm-ups included, of the torch_infer and torch_train MLP."""
    rows = [RowBuilder(metric, "ms", CAPTURE_SYSTEMS, "torch", "cugraphrt_torch")
            for metric in (INFER_CAPTURE, TRAIN_CAPTURE)]
    try:
        torch = torch_module()
    except SystemUnavailable as exc:
        for row in rows:
            row.unavailable_all(str(exc))
            ctx.emit(row.build())
        return
    repeats = CAPTURE_BUILDS  # a build is 4-12 ms here: 21 a side cost about 0.5 s
    torch.manual_seed(0)
    base = mlp(torch, (512,) * 5).cuda()
    x = torch.randn(32, 512, device="cuda")
    _gradients(torch, base, (x, x))  # one-time costs (handles, kernels) billed to no system
    for p in base.parameters():
        p.grad = None  # the copies each system graphs start without gradients
    for row, build in zip(rows, (_infer_builders, _train_builders), strict=True):
        ctx.step(row.row.metric)
        try:
            batches = {system: row.setup(system, lambda f=factory: f(torch, base, x))
                       for system, factory in build().items()}
            row.measure(batches, repeats, scale=MS, warmup=1)
        finally:
            ctx.emit(row.build())
            release_torch(torch)


def _infer_builders() -> dict[str, Any]:
    def torch_side(torch, base, x):
        model = copy.deepcopy(base).eval()
        return keep(capture_batch, torch, lambda: model, lambda m: HandGraph(torch, m, x))

    def ours(torch, base, x):
        graph_module = adapter_function("graph_module")
        return keep(capture_batch, torch, lambda: copy.deepcopy(base).eval(),
                    lambda m: graph_module(m, (x.clone(),), num_warmup_iters=WARMUP_ITERS))

    return {"torch": torch_side, "cugraphrt_torch": ours}


def _train_builders() -> dict[str, Any]:
    def torch_side(torch, base, x):
        return keep(capture_batch, torch, lambda: copy.deepcopy(base).train(),
                    lambda m: torch.cuda.make_graphed_callables(
                        m, (x.clone(),), num_warmup_iters=WARMUP_ITERS), True)

    def ours(torch, base, x):
        make_graphed_callables = adapter_function("make_graphed_callables")
        return keep(capture_batch, torch, lambda: copy.deepcopy(base).train(),
                    lambda m: make_graphed_callables(
                        m, (x.clone(),), num_warmup_iters=WARMUP_ITERS), True)

    return {"torch": torch_side, "cugraphrt_torch": ours}


# -- pool_sharing (torch half) -------------------------------------------------------------

POOL_SYSTEMS = ("torch_separate", "torch_shared", "cugraphrt_separate", "cugraphrt_shared")


def torch_pool_rows(ctx: Context, batches, widths) -> list[Row]:
    """The torch rows of pool_sharing: reserved bytes and device memory of 8 graphs."""
    ctx.step("torch graphs")
    reserved = RowBuilder("torch mlp x8 reserved", "MiB", POOL_SYSTEMS, "torch_shared",
                          "cugraphrt_shared")
    device = RowBuilder("torch mlp x8 device", "MiB", POOL_SYSTEMS, "torch_shared",
                        "cugraphrt_shared")
    try:
        torch = torch_module()
    except SystemUnavailable as exc:
        for row in (reserved, device):
            row.unavailable_all(str(exc))
        return [reserved.build(), device.build()]
    torch.manual_seed(0)
    model = mlp(torch, widths).cuda().eval()
    statics = {b: torch.randn(b, widths[0], device="cuda") for b in batches}
    with torch.no_grad():
        for b in batches:
            model(statics[b])
        for system, capture in _pool_captures(torch, model, statics).items():
            use = reserved.setup(system, lambda c=capture: _pool_use(torch, c, statics))
            if use is None:
                device.row.cells[system] = reserved.row.cells[system]
            else:
                reserved.set(system, single(use[0] / MIB))
                device.set(system, single(use[1] / MIB))
    return [reserved.build(), device.build()]


def _pool_captures(torch, model, statics) -> dict[str, Any]:
    def torch_graphs(sizes, shared: bool):
        pool = torch.cuda.graph_pool_handle() if shared else None
        graphs, outputs = [], []
        for b in sorted(sizes, reverse=True):  # largest first, as in the CuPy rows
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs.append(model(statics[b]))
            graphs.append(graph)
        return graphs, outputs, None

    def our_graphs(sizes, shared: bool):
        capture_graph = adapter_function("graph")
        pool = cugraphrt.graph_pool_handle() if shared else None
        graphs, outputs = [], []
        for b in sorted(sizes, reverse=True):
            graph = cugraphrt.Graph()
            with capture_graph(graph, pool=pool):
                outputs.append(model(statics[b]))
            graphs.append(graph)
        return graphs, outputs, [g.pool() for g in graphs]

    return {
        "torch_separate": lambda sizes: torch_graphs(sizes, shared=False),
        "torch_shared": lambda sizes: torch_graphs(sizes, shared=True),
        "cugraphrt_separate": lambda sizes: our_graphs(sizes, shared=False),
        "cugraphrt_shared": lambda sizes: our_graphs(sizes, shared=True),
    }


def _pool_use(torch, capture, statics) -> tuple[int, int]:
    """(reserved bytes, device bytes) that capturing all graphs added."""
    import cupy

    # A throwaway capture first: one-time set-up of a capture stream (library handles) then
    # stays out of the deltas. The cuBLAS workspace does not: the graphs replay into one, so
    # it is part of what they cost. torch's graphs share the one it caches per capture
    # stream; cugraphrt_torch gives each capture its own, from the capture's pool, which
    # torch.compile's clearing of that cache cannot free (see drop_blas_workspaces).
    # Forgetting the cached one makes torch's first capture below allocate it again.
    warm = capture([min(statics)])
    del warm
    torch._C._cuda_clearCublasWorkspaces()
    release_torch(torch)
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    torch_before = torch.cuda.memory_reserved()
    graphs, outputs, pools = capture(list(statics))
    torch.cuda.synchronize()
    if pools is None:  # torch's own pools: its caching allocator's reserved bytes
        reserved = torch.cuda.memory_reserved() - torch_before
    else:
        reserved = sum(p.stats().reserved_bytes for p in {p.id: p for p in pools}.values())
    used = free_before - cupy.cuda.runtime.memGetInfo()[0]
    del graphs, outputs, pools
    release_torch(torch)
    return reserved, used


# -- the workloads -------------------------------------------------------------------------

TORCH_INFER = Workload(
    "torch_infer", "torch inference (MLP, conv net, launch-bound MLP); wall time per call "
    "with copy-in; gpu_floor = events around the hand-written graph's replay",
    INFER_SYSTEMS, "torch_graph",
    (Target("cugraphrt_torch", "torch_graph", 1.05),
     Target("cugraphrt_torch", "torch_compile", 0.90)),
    run_torch_infer, own=("cugraphrt_torch",))
TORCH_TRAIN = Workload(
    "torch_train", "torch MLP forward + backward; wall time per step", TRAIN_SYSTEMS,
    "torch_graphed", (Target("cugraphrt_torch", "torch_graphed", TRAIN_TARGET),),
    run_torch_train, own=("cugraphrt_torch",))
CAPTURE_TIME = Workload(
    "capture_time", "warm-up + capture + instantiate of the torch_infer / torch_train MLP; "
    "torch = hand-written graph / torch.cuda.make_graphed_callables",
    CAPTURE_SYSTEMS, "torch",
    tuple(Target("cugraphrt_torch", "torch", bound, metric=metric)
          for metric, bound in MLP_CAPTURE_TARGETS.items()),
    run_capture_time, own=("cugraphrt_torch",))

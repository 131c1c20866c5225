"""The ``rebind`` workload: replaying on the call's own buffers against copying them in.

Rows, every system in one interleaved rotation per row, on fresh inputs every call (a
rotation of distinct buffers, so that no system may skip its copy or its rebinding). The
targets are against systems cugraphrt does not build: CuPy's own graph of the same function
plus a copy of each input into its static buffer (``cupy_graph``, the CuPy rows), torch's own
graph plus ``copy_`` (``torch_graph``, the torch row). cugraphrt's own copying path
(``copy``) and the ``allowance`` are information.

* ``host, N pointers`` (N = 1, 8, 64, in one kernel): host µs per call of a graphed CuPy
  function on 1 KiB arrays, every one rebound (``CUGRAPHRT_REBIND_MIN_BYTES=0``).
  ``rebind`` rebinds every call; ``rebind_same`` passes the same arrays again (the argument
  checks every call path pays, no rebinding); ``allowance`` is ``rebind_same + 10 µs`` per
  round ("rebinding costs at most 10 µs of host time", cugraphrt against itself). Targets
  (8 and 64 pointers): rebinding costs the host no more than copying the inputs into a CuPy
  graph's buffers. With one 1 KiB input the copy is one small launch, which no rebinding
  beats on the host: that row has no target.
* ``host, 64 pointers in 64 kernels``: the same, one node per pointer: CUDA's setter costs
  about 1.5 µs a node, so this row has no target (docs/rebinding.md).
* ``256 MiB input``: a bandwidth-bound kernel (``y = 2 x``: one read and one write of 256
  MiB) on a 256 MiB array; wall time per call. A copy in costs a read and a write more, so
  rebinding saves about half the call whatever the chip's bandwidth.
* ResNet-50 b8 fp16 (``graph_module``), a fresh input every call: wall time per call,
  rebind against torch's graph plus ``copy_``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from .real_models import resnet
from .spec import Context, RowBuilder, Target, Workload, cycling_calls, verify
from .timing import device_sync, host_batch, summarize
from .torch_common import HandGraph, adapter_function, on_stream
from .workloads_real import ROTATION, run_torch_rows

__all__ = ["REBIND", "ALLOWANCE_US"]

US = 1e6
#: The host time rebinding may add to a call (the issue's target), in µs.
ALLOWANCE_US = 10.0
HOST_SYSTEMS = ("rebind", "cupy_graph", "allowance", "rebind_same", "copy")
POINTERS = (1, 8, 64)
BIG_MIB = 256
MODEL_SYSTEMS = ("rebind", "copy", "torch_graph")
#: Build order: the reference first. Measured on an H100, of two graphs doing the same work
#: the one captured first read about 0.3% slower on a Llama step (docs/rebinding.md).
ORDER = ("copy", "rebind")
#: The host rows with a target (module docstring).
TARGET_POINTERS = (8, 64)
#: y = 2 x over float4s, grid-stride: a bandwidth-bound kernel for the 256 MiB row.
_DOUBLE = r"""
extern "C" __global__ void cgrt_double4(const float4* x, float4* y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float4 v = x[i];
        y[i] = make_float4(2.f * v.x, 2.f * v.y, 2.f * v.z, 2.f * v.w);
    }
}
"""
_BLOCKS = 4096


def _host_metric(n: int) -> str:
    return f"host, {n} pointer{'s' if n > 1 else ''}"


SPREAD_METRIC = "host, 64 pointers in 64 kernels"
BIG_METRIC = f"{BIG_MIB} MiB input"
RESNET_METRIC = "resnet50 b8 fp16"


def _sum_kernel(cupy, n: int):
    if n == 1:
        return lambda x: x * 2
    names = [f"x{i}" for i in range(n)]
    kernel = cupy.ElementwiseKernel(", ".join(f"T {a}" for a in names), "T y",
                                    "y = " + " + ".join(names), f"cgrt_sum{n}")
    return lambda *xs: kernel(*xs)


def _graphed(fn, sample, inputs: str, every: bool = False):
    """make_graphed; ``every``: rebind inputs of any size (the host rows' arrays are 1 KiB,
    under the size below which inputs are copied by default)."""
    import cugraphrt
    from cugraphrt._callables.rebind import MIN_BYTES_ENV

    before = os.environ.get(MIN_BYTES_ENV)
    if every:
        os.environ[MIN_BYTES_ENV] = "0"
    try:
        return cugraphrt.make_graphed(fn, sample, inputs=inputs)
    finally:
        if before is None:
            os.environ.pop(MIN_BYTES_ENV, None)
        else:
            os.environ[MIN_BYTES_ENV] = before


class CupyGraph:
    """CuPy's own graph of ``fn`` on static buffers: each call copies its arrays into them
    (``cupy.copyto``) and launches the graph, on CuPy's current stream.

    Parameters
    ----------
    cupy : module
    fn : callable
        A function of CuPy arrays.
    sample : tuple of cupy.ndarray
        Copied into the static buffers; ``fn`` ran on them before (kernels compiled).
    """

    def __init__(self, cupy, fn, sample: tuple) -> None:
        self.cupy = cupy
        self.static = tuple(a.copy() for a in sample)
        stream = cupy.cuda.get_current_stream()
        fn(*self.static)  # kernels and plans outside the capture, as CuPy requires
        stream.begin_capture()
        try:
            self.out = fn(*self.static)
        finally:
            self.graph = stream.end_capture()

    def __call__(self, *args):
        copyto = self.cupy.copyto
        for static, value in zip(self.static, args, strict=True):
            copyto(static, value)
        self.graph.launch()
        return self.out


def _host_row(ctx: Context, cupy, metric: str, fn, count: int, size: int) -> RowBuilder:
    systems = HOST_SYSTEMS if metric != SPREAD_METRIC else ("rebind", "cupy_graph",
                                                             "rebind_same", "copy")
    row = RowBuilder(metric, "us", systems, "cupy_graph", "rebind")
    fresh = [tuple(cupy.random.rand(size, dtype=cupy.float32) for _ in range(count))
             for _ in range(ROTATION)]
    sample = tuple(a.copy() for a in fresh[0])
    calls = 200
    stream = cupy.cuda.Stream(non_blocking=True)
    batches: dict[str, Callable[[], float] | None] = {}
    with stream:
        for system, mode, inputs in (("rebind", "rebind", fresh), ("copy", "copy", fresh),
                                     ("rebind_same", "rebind", [sample]),
                                     ("cupy_graph", None, fresh)):
            f = row.setup(system, functools.partial(CupyGraph, cupy, fn, sample) if mode is None
                          else functools.partial(_graphed, fn, sample, mode, True))
            if f is None or (mode == "rebind" and not f.rebinding.complete):
                if f is not None:
                    row.unavailable(system, f.rebinding.explain([])[:200])
                batches[system] = None
                continue
            expected = [fn(*args) for args in inputs[:2]]
            ok = verify(row, system, functools.partial(_check_cupy, cupy, f, inputs[:2],
                                                      expected))
            batches[system] = functools.partial(
                _on, stream, functools.partial(host_batch, cycling_calls(f, inputs), calls,
                                               include_sync=True)) if ok else None
    row.measure(batches, ctx.repeats(full=60, quick=15), scale=US)
    same = row.row.cells.get("rebind_same")
    if "allowance" in systems and same is not None and hasattr(same, "samples"):
        row.set("allowance", summarize([v + ALLOWANCE_US for v in same.samples]))
    return row


def _on(stream, batch):
    with stream:
        return batch()


def _check_cupy(cupy, f, inputs, expected) -> None:
    for args, want in zip(inputs, expected, strict=True):
        got = f(*args)
        pairs = zip(got, want, strict=True) if isinstance(want, list) else [(got, want)]
        for g, w in pairs:
            cupy.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _big_row(ctx: Context, cupy) -> RowBuilder:
    row = RowBuilder(BIG_METRIC, "us", ("rebind", "cupy_graph", "copy"), "cupy_graph",
                     "rebind")
    count = BIG_MIB * (1 << 20) // 4
    arrays = [cupy.random.rand(count, dtype=cupy.float32) for _ in range(3)]
    sample = arrays[0].copy()
    kernel = cupy.RawKernel(_DOUBLE, "cgrt_double4")

    def fn(x):
        # One read and one write of the input's bytes at the copy engine's pace (16-byte
        # loads): the kernel costs about what the copy in costs, on any chip.
        y = cupy.empty_like(x)
        kernel((_BLOCKS,), (256,), (x, y, cupy.int64(x.size // 4)))
        return y

    batches: dict[str, Callable[[], float] | None] = {}
    stream = cupy.cuda.Stream(non_blocking=True)  # CuPy captures only on a non-default one
    with stream:
        for system in ("rebind", "copy", "cupy_graph"):
            make = (functools.partial(CupyGraph, cupy, fn, (sample,)) if system == "cupy_graph"
                    else functools.partial(_graphed, fn, (sample,), system))
            f = row.setup(system, make)
            ok = f is not None and verify(row, system, functools.partial(
                _check_cupy, cupy, f, [(arrays[1],)], [fn(arrays[1])]))
            batches[system] = functools.partial(_on, stream, functools.partial(
                host_batch, cycling_calls(f, [(a,) for a in arrays]), 20,
                include_sync=True)) if ok else None
    row.measure(batches, ctx.repeats(full=30, quick=8), scale=US)
    del arrays, sample
    return row


def run_rebind(ctx: Context) -> None:
    """Host rows, the 256 MiB row, then ResNet-50 and the Llama decode step (torch)."""
    import cupy

    for n in POINTERS:
        ctx.step(f"host: {n} pointers")
        ctx.emit(_host_row(ctx, cupy, _host_metric(n), _sum_kernel(cupy, n), n, 256).build())
    ctx.step("host: 64 kernels")
    ctx.emit(_host_row(ctx, cupy, SPREAD_METRIC, lambda *xs: [x * 2 for x in xs], 64,
                       256).build())
    ctx.step("256 MiB")
    ctx.emit(_big_row(ctx, cupy).build())
    _model_rows(ctx)


def _model_rows(ctx: Context) -> None:
    layout = {RESNET_METRIC: ("us", MODEL_SYSTEMS, "torch_graph")}
    run_torch_rows(ctx, layout, ("torchvision",), False, _model_body, subject="rebind")


def _model_body(ctx: Context, torch, rows: dict[str, RowBuilder]) -> None:
    ctx.step("resnet50")
    _resnet(ctx, torch, rows[RESNET_METRIC])


def _module_systems(torch, row: RowBuilder, module, sample: tuple, eager: Callable,
                    check: Callable[[str, Callable], None],
                    before: Callable[[], None] = device_sync) -> dict[str, Any]:
    """Build and check each system; ``before`` runs before each build (a decode step's
    StaticCache counts its own position: warm-ups and captures advance it)."""
    graph_module = adapter_function("graph_module")
    calls: dict[str, Any] = {}
    for mode in ORDER:
        before()
        calls[mode] = row.setup(mode, functools.partial(
            graph_module, module, tuple(t.clone() for t in sample), inputs=mode))
        if (mode == "rebind" and calls[mode] is not None
                and not calls[mode].rebinding.complete):
            row.unavailable(mode, calls[mode].rebinding.explain([])[:200])
            calls[mode] = None
    before()
    hand = row.setup("torch_graph", lambda: HandGraph(torch, eager, *sample))
    calls["torch_graph"] = hand
    return {system: fn for system, fn in calls.items()
            if fn is not None and verify(row, system, functools.partial(check, system, fn))}


def _time_module(ctx: Context, row: RowBuilder, calls: dict[str, Any], inputs: list[tuple],
                 before: Callable[[], None] = device_sync) -> None:
    def batch(fn) -> float:
        before()
        return host_batch(cycling_calls(fn, inputs), ROTATION,
                          include_sync=True)

    row.measure({s: functools.partial(batch, calls[s]) if s in calls else None
                 for s in MODEL_SYSTEMS}, ctx.repeats(full=30, quick=8), scale=US)


def _resnet(ctx: Context, torch, row: RowBuilder) -> None:
    import numpy

    net = resnet(torch, "resnet50").half().eval()
    inputs = [(torch.randn(8, 3, 224, 224, device="cuda", dtype=torch.float16),)
              for _ in range(ROTATION)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), on_stream(torch, stream):
        net(*inputs[0])
        expected = net(*inputs[1]).float().cpu().numpy()

        def check(system: str, call) -> None:
            got = call(*inputs[1]).float().cpu().numpy()
            if not numpy.array_equal(got, expected):
                raise RuntimeError(f"{system} differs from eager (max abs "
                                   f"{float(numpy.abs(got - expected).max())})")

        calls = _module_systems(torch, row, net, inputs[0], net, check)
        _time_module(ctx, row, calls, inputs)


# A Llama decode step's inputs (a token and a position, 8 bytes each) were a row here until
# issue 51: below the 1 MiB default both systems copied them, so the row compared capture
# order; rebound, every node that reads the position (dozens) would be patched per call to
# save a 16-byte copy. Nothing there measures rebinding.
REBIND = Workload(
    "rebind", "replay on the call's own input buffers (inputs='rebind') against a graph of "
    "CuPy or torch plus a copy into its buffers: host cost of rebinding N pointers, a 256 MiB "
    "input, ResNet-50 b8 with a fresh input every call",
    ("rebind", "cupy_graph", "allowance", "rebind_same", "copy", "torch_graph"), "cupy_graph",
    (*(Target("rebind", "cupy_graph", 1.00, metric=_host_metric(n)) for n in TARGET_POINTERS),
     Target("rebind", "cupy_graph", 0.60, metric=BIG_METRIC),
     Target("rebind", "torch_graph", 1.00, metric=RESNET_METRIC)),
    run_rebind, own=("rebind", "allowance", "rebind_same", "copy"))

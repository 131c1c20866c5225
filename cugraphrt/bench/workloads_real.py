"""Real-model inference workloads: torchvision ResNet-50 and a Hugging Face Llama decode step.

Every system of a workload runs in this process, on one torch side stream, on the same
model: eager, the hand-written ``torch.cuda.CUDAGraph`` of the PyTorch docs (the anchor) and
cugraphrt_torch (``graph_module`` for ResNet-50, ``cugraphrt_torch.graph`` for the decode
step). Rows: wall time per call with copy-in (and ``gpu_floor``, events around replays of
cugraphrt's graph alone, back to back), warm-ups + capture + instantiate, and the memory the
graph's pool keeps. Each graphed system is checked against eager before it is timed. The
cells read ``n/a (torchvision not installed)`` and the like where a package is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .real_models import LlamaDecoder, equal_steps, missing_package, resnet
from .spec import (
    Context,
    RowBuilder,
    SystemUnavailable,
    Target,
    Workload,
    check_close,
    cycling_calls,
    prepared,
    verify,
)
from .timing import device_sync, gpu_batch, host_batch, single
from .torch_common import (
    CAPTURE_BUILDS,
    CAPTURE_TARGET,
    WARMUP_ITERS,
    AdapterGraph,
    HandGraph,
    adapter_function,
    capture_batch,
    on_stream,
    release_torch,
    reserved_growth,
    torch_module,
)

__all__ = ["REAL_RESNET50", "REAL_LLAMA", "skip_reason", "rows_of", "emit_all",
           "run_torch_rows", "US", "MS", "MiB", "ROTATION", "PER_CALL", "CAPTURE", "MEMORY"]

US, MS, MiB = 1e6, 1e3, float(1 << 20)
ROTATION = 8
PER_CALL, CAPTURE, MEMORY = "per call", "capture + warm-ups", "pool reserved"
SYSTEMS = ("torch_eager", "torch_graph", "cugraphrt_torch", "gpu_floor")
GRAPHS = ("torch_graph", "cugraphrt_torch")
RESNET_BATCH = 8
#: fp16 outputs of the same kernels: a wrong or stale replay is off by far more.
RESNET_TOL = 1e-2
DECODE_STEPS = 32


def skip_reason(ctx: Context, *packages: str, in_quick: bool) -> str | None:
    """Why a real-model workload does not run here, or None.

    A missing package; or ``--quick`` for a workload too slow for it (``in_quick`` False)
    that the command line did not name (``--real``, ``--only``).
    """
    missing = missing_package(*packages)
    if missing is not None:
        return missing
    if ctx.quick and not in_quick and not ctx.selected:
        return "skipped in --quick (run --real)"
    return None


def rows_of(layout: dict[str, tuple[str, tuple[str, ...], str]], subject: str
            ) -> dict[str, RowBuilder]:
    """RowBuilders from ``{metric: (unit, systems, reference)}``, all with ``subject``."""
    return {metric: RowBuilder(metric, unit, systems, reference, subject)
            for metric, (unit, systems, reference) in layout.items()}


def emit_all(ctx: Context, rows: dict[str, RowBuilder], reason: str | None = None) -> None:
    """Emit ``rows``; with a ``reason``, every cell not set yet is n/a for it."""
    for row in rows.values():
        if reason is not None:
            row.unavailable_all(reason)
        ctx.emit(row.build())


def _inference_layout(metric: str) -> dict[str, tuple[str, tuple[str, ...], str]]:
    return {metric: ("us", SYSTEMS, "torch_graph"), CAPTURE: ("ms", GRAPHS, "torch_graph"),
            MEMORY: ("MiB", GRAPHS, "torch_graph")}


def run_torch_rows(ctx: Context, layout, packages: tuple[str, ...], in_quick: bool,
         body: Callable[[Context, Any, dict[str, RowBuilder]], None],
         subject: str = "cugraphrt_torch") -> None:
    """Rows from ``layout``; ``body(ctx, torch, rows)`` fills them unless the workload is
    skipped. Rows are emitted even when ``body`` raises."""
    rows = rows_of(layout, subject)
    reason = skip_reason(ctx, "torch", *packages, in_quick=in_quick)
    if reason is not None:
        emit_all(ctx, rows, reason)
        return
    try:
        torch = torch_module()
    except SystemUnavailable as exc:
        emit_all(ctx, rows, str(exc))
        return
    try:
        body(ctx, torch, rows)
    finally:
        emit_all(ctx, rows)
        release_torch(torch)


# -- inference, common to both models ------------------------------------------------------


@dataclass(frozen=True)
class _Inference:
    """One model's inference call and how cugraphrt_torch graphs it.

    Attributes
    ----------
    metric : str
        The per-call row.
    eager : callable
        ``eager(*args)``: the call itself (what torch_graph captures too).
    inputs : list of tuple
        Argument tuples, cycled through by the timed calls; the first is the sample.
    ours : callable
        ``ours(sample)``: the cugraphrt_torch system, a callable with a ``graph``.
    check : callable
        ``check(system, call)`` raises unless ``call`` computes what ``eager`` does.
    calls : int
        Calls per timed batch.
    before_batch : callable
        Runs before every timed batch and every timed build, outside the clock: a decode
        step advances the StaticCache's own position counter, which must be rewound before
        it runs past the cache's end.
    """

    metric: str
    eager: Callable[..., Any]
    inputs: list[tuple]
    ours: Callable[[tuple], Any]
    check: Callable[[str, Callable[..., Any]], None]
    calls: int
    before_batch: Callable[[], None] = device_sync


def _measure_inference(ctx: Context, torch, stream, model: _Inference,
                       rows: dict[str, RowBuilder]) -> None:
    """Build both graphs, check them, time the calls, then time the builds."""
    per_call, memory = rows[model.metric], rows[MEMORY]
    sample = model.inputs[0]
    ctx.step(f"{model.metric}: capture")
    hand = per_call.setup("torch_graph", lambda: reserved_growth(
        torch, lambda: HandGraph(torch, model.eager, *sample)))
    ours = per_call.setup("cugraphrt_torch", lambda: model.ours(sample))
    calls_of = {"torch_eager": model.eager, "torch_graph": hand[0] if hand else None,
                "cugraphrt_torch": ours}
    if hand is not None:
        memory.set("torch_graph", single(hand[1] / MiB))
    if ours is not None:
        memory.set("cugraphrt_torch", single(ours.graph.pool().stats().reserved_bytes / MiB))
    batches: dict[str, Callable[[], float] | None] = {}
    for system, fn in calls_of.items():
        checked = fn is not None and (system == "torch_eager" or verify(
            per_call, system, functools.partial(model.check, system, fn)))
        batches[system] = prepared(model.before_batch, functools.partial(
            host_batch, cycling_calls(fn, model.inputs), model.calls,
            include_sync=True)) if checked else None
    if batches["cugraphrt_torch"] is None:
        per_call.unavailable("gpu_floor", "needs the cugraphrt_torch graph")
    else:
        batches["gpu_floor"] = prepared(model.before_batch, functools.partial(
            gpu_batch, ours.graph.replay, model.calls, stream.cuda_stream))
    ctx.step(f"{model.metric}: measure")
    per_call.measure(batches, ctx.repeats(full=20, quick=5), scale=US)
    del hand, ours, calls_of, batches
    ctx.step(f"{model.metric}: capture time")
    builds = {"torch_graph": lambda _: HandGraph(torch, model.eager, *sample),
              "cugraphrt_torch": lambda _: model.ours(sample)}
    rows[CAPTURE].measure({system: functools.partial(capture_batch, torch, model.before_batch,
                                                     build)
                           for system, build in builds.items()},
                          CAPTURE_BUILDS, scale=MS, warmup=1)


# -- real_resnet50 -------------------------------------------------------------------------

RESNET_METRIC = f"{PER_CALL} fp16 b{RESNET_BATCH}"


def run_resnet50(ctx: Context) -> None:
    """torchvision ResNet-50 inference, fp16, batch 8: eager, hand graph, graph_module."""
    run_torch_rows(ctx, _inference_layout(RESNET_METRIC), ("torchvision",), True, _resnet50_rows)


def _resnet50_rows(ctx: Context, torch, rows: dict[str, RowBuilder]) -> None:
    net = resnet(torch, "resnet50").half().eval()
    inputs = [(torch.randn(RESNET_BATCH, 3, 224, 224, device="cuda", dtype=torch.float16),)
              for _ in range(ROTATION)]
    graph_module = adapter_function("graph_module")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), on_stream(torch, stream):
        net(*inputs[0])  # cuDNN handles and kernels, outside every system's time
        expected = net(*inputs[1]).float().cpu().numpy()

        def check(system: str, call) -> None:
            check_close(call(*inputs[1]).float().cpu().numpy(), expected, system, RESNET_TOL)

        model = _Inference(
            RESNET_METRIC, net, inputs,
            lambda sample: graph_module(net, tuple(t.clone() for t in sample),
                                        num_warmup_iters=WARMUP_ITERS),
            check, calls=ROTATION)
        _measure_inference(ctx, torch, stream, model, rows)


# -- real_llama ----------------------------------------------------------------------------

LLAMA_METRIC = f"{PER_CALL} decode step"
TOKENS = "tokens equal to eager"


def run_llama(ctx: Context) -> None:
    """A LlamaForCausalLM decode step: eager, hand graph, cugraphrt_torch.graph."""
    layout = {**_inference_layout(LLAMA_METRIC),
              TOKENS: ("steps", SYSTEMS[:3], "torch_eager")}
    run_torch_rows(ctx, layout, ("transformers",), False, _llama_rows)


def _llama_rows(ctx: Context, torch, rows: dict[str, RowBuilder]) -> None:
    ctx.step("build the model")
    decoder = LlamaDecoder(torch, DECODE_STEPS)
    vocab = decoder.config.vocab_size
    inputs = [(torch.randint(0, vocab, (1, 1), device="cuda"), decoder.step_args(i)[1])
              for i in range(ROTATION)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), on_stream(torch, stream):
        decoder.generate(decoder.step)  # kernels and handles, outside every system's time
        expected = decoder.generate(decoder.step)[0]
        rows[TOKENS].set("torch_eager", single(float(DECODE_STEPS)))

        def check(system: str, call) -> None:
            same = equal_steps(decoder.generate(call)[0], expected)
            rows[TOKENS].set(system, single(float(same)))
            if same < DECODE_STEPS:
                raise RuntimeError(f"greedy tokens differ from eager's from decode step "
                                   f"{same + 1} of {DECODE_STEPS} on")

        def rewind() -> None:
            decoder.cache.reset()
            torch.cuda.synchronize()

        model = _Inference(LLAMA_METRIC, decoder.step, inputs,
                           lambda sample: AdapterGraph(torch, decoder.step, *sample),
                           check, calls=ROTATION, before_batch=rewind)
        _measure_inference(ctx, torch, stream, model, rows)


# -- the workloads -------------------------------------------------------------------------

REAL_RESNET50 = Workload(
    "real_resnet50", f"torchvision ResNet-50 inference, fp16, batch {RESNET_BATCH}, random "
    f"weights: wall time per call with copy-in; gpu_floor = events around cugraphrt's replays",
    SYSTEMS, "torch_graph",
    (Target("cugraphrt_torch", "torch_graph", 1.05, metric=RESNET_METRIC),
     Target("cugraphrt_torch", "torch_graph", CAPTURE_TARGET, metric=CAPTURE)),
    run_resnet50, own=("cugraphrt_torch", "gpu_floor"))
REAL_LLAMA = Workload(
    "real_llama", f"LlamaForCausalLM from a config (12 layers, hidden 1024, bf16, StaticCache): "
    f"greedy decode step, cugraphrt_torch.graph; tokens checked over {DECODE_STEPS} steps",
    SYSTEMS, "torch_graph",
    (Target("cugraphrt_torch", "torch_graph", 1.05, metric=LLAMA_METRIC),
     Target("cugraphrt_torch", "torch_graph", CAPTURE_TARGET, metric=CAPTURE)),
    run_llama, own=("cugraphrt_torch", "gpu_floor"))

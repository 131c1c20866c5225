"""Real-model workloads for torch.compile: a Hugging Face Llama decode step and ResNet-50.

Each system runs in a process of its own (``python -m cugraphrt.bench.workloads_compile
WORKLOAD SYSTEM``): a compiler fault or a segmentation fault then costs one cell, not the
run, and each process's memory is its system's alone. The processes set up one after the
other and are then timed round by round, interleaved like every other workload (see
:mod:`cugraphrt.bench.children`). Skipped in ``--quick`` (select them with ``--only
hf_decode`` / ``--only resnet50``); n/a where transformers or torchvision is missing.
"""

from __future__ import annotations

import sys
import time

from . import children
from .real_models import LlamaDecoder, equal_steps, missing_package, resnet
from .spec import Context, RowBuilder, Target, Workload
from .timing import summarize
from .torch_common import HandGraph

__all__ = ["HF_DECODE", "RESNET50"]

# torch_inductor (default mode, no CUDA graphs) shows what Inductor's numerics alone do to
# the tokens.
SYSTEMS = ("torch_eager", "torch_graph", "torch_inductor", "torch_compile", "torch_cudagraphs",
           "cugraphrt_compile")
# The decode step adds three ways to keep eager's tokens: the backend over AOTAutograd alone
# (eager's kernels, replayed); Inductor with eager's own kernels for reductions and math
# functions and its fusions elsewhere (``eager_numerics="exact"``: eager's bits); and
# Inductor told to round low-precision values where eager does (``eager_numerics=True``),
# which keeps all its fusions but not always eager's bits.
DECODE_SYSTEMS = (*SYSTEMS, "cugraphrt_aot_eager", "cugraphrt_exact", "cugraphrt_rounded")
DECODE_STEPS = 64
_SAME_TOKENS = "same as eager"  # the decode rows' token agreement; error for images
_SAME_AS_COMPILE = "same as torch_compile"  # decode: tokens equal to torch.compile's
_REPEATS = 5


# -- the child process: one system of one workload -----------------------------------------
def _compile(torch, fn, system: str):
    if system == "torch_inductor":
        return torch.compile(fn)
    if system == "torch_compile":
        return torch.compile(fn, mode="reduce-overhead")
    if system == "torch_cudagraphs":
        return torch.compile(fn, backend="cudagraphs")
    if system == "cugraphrt_aot_eager":
        return torch.compile(fn, backend="cugraphrt", options={"compiler": "aot_eager"})
    if system == "cugraphrt_exact":
        return torch.compile(fn, backend="cugraphrt", options={"eager_numerics": "exact"})
    if system == "cugraphrt_rounded":
        return torch.compile(fn, backend="cugraphrt", options={"eager_numerics": True})
    return torch.compile(fn, backend="cugraphrt")


def _decode_child(torch, system: str):
    """Set up one decode system: its report and a sample (seconds per decode step)."""
    decoder = LlamaDecoder(torch, DECODE_STEPS)
    # Kernels and handles: eager's one-time costs, billed to no system.
    decoder.generate(decoder.step)
    begin = time.perf_counter()
    run = (decoder.step if system == "torch_eager" else
           HandGraph(torch, decoder.step, *decoder.step_args())
           if system == "torch_graph" else _compile(torch, decoder.step, system))
    tokens, _ = decoder.generate(run)
    setup_s = time.perf_counter() - begin
    return {"tokens": tokens, "setup_s": setup_s}, lambda: decoder.generate(run)[1]


def _resnet_child(torch, system: str):
    """Set up one ResNet-50 system: its report and a sample (seconds per call, 20 calls)."""
    model = resnet(torch, "resnet50").eval()
    inputs = [torch.randn(16, 3, 224, 224, device="cuda") for _ in range(4)]
    expected = model(inputs[1]).float()
    begin = time.perf_counter()
    run = (model if system == "torch_eager" else HandGraph(torch, model, inputs[0])
           if system == "torch_graph" else _compile(torch, model, system))
    for x in inputs[:3]:
        run(x)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - begin
    error = float((run(inputs[1]).float() - expected).norm() / expected.norm())

    def sample() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(20):
            run(inputs[i % 4])
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / 20

    return {"error": error, "setup_s": setup_s}, sample


def _child(workload: str, system: str) -> None:
    import cupy
    import torch

    torch.set_grad_enabled(False)
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    info, sample = (_decode_child if workload == "hf_decode" else _resnet_child)(torch, system)
    torch.cuda.synchronize()
    # Measured before the next system's process starts: the delta is this system's alone.
    info["memory_bytes"] = free_before - cupy.cuda.runtime.memGetInfo()[0]
    children.serve(info, sample)


# -- the parent: rows -----------------------------------------------------------------------
def _command(workload: str, system: str) -> list[str]:
    return [sys.executable, "-m", "cugraphrt.bench.workloads_compile", workload, system]


def _run(ctx: Context, workload: str, package: str, systems: tuple[str, ...]) -> None:
    metrics = [("step", "us"), ("compile + capture", "s"), ("memory", "MiB"),
               (_SAME_TOKENS, "steps" if workload == "hf_decode" else "err")]
    if workload == "hf_decode":
        metrics.append((_SAME_AS_COMPILE, "steps"))
    rows = {name: RowBuilder(name, unit, systems, "torch_graph", "cugraphrt_compile")
            for name, unit in metrics}
    missing = missing_package("torch", package)
    if ctx.quick or missing:
        for row in rows.values():
            row.unavailable_all(missing or f"skipped in --quick (run --only {workload})")
            ctx.emit(row.build())
        return
    results = children.run_interleaved(
        {system: _command(workload, system) for system in systems}, _REPEATS,
        on_error=rows["step"].fail, step=lambda detail: ctx.step(f"{workload}: {detail}"))
    for system in systems:
        if system not in results:
            for row in list(rows.values())[1:]:
                row.unavailable(system, "the system failed (see the step row)")
    eager, compiled = results.get("torch_eager"), results.get("torch_compile")
    for system, result in results.items():
        info = result.info
        rows[_SAME_TOKENS].set(system, summarize([_agreement(info, eager)]))
        if _SAME_AS_COMPILE in rows:
            if compiled is None:
                rows[_SAME_AS_COMPILE].unavailable(system, "needs torch_compile's tokens")
            else:
                rows[_SAME_AS_COMPILE].set(system, summarize([_agreement(info, compiled)]))
        if not _same_as_eager(rows["step"], system, info):
            continue
        rows["step"].set(system, summarize(result.samples).scaled(1e6))
        rows["compile + capture"].set(system, summarize([info["setup_s"]]))
        rows["memory"].set(system, summarize([info["memory_bytes"] / 2**20]))
    for row in rows.values():
        ctx.emit(row.build())


def _same_as_eager(row: RowBuilder, system: str, result: dict) -> bool:
    # Decode tokens are compared in their own row: Inductor's bf16 rounding alone can flip
    # an argmax of random weights (torch_inductor shows it), which says nothing of timing.
    if "error" in result and result["error"] > 2e-2:
        row.fail(system, RuntimeError(f"output differs from eager (relative error "
                                      f"{result['error']:.1e})"))
        return False
    return True


def _agreement(info: dict, reference: children.ChildResult | None) -> float:
    """Decode: leading tokens equal to ``reference``'s; images: relative error to eager."""
    if "tokens" not in info:
        return info["error"]
    if reference is None:
        return 0.0
    return float(equal_steps(info["tokens"], reference.info["tokens"]))


# Token targets compare like numerics: the default backend keeps Inductor's (as every
# torch.compile mode does), so its tokens are held to torch.compile's; eager_numerics
# ("exact" and True) and the aot_eager compiler keep eager's, so theirs are held to eager's.
# Step targets against torch_compile: the same Inductor kernels replayed, so parity (1.02x),
# not a gain; a step bound by its kernels cannot beat them by replaying them differently.
# The exact step runs eager's kernels for every reduction: no target against torch_compile,
# whose reductions are fused, only against the hand graph of eager's kernels.
_TARGETS = (Target("cugraphrt_compile", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_compile", "torch_compile", 1.02, metric="step"),
            Target("cugraphrt_compile", "torch_compile", 1.0, "at_least",
                   metric=_SAME_AS_COMPILE),
            Target("cugraphrt_aot_eager", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_aot_eager", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS),
            Target("cugraphrt_exact", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_exact", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS),
            Target("cugraphrt_rounded", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_rounded", "torch_compile", 1.02, metric="step"),
            Target("cugraphrt_rounded", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS))
HF_DECODE = Workload(
    "hf_decode", f"LlamaForCausalLM (12 layers, bf16, random weights, StaticCache): greedy "
    f"decode step, tokens checked against eager over {DECODE_STEPS} steps; one process per "
    f"system; cugraphrt_exact: options eager_numerics='exact', cugraphrt_rounded: "
    f"eager_numerics=True", DECODE_SYSTEMS,
    "torch_graph", _TARGETS, lambda ctx: _run(ctx, "hf_decode", "transformers", DECODE_SYSTEMS),
    own=DECODE_SYSTEMS[len(SYSTEMS) - 1:])
RESNET50 = Workload(
    "resnet50", "torchvision ResNet-50 inference, batch 16, fp32; wall time per call with "
    "copy-in; one process per system", SYSTEMS, "torch_graph",
    (Target("cugraphrt_compile", "torch_compile", 1.00, metric="step"),),
    lambda ctx: _run(ctx, "resnet50", "torchvision", SYSTEMS), own=("cugraphrt_compile",))

if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])

"""Real-model workloads for torch.compile: a Hugging Face Llama decode step and ResNet-50.

Each system runs in a process of its own (``python -m cugraphrt.bench.workloads_compile
WORKLOAD SYSTEM``), which prints one JSON line: a compiler fault or a segmentation fault then
costs one cell, not the run, and each process's memory is its system's alone. Skipped in
``--quick`` (select them with ``--only hf_decode`` / ``--only resnet50``); n/a where
transformers or torchvision is missing.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time

from .real_models import LlamaDecoder, equal_steps, missing_package, resnet
from .spec import Context, RowBuilder, Target, Workload
from .timing import summarize
from .torch_common import HandGraph

__all__ = ["HF_DECODE", "RESNET50"]

# torch_inductor (default mode, no CUDA graphs) shows what Inductor's numerics alone do to
# the tokens.
SYSTEMS = ("torch_eager", "torch_graph", "torch_inductor", "torch_compile", "torch_cudagraphs",
           "cugraphrt_compile")
# The decode step adds two ways to keep eager's tokens: the backend over AOTAutograd alone
# (eager's kernels, replayed), and Inductor told to round low-precision values where eager
# does (the backend's ``eager_numerics`` option), which keeps its fusions.
DECODE_SYSTEMS = (*SYSTEMS, "cugraphrt_aot_eager", "cugraphrt_exact")
DECODE_STEPS = 64
_SAME_TOKENS = "same as eager"  # the decode rows' token agreement; error for images
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
        return torch.compile(fn, backend="cugraphrt", options={"eager_numerics": True})
    return torch.compile(fn, backend="cugraphrt")


def _decode_child(torch, system: str) -> dict:
    decoder = LlamaDecoder(torch, DECODE_STEPS)
    with torch.no_grad():
        # Kernels and handles: eager's one-time costs, billed to no system.
        decoder.generate(decoder.step)
        begin = time.perf_counter()
        run = (decoder.step if system == "torch_eager" else
               HandGraph(torch, decoder.step, *decoder.step_args())
               if system == "torch_graph" else _compile(torch, decoder.step, system))
        tokens, _ = decoder.generate(run)
        setup_s = time.perf_counter() - begin
        steps = [decoder.generate(run)[1] for _ in range(_REPEATS)]
    return {"tokens": tokens, "step_s": steps, "setup_s": setup_s}


def _resnet_child(torch, system: str) -> dict:
    model = resnet(torch, "resnet50").eval()
    inputs = [torch.randn(16, 3, 224, 224, device="cuda") for _ in range(4)]
    with torch.no_grad():
        expected = model(inputs[1]).float()
        begin = time.perf_counter()
        run = (model if system == "torch_eager" else HandGraph(torch, model, inputs[0])
               if system == "torch_graph" else _compile(torch, model, system))
        for x in inputs[:3]:
            run(x)
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - begin
        error = float((run(inputs[1]).float() - expected).norm() / expected.norm())
        samples = []
        for _ in range(_REPEATS):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(20):
                run(inputs[i % 4])
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) / 20)
    return {"error": error, "step_s": samples, "setup_s": setup_s}


def _child(workload: str, system: str) -> None:
    import cupy
    import torch

    free_before = cupy.cuda.runtime.memGetInfo()[0] if torch.cuda.is_available() else 0
    result = (_decode_child if workload == "hf_decode" else _resnet_child)(torch, system)
    torch.cuda.synchronize()
    result["memory_bytes"] = free_before - cupy.cuda.runtime.memGetInfo()[0]
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: rows -----------------------------------------------------------------------
def _run_system(workload: str, system: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cugraphrt.bench.workloads_compile", workload,
                           system], capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    print(f"cugraphrt bench: {workload}/{system} failed:\n{done.stderr[-3000:]}",
          file=sys.stderr)
    raise RuntimeError(f"{system} exited with status {done.returncode}: {tail}")


def _run(ctx: Context, workload: str, package: str, systems: tuple[str, ...]) -> None:
    rows = {name: RowBuilder(name, unit, systems, "torch_graph", "cugraphrt_compile")
            for name, unit in (("step", "us"), ("compile + capture", "s"), ("memory", "MiB"),
                               (_SAME_TOKENS, "steps" if workload == "hf_decode" else "err"))}
    missing = missing_package("torch", package)
    if ctx.quick or missing:
        for row in rows.values():
            row.unavailable_all(missing or f"skipped in --quick (run --only {workload})")
            ctx.emit(row.build())
        return
    results: dict[str, dict | None] = {}
    for system in systems:
        ctx.step(f"{workload}: {system}")
        results[system] = rows["step"].setup(system, functools.partial(_run_system, workload,
                                                                       system))
    eager = results.get("torch_eager")
    for system, result in results.items():
        if result is None:
            for row in list(rows.values())[1:]:
                row.unavailable(system, "the system failed (see the step row)")
            continue
        rows[_SAME_TOKENS].set(system, summarize([_agreement(result, eager)]))
        if not _same_as_eager(rows["step"], system, result, eager):
            continue
        rows["step"].set(system, summarize(result["step_s"]).scaled(1e6))
        rows["compile + capture"].set(system, summarize([result["setup_s"]]))
        rows["memory"].set(system, summarize([result["memory_bytes"] / 2**20]))
    for row in rows.values():
        ctx.emit(row.build())


def _same_as_eager(row: RowBuilder, system: str, result: dict, eager: dict | None) -> bool:
    # Decode tokens are compared in their own row: Inductor's bf16 rounding alone can flip
    # an argmax of random weights (torch_inductor shows it), which says nothing of timing.
    if "error" in result and result["error"] > 2e-2:
        row.fail(system, RuntimeError(f"output differs from eager (relative error "
                                      f"{result['error']:.1e})"))
        return False
    return True


def _agreement(result: dict, eager: dict | None) -> float:
    """Decode: leading tokens equal to eager's; images: relative error against eager."""
    if "tokens" not in result:
        return result["error"]
    if eager is None:
        return 0.0
    return float(equal_steps(result["tokens"], eager["tokens"]))


_TARGETS = (Target("cugraphrt_compile", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_compile", "torch_compile", 0.90, metric="step"),
            Target("cugraphrt_compile", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS),
            Target("cugraphrt_aot_eager", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_aot_eager", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS),
            Target("cugraphrt_exact", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_exact", "torch_compile", 0.90, metric="step"),
            Target("cugraphrt_exact", "torch_eager", 1.0, "at_least", metric=_SAME_TOKENS))
HF_DECODE = Workload(
    "hf_decode", f"LlamaForCausalLM (12 layers, bf16, random weights, StaticCache): greedy "
    f"decode step, tokens checked against eager over {DECODE_STEPS} steps; one process per "
    f"system; cugraphrt_exact: options eager_numerics=True", DECODE_SYSTEMS,
    "torch_graph", _TARGETS, lambda ctx: _run(ctx, "hf_decode", "transformers", DECODE_SYSTEMS))
RESNET50 = Workload(
    "resnet50", "torchvision ResNet-50 inference, batch 16, fp32; wall time per call with "
    "copy-in; one process per system", SYSTEMS, "torch_graph",
    (Target("cugraphrt_compile", "torch_compile", 1.00, metric="step"),),
    lambda ctx: _run(ctx, "resnet50", "torchvision", SYSTEMS))

if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])

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

from .spec import Context, RowBuilder, Target, Workload
from .timing import summarize

__all__ = ["HF_DECODE", "RESNET50", "llama"]

# torch_inductor (default mode, no CUDA graphs) shows what Inductor's numerics alone do to
# the tokens.
SYSTEMS = ("torch_eager", "torch_graph", "torch_inductor", "torch_compile", "torch_cudagraphs",
           "cugraphrt_compile")
DECODE_STEPS = 64
_REPEATS = 5


# -- the child process: one system of one workload -----------------------------------------
def _compile(torch, fn, system: str):
    if system == "torch_inductor":
        return torch.compile(fn)
    if system == "torch_compile":
        return torch.compile(fn, mode="reduce-overhead")
    if system == "torch_cudagraphs":
        return torch.compile(fn, backend="cudagraphs")
    return torch.compile(fn, backend="cugraphrt")


class _HandGraph:
    """``fn`` captured by hand with torch.cuda.CUDAGraph; static inputs copied in."""

    def __init__(self, torch, fn, *args):
        self.torch, self.static = torch, [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.static)

    def __call__(self, *args):
        for static, value in zip(self.static, args, strict=True):
            static.copy_(value)
        self.graph.replay()
        return self.out


def llama(torch, batch: int, prompt_len: int, max_cache_len: int, *, layers: int = 12,
          hidden: int = 1024):
    """The decode workloads' model: a LlamaForCausalLM from a config (bf16, random weights
    from seed 0, 64-wide heads), random prompts of shape (batch, prompt_len) and a
    StaticCache of ``max_cache_len`` positions. Returns (config, model, prompt, cache)."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    torch.manual_seed(0)
    heads = hidden // 64
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden,
                         intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=512)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len), device="cuda")
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    return config, model, prompt, cache


def _decode_child(torch, system: str) -> dict:
    length = 16 + DECODE_STEPS + 8
    _, model, prompt, cache = llama(torch, batch=1, prompt_len=16, max_cache_len=length)
    positions = torch.arange(length, device="cuda")

    def step(token, position):
        logits = model(input_ids=token, past_key_values=cache, cache_position=position,
                       use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    def generate(run):
        cache.reset()
        start = prompt.shape[1]
        token = model(input_ids=prompt, past_key_values=cache, cache_position=positions[:start],
                      use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        tokens, marks = [token], []
        for i in range(DECODE_STEPS):
            if i in (8, DECODE_STEPS - 1):
                torch.cuda.synchronize()
                marks.append(time.perf_counter())
            # A copy: graph outputs (reduce-overhead's, the hand graph's) are overwritten
            # by the next step, which reads this token.
            token = run(token, positions[start + i:start + i + 1]).clone()
            tokens.append(token)
        return torch.cat(tokens, 1)[0].tolist(), (marks[1] - marks[0]) / (DECODE_STEPS - 9)

    with torch.no_grad():
        generate(step)  # kernels, handles: eager's one-time costs billed to no system
        begin = time.perf_counter()
        run = (step if system == "torch_eager" else
               _HandGraph(torch, step, *_decode_args(torch, prompt, positions))
               if system == "torch_graph" else _compile(torch, step, system))
        tokens, _ = generate(run)
        setup_s = time.perf_counter() - begin
        steps = [generate(run)[1] for _ in range(_REPEATS)]
    return {"tokens": tokens, "step_s": steps, "setup_s": setup_s}


def _decode_args(torch, prompt, positions):
    return (prompt[:, -1:].clone(), positions[prompt.shape[1]:prompt.shape[1] + 1])


def _resnet_child(torch, system: str) -> dict:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).cuda().eval()
    inputs = [torch.randn(16, 3, 224, 224, device="cuda") for _ in range(4)]
    with torch.no_grad():
        expected = model(inputs[1]).float()
        begin = time.perf_counter()
        run = (model if system == "torch_eager" else _HandGraph(torch, model, inputs[0])
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


def _run(ctx: Context, workload: str, package: str) -> None:
    rows = {name: RowBuilder(name, unit, SYSTEMS, "torch_graph", "cugraphrt_compile")
            for name, unit in (("step", "us"), ("compile + capture", "s"), ("memory", "MiB"),
                               ("same as eager", "steps" if workload == "hf_decode" else "err"))}
    missing = _missing(package)
    if ctx.quick or missing:
        for row in rows.values():
            row.unavailable_all(missing or f"skipped in --quick (run --only {workload})")
            ctx.emit(row.build())
        return
    results: dict[str, dict | None] = {}
    for system in SYSTEMS:
        ctx.step(f"{workload}: {system}")
        results[system] = rows["step"].setup(system, functools.partial(_run_system, workload,
                                                                       system))
    eager = results.get("torch_eager")
    for system, result in results.items():
        if result is None:
            for row in list(rows.values())[1:]:
                row.unavailable(system, "the system failed (see the step row)")
            continue
        rows["same as eager"].set(system, summarize([_agreement(result, eager)]))
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
    same = 0
    for a, b in zip(result["tokens"], eager["tokens"], strict=True):
        if a != b:
            break
        same += 1
    return float(same - 1)  # the first token comes from the eager prefill


def _missing(package: str) -> str | None:
    import importlib.util

    for name in ("torch", package):
        if importlib.util.find_spec(name) is None:
            return f"{name} not installed"
    return None


_TARGETS = (Target("cugraphrt_compile", "torch_graph", 1.05, metric="step"),
            Target("cugraphrt_compile", "torch_compile", 0.90, metric="step"))
HF_DECODE = Workload(
    "hf_decode", f"LlamaForCausalLM (12 layers, bf16, random weights, StaticCache): greedy "
    f"decode step, tokens checked against eager over {DECODE_STEPS} steps; one process per "
    f"system", SYSTEMS, "torch_graph", _TARGETS, lambda ctx: _run(ctx, "hf_decode",
                                                                  "transformers"))
RESNET50 = Workload(
    "resnet50", "torchvision ResNet-50 inference, batch 16, fp32; wall time per call with "
    "copy-in; one process per system", SYSTEMS, "torch_graph",
    (Target("cugraphrt_compile", "torch_compile", 1.00, metric="step"),),
    lambda ctx: _run(ctx, "resnet50", "torchvision"))

if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])

"""generate: greedy generation of a Hugging Face Llama, many tokens per launch.

The model of the issue: ``LlamaForCausalLM`` from a config (12 layers, hidden 768, bf16,
random weights), prompts of 16 tokens, 256 new tokens (no EOS: every system runs them all),
batch 1 and 8. Systems:

* ``hf_eager``: ``model.generate(do_sample=False)``, the default DynamicCache: the reference
  tokens.
* ``hf_static``: ``generate(cache_implementation="static")``, which transformers compiles
  (``torch.compile`` mode ``reduce-overhead``); its first calls compile, untimed.
* ``per_token``: :class:`cugraphrt_torch.Generator` with ``chunk=1``: one launch and one host
  read per token (a host loop of graphed steps).
* ``cugraphrt``: the Generator's defaults: eager's kernels, chunks of 32 steps per launch.
* ``cugraphrt_compiled``: ``compile_step=True``: Inductor under ``eager_numerics="exact"``
  (eager's kernels for reductions and math functions), the default cache buckets (one
  compilation per batch size and cache bucket): eager's tokens.
* ``cugraphrt_fast``: ``compile_step="fast"`` (Inductor's kernels, eager's rounding), one
  cache bucket (one compilation per batch size): the fastest step, tokens not eager's.
* ``floor``: the ``per_token`` graphs launched back to back, no host read: new tokens x the
  graphed decode step, the time generation cannot beat with eager's kernels.
* ``compiled_device``: the device time per step of ``cugraphrt_compiled``'s decode graphs
  (CUDA events around each launch): the time generation cannot beat with these kernels.

Rows: time per new token (wall, prefill included), time to first token (a one-token
generation, wall), the generator's memory (pool reserved + cache and state), and the leading
tokens equal to ``hf_eager``'s (the fewest of the batch's rows). Skipped in ``--quick``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .real_models import LLAMA_LAYERS, missing_package
from .spec import Context, RowBuilder, Target, Workload
from .timing import single, summarize

__all__ = ["GENERATE"]

SYSTEMS = ("hf_eager", "hf_static", "per_token", "cugraphrt", "cugraphrt_compiled",
           "cugraphrt_fast", "floor",
           "compiled_device")
OURS = ("per_token", "cugraphrt", "cugraphrt_compiled", "cugraphrt_fast")
BATCHES, PROMPT, NEW, HIDDEN = (1, 8), 16, 256, 768
REPEATS = 3  # generations per system and batch (hf_eager: one, 20 s at batch 1)
US, MS, MIB = 1e6, 1e3, float(1 << 20)


def _per_token(batch: int) -> str:
    return f"per token, batch {batch}"


def _first(batch: int) -> str:
    return f"time to first token, batch {batch}"


def _same(batch: int) -> str:
    return f"same as eager, batch {batch}"


MEMORY = "memory, batch 8"


def _model(torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=HIDDEN,
                         intermediate_size=HIDDEN * 11 // 4, num_hidden_layers=LLAMA_LAYERS,
                         num_attention_heads=HIDDEN // 64, num_key_value_heads=HIDDEN // 64,
                         max_position_embeddings=1024)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    # No EOS: every system generates all NEW tokens (random weights have no EOS of their own).
    model.generation_config.eos_token_id = None
    return model


def _wall(torch, call: Callable[[], Any]) -> tuple[float, Any]:
    torch.cuda.synchronize()
    begin = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    return time.perf_counter() - begin, result


def _hf(model, prompt, *, new: int, static: bool):
    kwargs = {"cache_implementation": "static"} if static else {}
    return lambda: model.generate(prompt, attention_mask=prompt.new_ones(prompt.shape),
                                  max_new_tokens=new, do_sample=False,
                                  pad_token_id=0, **kwargs)


def _ours(generator, prompt, *, new: int):
    return lambda: generator.generate(prompt, max_new_tokens=new, eos_token_id=[])


def _floor(torch, generator, prompt, new: int) -> Callable[[], float]:
    """The chunk=1 generator's one-step graphs launched back to back, no host read."""
    generator.generate(prompt, max_new_tokens=new, eos_token_id=[])  # every graph captured
    rows = prompt.shape[0]
    state, start = generator.state, prompt.shape[1]
    prefill = generator._prefill(rows, start)
    steps = [generator._chunks[rows, generator._cache_bucket(start + 1 + i)]
             for i in range(new - 1)]

    def sample() -> float:
        state.stage(prompt, prompt.new_ones(prompt.shape), rows, new, 0, [])
        seconds, _ = _wall(torch, lambda: [prefill()] + [step() for step in steps])
        return seconds / new

    return sample


def _device_per_step(torch, generator, prompt, new: int) -> float:
    """Device seconds per decode step of ``generator``'s chunk graphs (events around each
    launch), over one generation of ``new`` tokens."""
    rows, start, state = prompt.shape[0], prompt.shape[1], generator.state
    state.stage(prompt, prompt.new_ones(prompt.shape), rows, new, 0, [])
    generator._prefill(rows, start)()
    length, running, seconds = state.read()[0], True, 0.0
    while running:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        generator._chunks[rows, generator._cache_bucket(length)]()
        end.record()
        before = length
        length, running = state.read()
        seconds += begin.elapsed_time(end) / MS
        assert length > before, "a chunk made no progress"
    return seconds / (new - 1)


def _equal_steps(tokens, reference) -> float:
    """Leading new tokens equal to ``reference``'s, the fewest over the rows."""
    same = (tokens[:, PROMPT:] == reference[:, PROMPT:]).int().cumprod(1).sum(1)
    return float(same.min())


def run_generate(ctx: Context) -> None:
    rows = {name: RowBuilder(name, unit, SYSTEMS, "hf_static", "cugraphrt_compiled")
            for batch in BATCHES
            for name, unit in ((_per_token(batch), "us"), (_first(batch), "ms"),
                               (_same(batch), "tokens"))}
    rows[MEMORY] = RowBuilder(MEMORY, "MiB", SYSTEMS, "cugraphrt", "cugraphrt_compiled")
    missing = missing_package("torch", "transformers")
    if ctx.quick or missing:
        for row in rows.values():
            row.unavailable_all(missing or "skipped in --quick (run --only generate)")
            ctx.emit(row.build())
        return
    import torch
    from cugraphrt_torch import Generator

    torch.set_grad_enabled(False)
    model = _model(torch)
    length = PROMPT + NEW
    makers = {
        "per_token": lambda: Generator(model, max_length=length, chunk=1),
        "cugraphrt": lambda: Generator(model, max_length=length),
        "cugraphrt_compiled": lambda: Generator(model, max_length=length, compile_step=True),
        "cugraphrt_fast": lambda: Generator(model, max_length=length, compile_step="fast",
                                            cache_buckets=(length,)),
    }
    generators = {name: rows[MEMORY].setup(name, make) for name, make in makers.items()}
    for batch in BATCHES:
        ctx.step(f"batch {batch}")
        prompt = torch.randint(1, 32000, (batch, PROMPT), device="cuda",
                               generator=torch.Generator("cuda").manual_seed(batch))
        per_token, first, same = (rows[_per_token(batch)], rows[_first(batch)],
                                  rows[_same(batch)])
        calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "hf_eager": (_hf(model, prompt, new=NEW, static=False),
                         _hf(model, prompt, new=1, static=False)),
            "hf_static": (_hf(model, prompt, new=NEW, static=True),
                          _hf(model, prompt, new=1, static=True))}
        for name in OURS:
            if generators[name] is not None:
                calls[name] = (_ours(generators[name], prompt, new=NEW),
                               _ours(generators[name], prompt, new=1))
        reference = None
        for name, (whole, one) in calls.items():
            ctx.step(f"batch {batch}: {name}")
            result = per_token.setup(name, lambda whole=whole, one=one, name=name: _time(
                torch, whole, one, 1 if name == "hf_eager" else REPEATS))
            if result is None:
                continue
            seconds, firsts, tokens = result
            reference = tokens if name == "hf_eager" else reference
            per_token.set(name, summarize(seconds).scaled(US / NEW))
            first.set(name, summarize(firsts).scaled(MS))
            if reference is not None:
                same.set(name, single(_equal_steps(tokens, reference)))
        if generators["cugraphrt_compiled"] is not None:
            device = per_token.setup("compiled_device", lambda prompt=prompt: [_device_per_step(
                torch, generators["cugraphrt_compiled"], prompt, NEW) for _ in range(REPEATS)])
            if device is not None:
                per_token.set("compiled_device", summarize(device).scaled(US))
        if generators["per_token"] is not None:
            sample = per_token.setup("floor", lambda prompt=prompt: _floor(
                torch, generators["per_token"], prompt, NEW))
            if sample is not None:
                per_token.set("floor", summarize([sample() for _ in range(REPEATS)]).scaled(US))
        for row in (per_token, first, same):
            ctx.emit(row.build())
    for name, generator in generators.items():
        if generator is not None:
            stats = generator.stats()
            rows[MEMORY].set(name, single((stats.pool_reserved_bytes + stats.state_bytes)
                                          / MIB))
    ctx.emit(rows[MEMORY].build())


def _time(torch, whole, one, repeats: int):
    """(seconds per generation, seconds to a first token, tokens), after an untimed call
    of each (compilation, capture)."""
    tokens = whole()
    one()
    seconds, firsts = [], []
    for _ in range(repeats):
        elapsed, tokens = _wall(torch, whole)
        seconds.append(elapsed)
        firsts.append(_wall(torch, one)[0])
    return seconds, firsts, tokens


# Targets (the issue's, the batch-1 speed restated; docs/generation.md, "Targets"): eager's
# tokens, and speed against hf_static. Eager's tokens come from eager's kernels, graphed
# (``cugraphrt``: at the floor, more than a third of hf_static's time per token), or from the
# step compiled under eager_numerics="exact" (``cugraphrt_compiled``), which fuses only what
# rounds as eager does. hf_static runs Inductor's own kernels, which ``cugraphrt_fast``
# replays; one launch per chunk removes host time, not kernel time, so the gain at batch 1
# is at most hf_static / compiled_device: 2.2x with eager's bits, 2.6x with Inductor's own
# kernels (H100, 2026-11-27: 1,594 / 726 and 1,594 / 611 us), not the 3x (measured
# where hf_static took 2.55 ms). Both batch sizes: 2x, with eager's tokens.
GENERATE = Workload(
    "generate", f"LlamaForCausalLM ({LLAMA_LAYERS} layers, hidden {HIDDEN}, bf16, random "
    f"weights): greedy generation of {NEW} tokens after {PROMPT}, batch 1 and 8; "
    "cugraphrt_torch.Generator against transformers' generate", SYSTEMS, "hf_static",
    (Target("cugraphrt_compiled", "hf_static", 1 / 2, metric=_per_token(1)),
     Target("cugraphrt_compiled", "hf_static", 1 / 2, metric=_per_token(8)),
     Target("cugraphrt_compiled", "compiled_device", 1.10, metric=_per_token(1)),
     Target("cugraphrt_compiled", "compiled_device", 1.10, metric=_per_token(8)),
     Target("cugraphrt", "floor", 1.10, metric=_per_token(1)),
     Target("cugraphrt", "floor", 1.10, metric=_per_token(8)),
     Target("cugraphrt", "hf_eager", 1.0, "at_least", metric=_same(1)),
     Target("cugraphrt", "hf_eager", 1.0, "at_least", metric=_same(8)),
     Target("cugraphrt_compiled", "hf_eager", 1.0, "at_least", metric=_same(1)),
     Target("cugraphrt_compiled", "hf_eager", 1.0, "at_least", metric=_same(8))),
    run_generate)

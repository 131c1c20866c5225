"""moe_step: mixture-of-experts steps graphed whole, against eager and reduce-overhead.

Mixtral and Qwen3-MoE of :mod:`.generate_models` (6 layers of width 768, bf16, random
weights, 4 experts and 2 per token, full attention), two steps each:

* ``decode``: batch 8, one token a row, written into a ``StaticCache`` (what a serving loop
  replays every token). transformers 5.17's static layers write at a counter of their own on
  the device, which every step advances: the cache is reset, in place, before each batch
  of steps, each check and each set-up, outside the clock;
* ``prefill``: batch 1, 64 tokens, no cache.

Systems:

* ``eager``: the model as transformers builds it, its default experts (``grouped_mm``: on
  an H200 torch's grouped GEMM with offsets on the device; elsewhere a fallback that reads
  them on the host, which a capture refuses);
* ``eager_batched_mm``: the same with transformers' ``batched_mm`` experts
  (``set_experts_implementation``): what cugraphrt's graph runs where the model's own
  experts cannot be captured (information);
* ``reduce_overhead``: ``torch.compile(step, mode="reduce-overhead")`` over the default
  experts;
* ``reduce_overhead_batched_mm``: the same over ``batched_mm`` experts, what a torch user can
  switch to (both for the decode step only: four Inductor compilations are most of the
  workload's time already);
* ``cugraphrt``: ``cugraphrt_torch.graph_module(step, sample)``, which captures the model's
  own experts where they capture (``grouped_mm`` on an H200), else ``batched_mm``.

Wall time per step with its copy-in and a synchronization, over 8 rotating inputs. Before it
is timed, each system's logits are checked against ``eager_batched_mm``'s for the same
input (relative 2-norm within :data:`TOL`: bf16, and Inductor's kernels for the compiled
ones). For the compiled systems, a row of its own counts the CUDA graphs Inductor skipped
while they compiled and recorded: reduce-overhead runs a graph it cannot record without CUDA
graphs, and says so only in the ``perf_hints`` log, off by default, so a fast time alone
does not show that it replayed graphs. Runs with ``--only moe_step``; skipped in ``--quick``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .real_models import missing_package
from .spec import (
    Context,
    RowBuilder,
    Target,
    Workload,
    check_close,
    cycling_calls,
    prepared,
    verify,
)
from .timing import host_batch, single

__all__ = ["MOE_STEP", "ARCHS", "STEPS"]

SYSTEMS = ("eager", "eager_batched_mm", "reduce_overhead", "reduce_overhead_batched_mm",
           "cugraphrt")
OURS = ("cugraphrt",)
COMPILED = ("reduce_overhead", "reduce_overhead_batched_mm")
ARCHS = ("mixtral", "qwen3_moe")
STEPS = ("decode, batch 8", "prefill, 64 tokens")
LAYERS, HIDDEN, VOCAB, BATCH, PROMPT, LENGTH, ROTATION = 6, 768, 32000, 8, 64, 128, 8
REPEATS = 15  # timed batches a system, interleaved (each of ROTATION steps)
US = 1e6
#: bf16 logits of the same model: a stale or wrong replay is off by far more (order 1).
TOL = 2e-2


def _metric(arch: str, step: str) -> str:
    return f"{step}, {arch}"


def _skips_metric(arch: str) -> str:
    return f"{_metric(arch, STEPS[0])}: CUDA graphs Inductor skipped"


def run_moe_step(ctx: Context) -> None:
    rows = {_metric(arch, step): RowBuilder(_metric(arch, step), "us", SYSTEMS, "eager",
                                            "cugraphrt")
            for arch in ARCHS for step in STEPS}
    rows.update({_skips_metric(arch): RowBuilder(_skips_metric(arch), "graphs", SYSTEMS,
                                                 *COMPILED)
                 for arch in ARCHS})
    missing = missing_package("torch", "transformers")
    if missing or (ctx.quick and not ctx.selected):
        for row in rows.values():
            row.unavailable_all(missing or "skipped in --quick (run --only moe_step)")
            ctx.emit(row.build())
        return
    import torch

    try:
        for arch in ARCHS:
            _architecture(ctx, torch, arch, rows)
            torch.cuda.empty_cache()
    finally:
        for row in rows.values():
            row.unavailable_all("not reached")
            ctx.emit(row.build())


def _architecture(ctx: Context, torch, arch: str, rows: dict[str, RowBuilder]) -> None:
    import copy

    from transformers import StaticCache

    from .generate_models import causal_lm

    ctx.step(f"{arch}: build")
    model = causal_lm(arch, layers=LAYERS, hidden=HIDDEN, vocab=VOCAB,
                      positions=2 * LENGTH).to("cuda", torch.bfloat16)
    # A copy with batched_mm experts for the systems that run them, so that no call switches
    # a model's experts (dynamo would guard on the switch, and eager would pay for it).
    batched = copy.deepcopy(model)
    batched.set_experts_implementation(
        dict.fromkeys(model.get_experts_implementation(), "batched_mm"))
    cache = StaticCache(config=model.config, max_cache_len=LENGTH)
    gen = torch.Generator("cuda").manual_seed(0)
    position = torch.tensor([PROMPT], device="cuda")
    inputs = (
        [(torch.randint(0, VOCAB, (BATCH, 1), device="cuda", generator=gen), position.clone())
         for _ in range(ROTATION)],
        [(torch.randint(0, VOCAB, (1, PROMPT), device="cuda", generator=gen),)
         for _ in range(ROTATION)])
    with torch.no_grad():
        for index, step in enumerate(STEPS):
            ctx.step(f"{arch}: {step}")
            own, reference = (_step_modules(torch, m, cache)[index] for m in (model, batched))
            _step(torch, own, reference, inputs[index], rows[_metric(arch, step)],
                  compile_too=index == 0, rewind=cache.reset,
                  skips=rows[_skips_metric(arch)] if index == 0 else None)
            torch._dynamo.reset()  # the compiled steps' code and graph trees go with the step


def _step_modules(torch, model, cache) -> tuple[Any, Any]:
    """The two steps of ``model`` as modules (what graph_module and torch.compile take)."""

    class Decode(torch.nn.Module):
        """Logits of ``tokens`` ``(batch, 1)`` written into the cache at ``position`` ``(1,)``."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens, position):
            return self.model(input_ids=tokens, past_key_values=cache, cache_position=position,
                              use_cache=True).logits

    class Prefill(torch.nn.Module):
        """Logits of ``tokens`` ``(1, length)``, no cache."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens):
            return self.model(input_ids=tokens, use_cache=False).logits

    return Decode().eval(), Prefill().eval()


def _step(torch, own, reference, inputs: list[tuple], row: RowBuilder, *,
          compile_too: bool, rewind: Callable[[], None],
          skips: RowBuilder | None = None) -> None:
    """One step's row: ``own`` runs the model's default experts, ``reference`` batched_mm;
    the reduce-overhead systems when ``compile_too``, with the CUDA graphs Inductor skipped
    for each in ``skips``. ``rewind()`` puts the cache back at its start (in place, on the
    current stream) before every batch of steps, check and set-up: stream order puts it
    before the steps."""
    rewind()
    reference(*inputs[1])  # the cache's tensors, kernels and handles, outside every clock
    rewind()
    expected = reference(*inputs[1]).float().cpu().numpy()

    def set_up(system: str, factory: Callable[[], Any]) -> Any:
        rewind()
        return row.setup(system, factory)

    calls: dict[str, Any] = {"eager": own, "eager_batched_mm": reference}
    for system, module in zip(COMPILED, (own, reference), strict=True):
        if compile_too:
            calls[system] = set_up(system, functools.partial(_compiled, torch, module,
                                                             inputs[0]))
        else:
            row.unavailable(system, "compiled for the decode step only (compile time)")
    calls["cugraphrt"] = set_up("cugraphrt", lambda: _adapter().graph_module(
        own, tuple(t.clone() for t in inputs[0])))
    if skips is not None:
        _count_skips(skips, calls)

    def check(system: str, fn) -> None:
        rewind()
        check_close(fn(*inputs[1]).float().cpu().numpy(), expected, system, TOL)

    batches = {}
    for system, fn in calls.items():
        checked = fn is not None and (system in ("eager", "eager_batched_mm") or verify(
            row, system, functools.partial(check, system, fn)))
        batches[system] = prepared(rewind, functools.partial(
            host_batch, cycling_calls(fn, inputs), ROTATION, include_sync=True)) \
            if checked else None
    row.measure(batches, REPEATS, scale=US)


def _count_skips(skips: RowBuilder, calls: dict[str, Any]) -> None:
    """The compiled systems' counts of CUDA graphs Inductor skipped (what :func:`_compiled`
    left on each call) into ``skips``; the other systems compile nothing."""
    for system in SYSTEMS:
        if system not in COMPILED:
            skips.unavailable(system, "not compiled by Inductor")
            continue
        count = getattr(calls.get(system), "graph_skips", None)
        if count is None:
            skips.unavailable(system, "not set up, or torch keeps no count of the CUDA graphs "
                                      "Inductor skipped")
        else:
            skips.set(system, single(float(count)))


def _inductor_skips() -> int | None:
    """How many times this process's Inductor ran a compiled graph without CUDA graphs under
    ``mode="reduce-overhead"``; None where torch keeps no such count. Tested on torch 2.11
    and 2.13: ``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``, bumped beside
    a ``perf_hints`` log line (off by default) that gives the reason."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["inductor"]["cudagraph_skips"])


def _compiled(torch, module, sample: tuple):
    """``torch.compile(module, mode="reduce-overhead")``, run three times on ``sample``
    (compilation, then the CUDA graph tree's warm-up and recording). The call returned
    carries ``graph_skips``: the CUDA graphs Inductor skipped meanwhile (None if unknown)."""
    before = _inductor_skips()
    compiled = torch.compile(module, mode="reduce-overhead", dynamic=False)

    def call(*args):
        # A new step: the tree may overwrite the previous call's outputs, as graph_module's
        # replays overwrite theirs (neither system copies its outputs out).
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    for _ in range(3):
        call(*sample)
    torch.cuda.synchronize()
    after = _inductor_skips()
    skipped = None if before is None or after is None else after - before
    call.graph_skips = skipped  # type: ignore[attr-defined]
    return call


def _adapter():
    import cugraphrt_torch

    return cugraphrt_torch


# The measure (53): the mixture-of-experts steps graphed whole, per step against
# eager. A launch-bound step of 6 layers graphed should take at most half of eager's time.
MOE_STEP = Workload(
    "moe_step", f"Mixture-of-experts steps ({', '.join(ARCHS)}; {LAYERS} layers, hidden "
    f"{HIDDEN}, bf16, random weights): a decode step at batch {BATCH} into a StaticCache and a "
    f"prefill of {PROMPT} tokens; wall time per step, graph_module against eager and "
    "torch.compile(mode='reduce-overhead')",
    SYSTEMS, "eager",
    tuple(Target("cugraphrt", "eager", 1 / 2, metric=_metric(arch, step))
          for arch in ARCHS for step in STEPS),
    run_moe_step, own=OURS)

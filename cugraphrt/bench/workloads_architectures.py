"""generate_architectures: greedy and sampled generation across five architectures, against
transformers.

The models of :mod:`.generate_models` at 6 layers of width 768 (bf16, random weights, a
vocabulary of 32,000): Llama, Qwen3, Gemma 3 (five sliding-window layers of six), Mistral
with a window on every layer and Mixtral (a mixture of experts); the window is 64 tokens,
so each generation of 128 tokens after a prompt of 16 crosses it. Batch 1 and 8. Systems:

* ``hf_eager``: ``model.generate(do_sample=False)``, transformers' default cache (for the
  sliding-window models, one that evicts): the reference tokens;
* ``hf_static``: ``generate(cache_implementation="static")``, which transformers compiles
  (checked, as in ``generate``);
* ``cugraphrt``: the Generator's defaults (eager's kernels, chunks of 32 steps per launch);
* ``cugraphrt_compiled``: ``compile_step=True`` over one cache bucket (one compilation per
  batch size);
* ``hf_static_sampled`` and ``cugraphrt_sampled``: the same, sampling (``generate_sampled``'s
  settings: temperature 0.8, top-k 50, top-p 0.9, repetition penalty 1.1; a seed per row
  for the Generator, whose tokens must equal ``graphed=False``'s for the same seeds, or its
  cell is an error).

Timed as ``generate`` (a round: a one-token generation, then a whole one; shuffled rounds, 9
timed after an untimed one). ``CUGRAPHRT_GENERATE_ARCHS`` (comma-separated names, e.g.
``gemma3,gpt_oss``) picks other architectures of :data:`.generate_models.ARCHITECTURES`;
targets of architectures left out read N/A. Skipped in ``--quick``.
"""

from __future__ import annotations

import os

from .generate_models import ARCHITECTURES
from .spec import Context, RowBuilder, Target, Workload
from .timing import interleave, single, summarize
from .workloads_generate import (
    ROUNDS,
    US,
    equal_new_tokens,
    generate_calls,
    set_up,
    skipped,
)
from .workloads_sampled import SETTINGS, check_sampled

__all__ = ["GENERATE_ARCHITECTURES", "DEFAULT_ARCHS", "archs"]

SYSTEMS = ("hf_eager", "hf_static", "cugraphrt", "cugraphrt_compiled", "hf_static_sampled",
           "cugraphrt_sampled")
OURS = ("cugraphrt", "cugraphrt_compiled", "cugraphrt_sampled")
GREEDY = ("cugraphrt", "cugraphrt_compiled")
DEFAULT_ARCHS = ("llama", "qwen3", "gemma3", "mistral", "mixtral")
BATCHES, PROMPT, NEW, LAYERS, HIDDEN, WINDOW, VOCAB = (1, 8), 16, 128, 6, 768, 64, 32000
ENV = "CUGRAPHRT_GENERATE_ARCHS"


def archs(selection: str | None) -> tuple[str, ...]:
    """The architectures a run measures: :data:`DEFAULT_ARCHS`, or those ``selection`` names
    (comma-separated); an unknown name raises."""
    if not selection:
        return DEFAULT_ARCHS
    names = tuple(name.strip() for name in selection.split(",") if name.strip())
    unknown = [name for name in names if name not in ARCHITECTURES]
    if unknown:
        raise ValueError(f"{ENV}: unknown architectures {unknown}; pick from {ARCHITECTURES}")
    return names


def _per_token(arch: str, batch: int) -> str:
    return f"per token, {arch}, batch {batch}"


def _same(arch: str, batch: int) -> str:
    return f"same as eager, {arch}, batch {batch}"


def run_generate_architectures(ctx: Context) -> None:
    chosen = archs(os.environ.get(ENV))
    rows = {name: RowBuilder(name, unit, SYSTEMS, "hf_static", "cugraphrt_compiled")
            for arch in chosen for batch in BATCHES
            for name, unit in ((_per_token(arch, batch), "us"), (_same(arch, batch), "tokens"))}
    if skipped(ctx, rows.values(), "generate_architectures"):
        return
    import torch
    from cugraphrt_torch import Generator

    for arch in chosen:
        _architecture(ctx, torch, Generator, arch, rows)
        torch.cuda.empty_cache()  # the next architecture's memory starts from the same floor
        # Every architecture's hf_static compiles the same transformers function (its
        # generic forward wrapper): without a reset, the compilations of the architectures
        # before count towards dynamo's recompile limit, and the later ones' hf_static runs
        # eagerly once it is hit (seen on the H200: Mistral's batch 8 and Mixtral's rows).
        torch.compiler.reset()


def _architecture(ctx: Context, torch, Generator, arch: str,
                  rows: dict[str, RowBuilder]) -> None:
    from .generate_models import causal_lm

    ctx.step(f"{arch}: build")
    length = PROMPT + NEW
    try:
        model = causal_lm(arch, layers=LAYERS, hidden=HIDDEN, vocab=VOCAB, window=WINDOW,
                          positions=2 * length).to("cuda", torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - this architecture's rows say why
        for batch in BATCHES:
            for name in (_per_token(arch, batch), _same(arch, batch)):
                rows[name].unavailable_all(f"{arch} could not be built: {exc}")
                ctx.emit(rows[name].build())
        return
    model.generation_config.eos_token_id = None  # every system generates all NEW tokens
    first = rows[_per_token(arch, BATCHES[0])]
    makers = {"cugraphrt": {},
              "cugraphrt_compiled": dict(compile_step=True, cache_buckets=(length,)),
              "cugraphrt_sampled": dict(sampling=True, compile_step=True,
                                        cache_buckets=(length,))}
    generators = {name: first.setup(name, lambda kwargs=kwargs: Generator(
        model, max_length=length, **kwargs)) for name, kwargs in makers.items()}
    # The sampled generator's reference: the same program run eagerly, for the same seeds.
    graphless = Generator(model, max_length=length, sampling=True, graphed=False,
                          cache_buckets=(length,))
    with torch.no_grad():  # scoped: workloads after this one may train
        for batch in BATCHES:
            _batch(ctx, torch, model, generators, graphless, arch, batch, rows)


def _batch(ctx: Context, torch, model, generators: dict, graphless, arch: str, batch: int,
           rows: dict[str, RowBuilder]) -> None:
    prompt = torch.randint(1, VOCAB, (batch, PROMPT), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(batch))
    seeds = [1000 + r for r in range(batch)]
    per_token, same = rows[_per_token(arch, batch)], rows[_same(arch, batch)]
    calls = generate_calls(model, prompt, {name: generators[name] for name in GREEDY}, NEW)
    sampled = generate_calls(model, prompt, {"cugraphrt_sampled": generators[
        "cugraphrt_sampled"]}, NEW, hf=SETTINGS, ours=dict(seed=seeds, **SETTINGS))
    calls["hf_static_sampled"] = sampled["hf_static"]
    if "cugraphrt_sampled" in sampled:
        calls["cugraphrt_sampled"] = sampled["cugraphrt_sampled"]
    timed = set_up(ctx, torch, model, batch, calls, per_token, new=NEW)
    ctx.step(f"{arch}, batch {batch}: {ROUNDS} rounds")
    samples = interleave(timed, ROUNDS, warmup=1, on_error=per_token.fail)
    reference = timed["hf_eager"].tokens if "hf_eager" in samples else None
    for name, values in samples.items():
        per_token.set(name, summarize(values).scaled(US))
        if name.endswith("_sampled"):
            same.unavailable(name, "sampled: its tokens are checked against graphed=False's")
        elif reference is not None:
            same.set(name, single(equal_new_tokens(timed[name].tokens, reference, PROMPT)))
    if "cugraphrt_sampled" in samples:
        want = graphless.generate(prompt, max_new_tokens=NEW, eos_token_id=[], seed=seeds,
                                  **SETTINGS)
        check_sampled(per_token, "cugraphrt_sampled", timed["cugraphrt_sampled"].tokens,
                      want, PROMPT)
    for row in (per_token, same):
        ctx.emit(row.build())


# The targets (54), per architecture and batch size: at least 2x hf_static's tokens
# per second, greedy and sampled, and eager's tokens (every one of the NEW) when greedy.
GENERATE_ARCHITECTURES = Workload(
    "generate_architectures", f"Greedy and sampled generation of {NEW} tokens after {PROMPT} by "
    f"{', '.join(DEFAULT_ARCHS)} ({LAYERS} layers, hidden {HIDDEN}, bf16, random weights; "
    f"sliding windows of {WINDOW}), batch 1 and 8: cugraphrt_torch.Generator against "
    "transformers' generate",
    SYSTEMS, "hf_static",
    (*(Target("cugraphrt_compiled", "hf_static", 1 / 2, metric=_per_token(a, b))
       for a in DEFAULT_ARCHS for b in BATCHES),
     *(Target("cugraphrt_sampled", "hf_static_sampled", 1 / 2, metric=_per_token(a, b))
       for a in DEFAULT_ARCHS for b in BATCHES),
     *(Target(system, "hf_eager", 1.0, "at_least", metric=_same(a, b))
       for system in GREEDY for a in DEFAULT_ARCHS for b in BATCHES)),
    run_generate_architectures, own=OURS)

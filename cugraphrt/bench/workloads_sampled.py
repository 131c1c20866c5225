"""generate_sampled: sampled generation of the ``generate`` workload's Llama, with a seed per
request.

The model, prompts and lengths of :mod:`.workloads_generate` (12 layers, hidden 768, bf16,
random weights; 16 prompt tokens, 256 new, no EOS; batch 1 and 8), every system sampling with
``do_sample=True, temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1``:

* ``hf_eager``: ``model.generate``, the default DynamicCache;
* ``hf_static``: ``generate(cache_implementation="static")``, which transformers compiles
  (checked, as in ``generate``);
* ``cugraphrt``: ``Generator(sampling=True)``, eager's kernels, chunks of 32 steps per launch;
* ``cugraphrt_compiled``: ``Generator(sampling=True, compile_step=True)``.

transformers draws from torch's global generator and cugraphrt from one Philox stream per row,
so their tokens differ by design; what must hold is that a cugraphrt generator's tokens for
given seeds are those of the same program run eagerly (``graphed=False``, one launch per
operation). The row ``same as graphed=False`` counts the leading tokens each generator shares
with that run (the fewest over the rows; information, as the generators are cugraphrt's own),
and a generator whose tokens part from it gets an error in its timing cells instead of a time.
Timed as ``generate``: shuffled rounds, at least 9 timed after an untimed one. Skipped in
``--quick``.
"""

from __future__ import annotations

from typing import Any

from .real_models import LLAMA_LAYERS
from .spec import Context, RowBuilder, Target, Workload
from .timing import interleave, single, summarize
from .workloads_generate import (
    BATCHES,
    HIDDEN,
    NEW,
    PROMPT,
    ROUNDS,
    US,
    generate_calls,
    llama,
    set_up,
    skipped,
)

__all__ = ["GENERATE_SAMPLED", "check_sampled"]

SYSTEMS = ("hf_eager", "hf_static", "cugraphrt", "cugraphrt_compiled")
OURS = ("cugraphrt", "cugraphrt_compiled")
SETTINGS = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1)


def _per_token(batch: int) -> str:
    return f"per token, sampled, batch {batch}"


def _same(batch: int) -> str:
    return f"same as graphed=False, batch {batch}"


def run_generate_sampled(ctx: Context) -> None:
    rows = {name: RowBuilder(name, unit, SYSTEMS, "hf_static", "cugraphrt_compiled")
            for batch in BATCHES
            for name, unit in ((_per_token(batch), "us"), (_same(batch), "tokens"))}
    if skipped(ctx, rows.values(), "generate_sampled"):
        return
    import torch
    from cugraphrt_torch import Generator

    model = llama(torch)
    length = PROMPT + NEW
    makers = {"cugraphrt": lambda: Generator(model, max_length=length, sampling=True),
              "cugraphrt_compiled": lambda: Generator(model, max_length=length, sampling=True,
                                                      compile_step=True)}
    first = rows[_per_token(BATCHES[0])]
    generators = {name: first.setup(name, make) for name, make in makers.items()}
    graphless = Generator(model, max_length=length, sampling=True, graphed=False)
    with torch.no_grad():  # scoped: workloads after this one may train
        for batch in BATCHES:
            ctx.step(f"batch {batch}")
            _batch(ctx, torch, model, generators, graphless, batch, rows)


def _batch(ctx: Context, torch, model, generators: dict, graphless: Any, batch: int,
           rows: dict[str, RowBuilder]) -> None:
    prompt = torch.randint(1, 32000, (batch, PROMPT), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(batch))
    seeds = [1000 + r for r in range(batch)]
    per_token, same = rows[_per_token(batch)], rows[_same(batch)]
    calls = generate_calls(model, prompt, generators, hf=SETTINGS,
                           ours=dict(seed=seeds, **SETTINGS))
    timed = set_up(ctx, torch, model, batch, calls, per_token)
    ctx.step(f"batch {batch}: graphed=False reference")
    reference = graphless.generate(prompt, max_new_tokens=NEW, eos_token_id=[], seed=seeds,
                                   **SETTINGS)
    ctx.step(f"batch {batch}: {ROUNDS} rounds")
    samples = interleave(timed, ROUNDS, warmup=1, on_error=per_token.fail)
    for name, values in samples.items():
        per_token.set(name, summarize(values).scaled(US))
    for name in OURS:
        if name in samples:
            shared = check_sampled(per_token, name, timed[name].tokens, reference, PROMPT)
            same.set(name, single(float(shared)))
    for row in (per_token, same):
        ctx.emit(row.build())


def check_sampled(per_token: RowBuilder, name: str, tokens: Any, reference: Any,
                  prompt: int) -> int:
    """``name``'s sampled tokens against ``graphed=False``'s for the same seeds: the new
    tokens every row shares with the reference from the first; any difference makes
    ``name``'s cell in ``per_token`` an error."""
    equal = (tokens[:, prompt:] == reference[:, prompt:]).int().cumprod(1).sum(1)
    shared = int(equal.min())
    if not tokens.equal(reference):
        per_token.fail(name, RuntimeError(
            f"{name}'s sampled tokens part from graphed=False's for the same seeds after "
            f"{shared} tokens"))
    return shared


# The target (54): at least 2x hf_static's tokens per second, sampled, at batch 1 and
# 8. The equality with graphed=False is a check above (an error cell), not a target: its
# reference is cugraphrt's own program.
GENERATE_SAMPLED = Workload(
    "generate_sampled", f"LlamaForCausalLM ({LLAMA_LAYERS} layers, hidden {HIDDEN}, bf16, "
    f"random weights): sampled generation (temperature 0.8, top-k 50, top-p 0.9, repetition "
    f"penalty 1.1) of {NEW} tokens after {PROMPT}, batch 1 and 8, a seed per row; "
    "cugraphrt_torch.Generator(sampling=True) against transformers' generate",
    SYSTEMS, "hf_static",
    tuple(Target("cugraphrt_compiled", "hf_static", 1 / 2, metric=_per_token(b))
          for b in BATCHES),
    run_generate_sampled, own=OURS)

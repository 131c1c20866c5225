"""speculative: prompt-lookup speculative decoding, the Generator's against transformers'.

The ``generate`` workload's Llama (12 layers, hidden 768, random weights) in float32 (TF32
off: a verify forward of 5 positions rounds as one of 1 there, so every system keeps
greedy's tokens), a prompt that repeats a span (16 tokens, three times, then half of it:
56 tokens), 128 new tokens, no EOS, batch 1. Systems:

* ``hf_eager``: greedy ``generate``: the reference tokens;
* ``hf_prompt_lookup``: ``generate(prompt_lookup_num_tokens=4)``: transformers' prompt
  lookup, its draft, verify and accept loop on the host;
* ``cugraphrt``: the Generator without speculation (information: cugraphrt's own);
* ``cugraphrt_speculative``: ``Generator(speculative=PromptLookup(tokens=4))``;
* ``hf_assisted`` and ``cugraphrt_draft`` (information): a draft model, the target's first
  2 layers and its head, in transformers' assisted ``generate(assistant_model=...)`` and in
  ``Generator(speculative=DraftModel(draft, tokens=4))``.

Rows: per token (a whole generation less a one-token one, over the 127 tokens after the
first, as ``generate``), the leading tokens equal to ``hf_eager``'s, and the tokens each
verify forward kept on average (1 to 5 with prompt lookup, 1 to 4 with the draft model; from
``GeneratorStats``; information). Random weights
continue a prompt by chance, not by quoting it: the acceptance measured here is low, and
the speed-up over cugraphrt's own greedy decoding with it; the row says what it is.
Skipped in ``--quick``.
"""

from __future__ import annotations

from .spec import Context, RowBuilder, Target, Workload
from .timing import interleave, single, summarize
from .workloads_generate import (
    HIDDEN,
    ROUNDS,
    US,
    equal_new_tokens,
    generate_calls,
    llama,
    set_up,
    skipped,
)

__all__ = ["SPECULATIVE"]

SYSTEMS = ("hf_eager", "hf_prompt_lookup", "hf_assisted", "cugraphrt",
           "cugraphrt_speculative", "cugraphrt_draft")
OURS = ("cugraphrt", "cugraphrt_speculative", "cugraphrt_draft")
DRAFT_LAYERS = 2
SPAN, NEW, DRAFTS = 16, 128, 4
PROMPT = 3 * SPAN + SPAN // 2
PER_TOKEN, SAME, KEPT = "per token, batch 1", "same as eager, batch 1", "tokens per verify step"


def run_speculative(ctx: Context) -> None:
    rows = {PER_TOKEN: RowBuilder(PER_TOKEN, "us", SYSTEMS, "hf_prompt_lookup",
                                  "cugraphrt_speculative"),
            SAME: RowBuilder(SAME, "tokens", SYSTEMS, "hf_eager", "cugraphrt_speculative"),
            KEPT: RowBuilder(KEPT, "tokens", SYSTEMS, "cugraphrt", "cugraphrt_speculative")}
    if skipped(ctx, rows.values(), "speculative"):
        return
    import copy

    import torch
    from cugraphrt_torch import DraftModel, Generator, PromptLookup

    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = llama(torch).float()
        draft = copy.deepcopy(model)  # the target's first layers and its head
        draft.model.layers = draft.model.layers[:DRAFT_LAYERS]
        draft.config.num_hidden_layers = DRAFT_LAYERS
        length = PROMPT + NEW
        per_token = rows[PER_TOKEN]
        makers = {"cugraphrt": {}, "cugraphrt_speculative": {
            "speculative": PromptLookup(tokens=DRAFTS)}, "cugraphrt_draft": {
            "speculative": DraftModel(draft, tokens=DRAFTS)}}
        generators = {name: per_token.setup(name, lambda kwargs=kwargs: Generator(
            model, max_length=length, **kwargs)) for name, kwargs in makers.items()}
        with torch.no_grad():  # scoped: workloads after this one may train
            _measure(ctx, torch, model, draft, generators, rows)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _measure(ctx: Context, torch, model, draft, generators: dict,
             rows: dict[str, RowBuilder]) -> None:
    span = torch.randint(1, 32000, (1, SPAN), device="cuda",
                         generator=torch.Generator("cuda").manual_seed(1))
    prompt = torch.cat([span, span, span, span[:, :SPAN // 2]], 1)
    calls = generate_calls(model, prompt, generators, NEW)
    del calls["hf_static"]  # not a system here: transformers' prompt lookup is the reference
    calls["hf_prompt_lookup"] = generate_calls(
        model, prompt, {}, NEW, hf=dict(do_sample=False, prompt_lookup_num_tokens=DRAFTS)
    )["hf_eager"]
    calls["hf_assisted"] = generate_calls(
        model, prompt, {}, NEW, hf=dict(do_sample=False, assistant_model=draft))["hf_eager"]
    per_token, same = rows[PER_TOKEN], rows[SAME]
    timed = set_up(ctx, torch, model, 1, calls, per_token, new=NEW)
    before = {name: generators[name].stats() for name in OURS[1:]
              if generators[name] is not None}
    ctx.step(f"{ROUNDS} rounds")
    samples = interleave(timed, ROUNDS, warmup=1, on_error=per_token.fail)
    reference = timed["hf_eager"].tokens if "hf_eager" in samples else None
    for name, values in samples.items():
        per_token.set(name, summarize(values).scaled(US))
        if reference is not None:
            same.set(name, single(equal_new_tokens(timed[name].tokens, reference, PROMPT)))
    for name, start in before.items():
        if name in samples:
            after = generators[name].stats()
            steps = after.speculative_steps - start.speculative_steps
            kept = after.speculative_tokens - start.speculative_tokens
            rows[KEPT].set(name, single(kept / max(steps, 1)))
    for row in rows.values():
        ctx.emit(row.build())


# The issue's target (55) against transformers' prompt lookup, and eager's tokens. The one
# against cugraphrt's own greedy generation (1.3x) is a row without a verdict (issue 51):
# cugraphrt's systems are not references.
SPECULATIVE = Workload(
    "speculative", f"LlamaForCausalLM (hidden {HIDDEN}, float32, random weights): greedy "
    f"generation of {NEW} tokens after a prompt that repeats a span, batch 1; speculative "
    f"decoding by prompt lookup ({DRAFTS} drafts) in cugraphrt_torch.Generator against "
    "transformers' prompt-lookup generate",
    SYSTEMS, "hf_prompt_lookup",
    (Target("cugraphrt_speculative", "hf_prompt_lookup", 1 / 2, metric=PER_TOKEN),
     Target("cugraphrt_speculative", "hf_eager", 1.0, "at_least", metric=SAME)),
    run_speculative, own=OURS)

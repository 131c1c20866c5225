"""Sampled generation with a seed per request, many tokens per launch.

`cugraphrt_torch.Generator(model, max_length=..., sampling=True)` applies transformers' logits
processors (repetition penalty, temperature, top-k, top-p, min-p) and draws each token inside
its graphs, from one Philox stream per request whose position advances on the device. This
example checks what that promises: the same seeds give the same tokens, graphed or not, and a
request's tokens do not depend on which other requests share its batch; other seeds give
other tokens; without `do_sample` the same graphs search greedily and equal transformers'
`generate`, repetition penalty included.

Builds a small Llama from a config (random weights: nothing is downloaded).

Run: python examples/generate_sampling.py   (needs a CUDA GPU, a CUDA build of torch,
transformers)
"""

from __future__ import annotations

import cugraphrt_torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 48
SETTINGS = dict(do_sample=True, temperature=0.8, top_p=0.9, repetition_penalty=1.1)


def main() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    lengths = [5, 11, 8]
    width = max(lengths)
    ids = torch.randint(1, config.vocab_size, (len(lengths), width), device="cuda")
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):  # left-padded (token 0, mask 0), as generate expects
        mask[row, width - n:] = 1
        ids[row, :width - n] = 0

    # One batch bucket: a request's logits do not depend on the other rows of its bucket
    # (another bucket's matmuls may round them otherwise, for greedy tokens too).
    generator = cugraphrt_torch.Generator(model, max_length=128, sampling=True,
                                          batch_buckets=(4,))
    seeds = [1234, 42, 7]
    out = generator.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                             seed=seeds, **SETTINGS)
    again = generator.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                               seed=seeds, **SETTINGS)
    assert torch.equal(out, again), "the same seeds gave other tokens"
    other = generator.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                               seed=[1, 2, 3], **SETTINGS)
    assert not torch.equal(out, other), "other seeds gave the same tokens"
    # Request 1 alone (its own padding trimmed): the tokens it drew beside the others.
    alone = generator.generate(ids[1:2, width - 11:], mask[1:2, width - 11:],
                               max_new_tokens=NEW_TOKENS, pad_token_id=0, seed=[42],
                               **SETTINGS)
    assert torch.equal(alone[0], out[1]), "a request's tokens depended on its batch"
    # The same program run eagerly, one launch per operation: the same tokens.
    eager = cugraphrt_torch.Generator(model, max_length=128, sampling=True, graphed=False,
                                      batch_buckets=(4,))
    assert torch.equal(out, eager.generate(ids, mask, max_new_tokens=NEW_TOKENS,
                                           pad_token_id=0, seed=seeds, **SETTINGS))
    # Without do_sample the same graphs search greedily, the penalty included: transformers'
    # tokens.
    greedy = generator.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                                repetition_penalty=1.3)
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                  do_sample=False, pad_token_id=0, repetition_penalty=1.3)
    assert torch.equal(greedy, expected)
    print(f"sampled {NEW_TOKENS} tokens for {len(seeds)} requests (seeds {seeds}):")
    for row in range(len(seeds)):
        print(f"  request {row}: {out[row, width:width + 12].tolist()} ...")
    print("same seeds, same tokens (graphed, eagerly, alone or batched); other seeds differ; "
          "greedy settings equal transformers' generate")


if __name__ == "__main__":
    main()

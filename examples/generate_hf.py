"""Greedy generation of a Hugging Face causal LM with many tokens per launch.

`cugraphrt_torch.Generator(model, max_length=...)` captures the model's prefill and a chunk of
decode steps (forward, argmax, append, EOS and length checks, all in a device-side
`while_loop`) as CUDA graphs, per batch bucket and cache length, all in one memory pool. Its
`generate` returns what transformers' `model.generate(do_sample=False)` returns, and with
eager's kernels (the default) the same tokens: this example checks them against it, streams
the tokens chunk by chunk through a callback, and times both.

Builds a small Llama from a config (random weights: nothing is downloaded).

Run: python examples/generate_hf.py   (needs a CUDA GPU, a CUDA build of torch, transformers)
"""

from __future__ import annotations

import time

import cugraphrt_torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 64


def main() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()

    # Three prompts of 5, 11 and 8 tokens, left-padded (token 0, mask 0) as generate expects.
    lengths = [5, 11, 8]
    width = max(lengths)
    ids = torch.randint(1, config.vocab_size, (len(lengths), width), device="cuda")
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
        ids[row, :width - n] = 0

    generator = cugraphrt_torch.Generator(model, max_length=128)
    chunks: list[torch.Tensor] = []
    out = generator.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                             callback=chunks.append)  # called once per launch: streaming

    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                  do_sample=False, pad_token_id=0)
    assert torch.equal(out, expected), "tokens differ from transformers' eager generate"
    assert torch.equal(torch.cat(chunks, 1), out[:, width:])
    print(f"{out.shape[1] - width} new tokens per sequence, equal to model.generate's; "
          f"streamed in {len(chunks)} pieces of {[c.shape[1] for c in chunks]} tokens")

    for name, run in (("cugraphrt_torch.Generator", lambda: generator.generate(
            ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0)),
                      ("model.generate (eager)", lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
            pad_token_id=0))):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        with torch.no_grad():
            run()
        torch.cuda.synchronize()
        print(f"{name:>27}: {(time.perf_counter() - begin) / NEW_TOKENS * 1e6:8.0f} us per token")
    stats = generator.stats()
    print(f"graphs: prefill {stats.prefill_graphs}, decode {stats.decode_graphs}; pool "
          f"{stats.pool_reserved_bytes / 2**20:.0f} MiB, cache and state "
          f"{stats.state_bytes / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

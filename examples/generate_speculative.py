"""Speculative decoding by prompt lookup, inside the device loop: several tokens per
forward where the text repeats itself, greedy decoding's tokens always.

`Generator(model, max_length=..., speculative=PromptLookup(tokens=4))` drafts 4 tokens per
step from the sequence so far (what followed the latest earlier occurrence of its last 3
tokens), verifies them in one forward of the model, and keeps, in each row, the longest
prefix that greedy decoding agrees with plus the model's own next token (the next step
writes over the rejected drafts' cache entries): all inside the decode chunk's
`while_loop`, many tokens per launch. This example checks the
tokens against transformers' greedy `generate` and prints the acceptance rate and both
speeds.

The model is a small Llama from a config (random weights: nothing is downloaded), which
repeats itself only by chance: the acceptance it prints is low, and a trained model on text
that quotes its prompt (code edits, retrieval) keeps far more drafts. float32, so that a
verify forward of 5 positions rounds as greedy's one-position forward does
(docs/generation.md, "Speculative decoding").

Run: python examples/generate_speculative.py   (needs a CUDA GPU, torch, transformers)
"""

from __future__ import annotations

import time

import torch
from cugraphrt_torch import Generator, PromptLookup
from transformers import LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 96


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8)
    model = LlamaForCausalLM(config).to("cuda").eval()
    model.generation_config.eos_token_id = None  # random weights: no EOS of their own
    # A prompt that repeats a span, as text that quotes itself does.
    span = torch.randint(1, config.vocab_size, (1, 12), device="cuda")
    ids = torch.cat([span, span, span[:, :6]], 1)

    plain = Generator(model, max_length=256)
    speculative = Generator(model, max_length=256, speculative=PromptLookup(tokens=4))
    times = {}
    for name, generator in (("plain", plain), ("speculative", speculative)):
        generator.generate(ids, max_new_tokens=NEW_TOKENS)  # captures
        torch.cuda.synchronize()
        begin = time.perf_counter()
        out = generator.generate(ids, max_new_tokens=NEW_TOKENS)
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - begin
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=0)
    assert torch.equal(out, expected), "tokens differ from transformers' greedy generate"
    stats = speculative.stats()
    steps, kept = stats.speculative_steps, stats.speculative_tokens
    print(f"{NEW_TOKENS} tokens equal to greedy generate; {kept} tokens in {steps} verify "
          f"steps ({(kept - steps) / (4 * steps):.0%} of the drafts kept); "
          f"{times['plain'] * 1e3:.1f} ms plain, {times['speculative'] * 1e3:.1f} ms "
          f"speculative")


if __name__ == "__main__":
    main()

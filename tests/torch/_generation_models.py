"""Models for the Generator's speculative-decoding tests."""

from __future__ import annotations

VOCAB, CYCLE = 511, 7  # 73 cycles of 7 tokens


def cycling_model(torch, device: str = "cpu", dtype=None):
    """A Llama whose greedy next token is ``successor[token]``, and ``successor``: the
    residual stream keeps the token's embedding (every attention and MLP output projection
    zeroed), and the head's row of each token's successor is that token's embedding. Every
    sequence continues along cycles of ``CYCLE`` tokens, which prompt lookup predicts."""
    from cugraphrt.bench.generate_models import causal_lm

    model = causal_lm("llama", vocab=VOCAB)
    successor = torch.arange(VOCAB).view(-1, CYCLE).roll(-1, 1).flatten()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding = model.model.embed_tokens.weight
        head = torch.empty_like(embedding)
        head[successor] = embedding
        model.lm_head.weight.copy_(head)
    model.generation_config.eos_token_id = None
    return model.to(device, dtype or torch.float32), successor.to(device)


def one_row_ahead(torch, device: str = "cpu"):
    """The cycling model and 3 left-padded prompts (5, 12 and 9 tokens), row 1's walking its
    cycle twice: its drafts are right from the first step, and it runs ahead of the others."""
    from ._generation_prompts import prompts

    model, successor = cycling_model(torch, device)
    ids, mask = prompts(torch, [5, 12, 9], VOCAB, seed=4, device=device)
    walk = [int(ids[1, -1])]
    for _ in range(11):
        walk.append(int(successor[walk[-1]]))
    ids[1] = torch.tensor(walk, device=device)
    return model, ids, mask

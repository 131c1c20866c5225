"""Prompts for the Generator tests: random tokens, left-padded as transformers expects."""

from __future__ import annotations


def prompts(torch, lengths: list[int], vocab: int, seed: int = 1, device: str = "cpu"):
    """``(ids, mask)``: a prompt of each length, left-padded with token 0 (mask 0 there)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
        ids[row, :width - n] = 0
    return ids.to(device), mask.to(device)

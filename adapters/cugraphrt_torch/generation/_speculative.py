"""Speculative decoding in the Generator's device loop: prompt lookup drafts, one forward of
the target verifies them, the longest agreeing prefix is kept.

A step of :meth:`Speculator.step` (the body of a decode chunk's ``while_loop``), all on the
device, shapes fixed:

1. **Draft** (:func:`prompt_lookup`): the last ``ngram`` tokens of each row are looked for
   earlier in the row (prompt and tokens so far, padding excluded); the ``tokens`` that
   followed the latest match are the draft. A row without a match drafts repeats of its
   last token, which verification simply rejects.
2. **Verify**: the model runs once on the fed token and the drafts (``tokens + 1``
   positions), over the KV cache, and its greedy choice at every position is read.
3. **Accept**: a draft token stands while it equals the greedy choice before it; the rows
   move together (one write position per cache layer, as transformers' ``StaticCache``
   keeps): every running row takes ``a`` tokens, ``a`` one more than the fewest drafts any
   running row got right, at most what is left to generate, and no more than the step where
   every row has emitted its EOS. Each of those tokens is the target's greedy choice at its
   position, so the sequence is greedy decoding's, in fewer forwards.
4. **Roll back**: the cache's write counters are set back to the kept length; the entries
   written for rejected drafts are masked (their mask positions go back to 0) and are
   overwritten by the next step.

A verify forward reads ``tokens + 1`` positions where greedy decoding reads one: the
matrix products round as a batch of that many rows does, which can differ from one row in
the last bit. In float32 that does not reach a token in practice; in bfloat16 a near tie
can (docs/generation.md, "Speculative decoding").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cugraphrt.errors import OptionsError

from .._internals import tensors as _tensors

__all__ = ["PromptLookup", "DraftModel", "Speculator", "prompt_lookup"]


@dataclass(frozen=True)
class PromptLookup:
    """Speculative decoding by prompt lookup (n-gram drafts from the sequence so far).

    Parameters
    ----------
    tokens : int, default 4
        Draft tokens per step: a step verifies this many and keeps 1 to ``tokens + 1``.
    ngram : int, default 3
        Length of the trailing n-gram looked up.
    """

    tokens: int = 4
    ngram: int = 3

    def __post_init__(self) -> None:
        for name in ("tokens", "ngram"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionsError(f"speculative.{name}", value, "an integer >= 1")


@dataclass(frozen=True, eq=False)
class DraftModel:
    """Speculative decoding with a draft model: a smaller causal LM with the target's
    vocabulary drafts ``tokens`` tokens greedily, one forward each, in the same graph and
    the same memory pool as the target (its own KV cache, the target's positions and mask).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The draft: the same vocabulary (tokenizer) as the target, on the same device, in
        ``eval()`` mode; a model whose layers have full or sliding-window attention.
    tokens : int, default 4
        Draft tokens per step: a step verifies this many and keeps 1 to ``tokens`` (the
        draft's cache holds the kept ones; the token after all of them would need one more
        draft forward, so a step keeps at most ``tokens``).
    """

    model: Any
    tokens: int = 4

    def __post_init__(self) -> None:
        value = self.tokens
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionsError("speculative.tokens", value, "an integer >= 1")
        if not callable(self.model) or not hasattr(self.model, "config"):
            raise OptionsError("speculative.model", type(self.model).__name__,
                               "a Hugging Face causal LM")


def prompt_lookup(ids: torch.Tensor, mask: torch.Tensor, cur: torch.Tensor, ngram: int,
                  tokens: int) -> torch.Tensor:
    """``(rows, tokens)`` drafts: what followed the latest earlier occurrence of each row's
    last ``ngram`` tokens (``ids[:, :cur]``, positions with ``mask`` 0 never match); the
    last token where nothing matches or nothing followed yet."""
    rows, length = ids.shape
    steps = torch.arange(ngram, device=ids.device)
    tail = ids.index_select(1, (cur - ngram + steps).clamp(min=0))
    windows = ids.unfold(1, ngram, 1)                      # (rows, starts, ngram)
    real = mask.unfold(1, ngram, 1).bool().all(-1)
    starts = torch.arange(windows.shape[1], device=ids.device)
    # A window that ends before the tail begins, so that a token follows it in the row.
    found = (windows == tail[:, None, :]).all(-1) & real & (starts + ngram < cur)
    best = torch.where(found, starts, -1).max(1).values    # (rows,)
    follow = best[:, None] + ngram + torch.arange(tokens, device=ids.device)
    drafts = ids.gather(1, follow.clamp(0, length - 1))
    last = ids.index_select(1, (cur - 1).view(1))          # (rows, 1)
    usable = (best[:, None] >= 0) & (follow < cur)
    return torch.where(usable, drafts, last)


class Speculator:
    """One speculative step of a :class:`~._generation_program.Program` (its model, state,
    cache views and write counters), and the counts of its steps and tokens. ``draft``: the
    draft model's program (over the same state, its own cache), with :class:`DraftModel`."""

    def __init__(self, program: Any, options: PromptLookup | DraftModel,
                 draft: Any = None) -> None:
        self.program = program
        self.options = options
        self.draft = draft
        #: What a step keeps at most: a draft model's cache lacks the last draft's entry.
        self.most = options.tokens + (0 if draft is not None else 1)
        device = program.state.ids.device
        self.offsets = torch.arange(options.tokens + 1, device=device)
        #: Verify forwards run, and tokens they kept (for the acceptance rate).
        self.counts = torch.zeros(2, dtype=torch.int64, device=device)

    def within(self, length: int) -> torch.Tensor:
        """The chunk loop's condition: some row runs, and a step's ``tokens + 1`` cache
        writes (from position ``cur - 1``) fit ``length`` positions."""
        state = self.program.state
        return torch.logical_and(state.running, state.cur + self.options.tokens <= length)

    def step(self, rows: int, length: int) -> None:
        program, state, k = self.program, self.program.state, self.options.tokens
        ids, mask = state.ids[:rows], state.mask[:rows]
        finished = state.finished[:rows]
        drafted = state.cur + self.offsets[:k]
        mask.index_fill_(1, drafted, 1)  # the drafts attend to each other causally
        options = self.options
        drafts = prompt_lookup(ids, mask, state.cur, options.ngram, k) \
            if isinstance(options, PromptLookup) else self._draft(rows, length)
        fed = torch.cat([state.next_ids[:rows], drafts], 1)
        positions = state.next_pos[:rows] + self.offsets
        greedy = program.forward_all(program.view(rows, length), fed, positions).argmax(-1)
        # Drafts each running row got right, in a row from the first.
        right = (drafts == greedy[:, :k]).int().cumprod(1).sum(1)
        take = torch.where(finished, k, right).min() + 1
        take = torch.minimum(torch.clamp(take, max=self.most), state.max_len - state.cur)
        tokens = torch.where(finished[:, None], state.pad, greedy)
        eos = (tokens[..., None] == state.eos).any(-1) & (self.offsets < take)
        # Past a row's first EOS: padding, as generate writes.
        tokens = torch.where(eos.int().cumsum(1) - eos.int() > 0, state.pad, tokens)
        # No step past the one where every row has emitted its EOS.
        first = torch.where(eos.any(1), eos.int().argmax(1), k + 1)
        first = torch.where(finished, -1, first)
        take = torch.minimum(take, first.max() + 1)
        kept = self.offsets < take
        at = state.cur + self.offsets
        ids.index_copy_(1, at, tokens)
        mask.index_copy_(1, at, kept.expand(rows, -1).to(mask.dtype))
        finished.logical_or_((eos & kept).any(1))
        state.next_ids[:rows].copy_(tokens.index_select(1, (take - 1).view(1)))
        state.next_pos[:rows].add_(take)
        state.cur.add_(take)
        # The cache keeps the entries of the fed token and the kept drafts.
        counters = program.cache_counters()
        _tensors.foreach_copy(counters, [state.cur - 1] * len(counters))
        self.counts.add_(torch.stack([torch.ones_like(take), take]))
        torch.logical_and(finished.logical_not().any(), state.cur < state.max_len,
                          out=state.running)

    def _draft(self, rows: int, length: int) -> torch.Tensor:
        """``(rows, tokens)`` greedy drafts of the draft model, one forward each over its
        cache, from the fed token on (the drafts' mask positions are set already)."""
        draft, state = self.draft, self.program.state
        view = draft.view(rows, length)
        fed, positions = state.next_ids[:rows], state.next_pos[:rows]
        drafts = []
        for step in range(self.options.tokens):
            fed = draft.forward_all(view, fed, positions + step)[:, -1].argmax(-1, keepdim=True)
            drafts.append(fed)
        return torch.cat(drafts, 1)

    def prefill(self, rows: int, prompt_bucket: int, length: int) -> None:
        """The prompt through the draft model into its cache (after the target's prefill:
        the same ids, mask and positions), its write counters at the prompt's length."""
        if self.draft is None:
            return
        draft, state = self.draft, self.program.state
        mask = state.mask[:rows, :prompt_bucket]
        positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)
        _tensors.foreach_zero(draft.counters)
        draft.forward_all(draft.view(rows, length), state.ids[:rows, :prompt_bucket], positions)
        _tensors.foreach_copy(draft.counters, [state.prompt_len] * len(draft.counters))

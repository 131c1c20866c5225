"""Speculative decoding in the Generator's device loop: prompt lookup (or a draft model)
drafts, one forward of the target verifies them, each row keeps its longest agreeing prefix.

A step of :meth:`Speculator.step` (the body of a decode chunk's ``while_loop``), all on the
device, shapes fixed. Each row ``r`` has its own length ``L[r]`` (prompt and tokens so far):

1. **Draft** (:func:`prompt_lookup`): the last ``ngram`` tokens of each row are looked for
   earlier in the row (prompt and tokens so far, padding excluded); the ``tokens`` that
   followed the latest match are the draft. A row without a match drafts repeats of its
   last token, which verification simply rejects. With a draft model, ``tokens`` greedy
   forwards of the draft.
2. **Verify**: the model runs once on each row's fed token and its drafts (``tokens + 1``
   positions), writing their keys at the row's own cache positions ``L[r] - 1`` on (a
   cache with a write position per row: :mod:`.._internals.row_cache`, with masks offset
   per row to match), and its greedy choice at every position is read.
3. **Accept**: a draft token stands while it equals the greedy choice before it; row ``r``
   keeps one more token than its right drafts (at most what it has left to generate, and
   up to its EOS). Each kept token is the target's greedy choice at its position, so each
   row's sequence is greedy decoding's, in fewer forwards; rows that draft well move ahead
   of rows that do not.
4. **Roll back**: nothing to undo in the cache: a row's next step writes from its new
   length on, over the entries of its rejected drafts, whose mask positions go back to 0.

A row's tokens stay contiguous (its cache and mask hold its own sequence, left padding
included, as generate's do), so a sliding window counts the same tokens as generate's. A
verify forward reads ``tokens + 1`` positions where greedy decoding reads one: the matrix
products round as a batch of that many rows does, which can differ from one row in the last
bit. In float32 that does not reach a token in practice; in bfloat16 a near tie can
(docs/generation.md, "Speculative decoding").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cugraphrt.errors import OptionsError

from .._internals import row_cache as _row_cache
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


def prompt_lookup(ids: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, ngram: int,
                  tokens: int) -> torch.Tensor:
    """``(rows, tokens)`` drafts: what followed the latest earlier occurrence of each row's
    last ``ngram`` tokens (``ids[r, :lengths[r]]``, positions with ``mask`` 0 never match);
    the row's last token where nothing matches or nothing followed yet. ``lengths``: one
    per row, or one for every row."""
    rows, length = ids.shape
    ends = lengths.view(-1, 1)                             # (rows or 1, 1)
    steps = torch.arange(ngram, device=ids.device)
    tail = ids.gather(1, (ends - ngram + steps).clamp(min=0).expand(rows, ngram))
    windows = ids.unfold(1, ngram, 1)                      # (rows, starts, ngram)
    real = mask.unfold(1, ngram, 1).bool().all(-1)
    starts = torch.arange(windows.shape[1], device=ids.device)
    # A window that ends before the tail begins, so that a token follows it in the row.
    found = (windows == tail[:, None, :]).all(-1) & real & (starts + ngram < ends)
    best = torch.where(found, starts, -1).max(1).values    # (rows,)
    follow = best[:, None] + ngram + torch.arange(tokens, device=ids.device)
    drafts = ids.gather(1, follow.clamp(0, length - 1))
    last = ids.gather(1, (ends - 1).expand(rows, 1))       # (rows, 1)
    usable = (best[:, None] >= 0) & (follow < ends)
    return torch.where(usable, drafts, last)


class Speculator:
    """One speculative step of a :class:`~._generation_program.Program` (its model, state,
    per-row cache and its write positions), each row's length, and the counts of its steps
    and tokens. ``draft``: the draft model's program (over the same state, its own per-row
    cache), with :class:`DraftModel`."""

    def __init__(self, program: Any, options: PromptLookup | DraftModel,
                 draft: Any = None) -> None:
        self.program = program
        self.options = options
        self.draft = draft
        #: What a step keeps at most: a draft model's cache lacks the last draft's entry.
        self.most = options.tokens + (0 if draft is not None else 1)
        state = program.state
        device = state.ids.device
        self.offsets = torch.arange(options.tokens + 1, device=device)
        #: Each row's length: its prompt (padding included) and the tokens it has so far.
        self.lengths = torch.zeros(state.rows, dtype=torch.int64, device=device)
        #: Row-steps run (a verify forward counts once per running row) and the tokens they
        #: kept, for the acceptance rate.
        self.counts = torch.zeros(2, dtype=torch.int64, device=device)

    def within(self, length: int) -> torch.Tensor:
        """The chunk loop's condition: some row runs, and a step's ``tokens + 1`` cache
        writes (from position ``L - 1`` of the longest row) fit ``length`` positions."""
        state = self.program.state
        return torch.logical_and(state.running, state.cur + self.options.tokens <= length)

    def step(self, rows: int, length: int) -> None:
        program, state, k = self.program, self.program.state, self.options.tokens
        ids, mask = state.ids[:rows], state.mask[:rows]
        finished, lengths = state.finished[:rows], self.lengths[:rows]
        # Where this step's tokens go in each row (a finished row's are padding; clamped so
        # that a row finished at the last position writes inside the state).
        at = (lengths[:, None] + self.offsets).clamp(max=ids.shape[1] - 1)
        mask.scatter_(1, at[:, :k], 1)  # the drafts attend to each other causally
        options = self.options
        drafts = prompt_lookup(ids, mask, lengths, options.ngram, k) \
            if isinstance(options, PromptLookup) else self._draft(rows, length)
        fed = torch.cat([state.next_ids[:rows], drafts], 1)
        positions = state.next_pos[:rows] + self.offsets
        start = lengths - 1  # the fed token's cache position, in each row
        program.row_starts[:rows].copy_(start)
        scores = program.forward_all(program.view(rows, length), fed, positions,
                                     self._masks(program, rows, length, start, k + 1))
        greedy = scores.argmax(-1)
        # Drafts each row got right, in a row from the first; what it may keep.
        right = (drafts == greedy[:, :k]).int().cumprod(1).sum(1)
        take = torch.minimum(torch.clamp(right + 1, max=self.most), state.max_len - lengths)
        tokens = torch.where(finished[:, None], state.pad, greedy)
        eos = (tokens[..., None] == state.eos).any(-1) & (self.offsets < take[:, None])
        # A row stops at its first EOS.
        take = torch.where(eos.any(1), torch.minimum(take, eos.int().argmax(1) + 1), take)
        take = torch.where(finished, 0, take)
        kept = self.offsets < take[:, None]
        ids.scatter_(1, at, torch.where(kept, tokens, state.pad))
        mask.scatter_(1, at, kept.to(mask.dtype))
        last = tokens.gather(1, (take - 1).clamp(min=0)[:, None])
        state.next_ids[:rows].copy_(torch.where(take[:, None] > 0, last, state.next_ids[:rows]))
        state.next_pos[:rows].add_(take[:, None])
        running = finished.logical_not()
        self.counts.add_(torch.stack([running.sum(), take.sum()]))
        lengths.add_(take)
        finished.logical_or_((eos & kept).any(1) | (lengths >= state.max_len))
        state.cur.copy_(lengths.max())
        # The columns every row has settled: up to the shortest running row's length.
        state.settled.copy_(torch.where(finished, state.cur, lengths).min())
        state.running.copy_(finished.logical_not().any())

    def _masks(self, program: Any, rows: int, length: int, start: torch.Tensor,
               queries: int) -> Any:
        return _row_cache.row_masks(program.model.config, program.state.mask[:rows, :length],
                                    start, queries, program.dtype)

    def _draft(self, rows: int, length: int) -> torch.Tensor:
        """``(rows, tokens)`` greedy drafts of the draft model, one forward each over its
        cache, from the fed token on (the drafts' mask positions are set already)."""
        draft, state = self.draft, self.program.state
        view = draft.view(rows, length)
        fed, positions = state.next_ids[:rows], state.next_pos[:rows]
        start = self.lengths[:rows] - 1
        drafts = []
        for step in range(self.options.tokens):
            draft.row_starts[:rows].copy_(start + step)
            masks = self._masks(draft, rows, length, start + step, 1)
            fed = draft.forward_all(view, fed, positions + step, masks)[:, -1].argmax(
                -1, keepdim=True)
            drafts.append(fed)
        return torch.cat(drafts, 1)

    def restart(self, rows: int) -> None:
        """Each row's length from the staged state's (before a warm-up step)."""
        state = self.program.state
        self.lengths[:rows].copy_(state.cur.expand(rows))
        state.settled.copy_(state.cur)

    def prefill(self, rows: int, prompt_bucket: int, length: int) -> None:
        """After the target's prefill (before its first token): each row's length, and the
        prompt through the draft model into its cache (the same ids, mask and positions)."""
        state = self.program.state
        self.lengths[:rows].copy_((state.prompt_len + 1).expand(rows))
        state.settled.copy_(state.prompt_len + 1)
        if self.draft is None:
            return
        draft = self.draft
        mask = state.mask[:rows, :prompt_bucket]
        positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)
        # Its masks read its counters: 0 for a prompt from the start.
        _tensors.foreach_zero(draft.write_positions())
        draft.forward_all(draft.view(rows, length), state.ids[:rows, :prompt_bucket], positions)

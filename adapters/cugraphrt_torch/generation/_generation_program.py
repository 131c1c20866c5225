"""The device program of :class:`cugraphrt_torch.Generator`: its state and its two bodies.

Every tensor the program reads or writes lives in :class:`GenerationState`, allocated once for
the largest batch bucket and the longest sequence; a batch bucket of ``n`` rows works on the
first ``n`` rows of each, and a cache bucket of ``m`` positions on the first ``m`` positions
of the cache (views, no copies). The bodies are plain torch code over that state, so the same
code runs eagerly (``graphed=False``, any device) and inside captures: the prefill once per
(batch bucket, prompt bucket), the decode step as the body of a device-side ``while_loop``
once per (batch bucket, cache bucket).

What the bodies compute is what Hugging Face's greedy ``generate`` computes with a
``StaticCache`` (transformers 5.x), step for step:

* the 2-D attention mask of the whole sequence, prompt padding as 0, every token written so
  far as 1, positions not yet written as 0 (``generate`` concatenates a 1 per step, and the
  static cache pads the rest with 0s);
* position ids from the mask: ``cumsum(mask) - 1``, 0 on padding, then +1 per step;
* the prompt right-padded to its bucket with tokens the causal mask keeps every real token
  from seeing; the logits taken at the last real position (``logits_to_keep``), and the
  cache's write counters set back to the real prompt length, so that decoding overwrites
  the padding's entries before any query may read them;
* greedy ``argmax`` (or, with a sampler, transformers' logits processors and a draw: see
  :mod:`._sampling`); a finished sequence gets ``pad_token_id``; a sequence finishes at one
  of the EOS ids; the loop stops when every sequence finished or the length reached
  ``prompt + max_new_tokens``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .._internals import compile as _compile
from .._internals import row_cache as _row_cache
from .._internals import tensors as _tensors
from .._internals import transformers as _transformers
from .._internals import window_cache as _window_cache
from ..compile._eager_kernels import Numerics, inductor_backend
from ..inference import expert_matmul as _expert_matmul
from ._sampling import Sampler
from ._speculative import DraftModel, PromptLookup, Speculator

__all__ = ["GenerationState", "Program", "MAX_EOS"]

#: EOS ids a generator compares against (unused slots hold -1, which no token equals).
MAX_EOS = 8

# Slots of GenerationState.scalars (one int64 vector: one copy stages them, one reads them).
CUR, MAX_LEN, PAD, PROMPT, LAST, RUNNING, SETTLED = range(7)


class GenerationState:
    """The program's device state, for ``rows`` sequences of up to ``length`` tokens."""

    def __init__(self, rows: int, length: int, device: torch.device) -> None:
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.rows, self.length = rows, length
        self.ids = zeros(rows, length)        # prompt, then the tokens generated
        self.mask = zeros(rows, length)       # the 2-D attention mask (see the module doc)
        self.next_ids = zeros(rows, 1)        # the token each decode step feeds
        self.next_pos = zeros(rows, 1)        # and its position id
        self.finished = zeros(rows, dtype=torch.bool)
        self.eos = torch.full((MAX_EOS,), -1, dtype=torch.int64, device=device)
        self.scalars = zeros(7)
        self.cur = self.scalars[CUR]          # tokens in the sequence so far (prompt included)
        self.max_len = self.scalars[MAX_LEN]  # prompt + max_new_tokens
        self.pad = self.scalars[PAD]
        self.prompt_len = self.scalars[PROMPT]
        self.last = self.scalars[LAST:LAST + 1]  # the last prompt position, as logits_to_keep
        self.running = self.scalars[RUNNING]  # the loop's condition (0-d int64)
        #: With speculative decoding, where rows' lengths differ: the columns every row has
        #: settled (the shortest running row's length; the longest once all finished).
        self.settled = self.scalars[SETTLED]

    def stage(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: int,
              max_new_tokens: int, pad: int, eos: list[int]) -> None:
        """Load one call's prompt into the first ``rows`` rows (a bucket): rows past the
        batch repeat its last sequence and start finished (they never hold the loop)."""
        batch, prompt = input_ids.shape
        self.ids[:batch, :prompt].copy_(input_ids)
        self.mask[:rows].zero_()
        self.mask[:batch, :prompt].copy_(attention_mask)
        if rows > batch:
            self.ids[batch:rows, :prompt].copy_(input_ids[-1:].expand(rows - batch, -1))
            self.mask[batch:rows, :prompt].copy_(attention_mask[-1:].expand(rows - batch, -1))
        self.finished[:batch].fill_(False)
        self.finished[batch:rows].fill_(True)
        eos_ids = eos + [-1] * (MAX_EOS - len(eos))
        # Past the prompt, padding: what a row that stops early reads as (speculative
        # decoding leaves a finished row's later columns unwritten).
        self.ids[:rows, prompt:].fill_(pad)
        values = [prompt, prompt + max_new_tokens, pad, prompt, prompt - 1, 1, prompt]
        # One host-to-device copy for the scalars and the EOS ids.
        staged = torch.tensor(values + eos_ids, dtype=torch.int64)
        self.scalars.copy_(staged[:7])
        self.eos.copy_(staged[7:])

    def read(self) -> tuple[int, bool]:
        """(tokens in the sequence, whether any sequence still runs); waits for the device."""
        values = self.scalars.tolist()
        return values[CUR], bool(values[RUNNING])

    def read_lengths(self) -> tuple[int, int, bool]:
        """(tokens in the longest sequence, columns every sequence has settled, whether any
        sequence still runs); waits for the device. Without speculative decoding the two
        lengths are one."""
        values = self.scalars.tolist()
        return values[CUR], values[SETTLED], bool(values[RUNNING])


class Program:
    """The prefill and decode bodies over one :class:`GenerationState` and one cache."""

    def __init__(self, model: Any, state: GenerationState, cache: Any,
                 numerics: Numerics | None = None, steps: int = 1,
                 sampler: Sampler | None = None,
                 speculative: PromptLookup | DraftModel | None = None,
                 draft_cache: Any = None) -> None:
        self.model = model
        self.state = state
        self.cache = cache
        #: With sampling: the rows' settings and random streams (a step draws its noise
        #: before the step, outside the compiled code: the draw is a CuPy kernel).
        self.sampler = sampler
        # Decode steps on a GPU run a mixture-of-experts model's experts as transformers'
        # batched_mm, as generate's decoding does (_optimize_model_for_decode), which is also
        # what a capture can record (no routing read on the host): its forward, with each
        # projection reading the experts' weights in place where that gives its bits
        # (expert_matmul); the prefill keeps the model's own, as generate's. On the CPU
        # generate keeps the model's own throughout.
        self._decode_experts: Callable[[], contextlib.AbstractContextManager[Any]] = (
            (lambda: _transformers.graph_safe_experts(model, _expert_matmul.register()))
            if state.ids.device.type == "cuda" else contextlib.nullcontext)
        self.views: dict[tuple[int, int], Any] = {}
        self.counters = _transformers.write_counters(cache)
        #: With speculative decoding, each row's write position (a per-row cache), else None.
        self.row_starts = _row_cache.row_starts(cache)
        #: Whether sliding-window layers are rings attending over generate's keys (their
        #: masks built here, over those positions: window_cache), else full-length layers
        #: attending over the whole view, the window masked.
        self.windowed = any(_window_cache.is_window_layer(layer) for layer in cache.layers)
        self.dtype = next(model.parameters()).dtype  # what an additive mask is made in
        parameters = inspect.signature(model.forward).parameters
        self.keeps_logits = "logits_to_keep" in parameters
        # The decode step, compiled by Inductor (no CUDA graphs of its own: the generator
        # captures it) under ``numerics`` when given: the forward and the choice, whose
        # integer bookkeeping Inductor fuses into a few kernels (exactly: no rounding in it).
        # One compilation per decode graph (``steps`` of them): dynamo's recompile limit
        # (8 per function) must allow as many. Dynamo keeps compilations per code object,
        # so the step gets one of its own: another program's compilations (a second
        # generator in the process) neither count against this one's limit, which would
        # leave this step to run uncompiled, nor outlive their program.
        self.step = self._step if numerics is None else torch.compile(
            _compile.own_code(self._step), backend=inductor_backend(numerics), dynamic=False)
        self.compiled = numerics is not None
        self._recompile_limit = max(8, steps)
        #: With speculative decoding: the step that drafts, verifies and accepts
        #: (:mod:`._speculative`), the decode loop's body in place of one greedy step.
        # A draft model runs as a program of its own over the same state and its own cache.
        draft = Program(speculative.model, state, draft_cache) \
            if isinstance(speculative, DraftModel) else None
        self.speculator = Speculator(self, speculative, draft) \
            if speculative is not None else None

    def write_positions(self) -> list[torch.Tensor]:
        """This program's cache write positions: its layers' counters, and a per-row cache's
        row starts."""
        return [*self.counters, *([self.row_starts] if self.row_starts is not None else [])]

    def cache_counters(self) -> list[torch.Tensor]:
        """Every cache write position a decode step moves: the model's, and a draft model's
        (their per-row positions with speculative decoding)."""
        programs = [self]
        if self.speculator is not None and self.speculator.draft is not None:
            programs.append(self.speculator.draft)
        return [t for p in programs for t in p.write_positions()]

    def warm_up(self, dummy: torch.Tensor, rows: int, body: Callable[[], None]) -> None:
        """``body`` (a prefill or a decode step) run once on the ``dummy`` prompt, before its
        capture: shorter than the cache, every write position at its start (a draft
        model's and the rows' lengths too: left where the last call ended, the writes would
        run past the cache's end), so that the warm-up writes inside the cache and every
        value it writes there is finite. A warm-up step is not a step of any call: the
        speculative counts stay as they were."""
        self.state.stage(dummy, torch.ones_like(dummy), rows, 1, 0, [])
        _tensors.foreach_zero(self.cache_counters())
        speculator = self.speculator
        if speculator is None:
            body()
            return
        speculator.restart(rows)
        counts = speculator.counts.clone()
        body()
        speculator.counts.copy_(counts)

    def view(self, rows: int, length: int) -> Any:
        """The cache over the first ``rows`` sequences and ``length`` positions."""
        view = self.views.get((rows, length))
        if view is None:
            view = self.views[rows, length] = _transformers.cache_view(self.cache, rows, length)
        return view

    def _forward(self, view: Any, ids: torch.Tensor, positions: torch.Tensor,
                 keep: torch.Tensor | int) -> torch.Tensor:
        """The model on ``ids`` over ``view``: the logits at the kept positions,
        ``(rows, vocab)``."""
        rows, length = ids.shape[0], _transformers.view_length(view)
        kwargs = {"logits_to_keep": keep} if self.keeps_logits else {}
        logits = self.model(input_ids=ids, attention_mask=self._masks(rows, length, ids.shape[1]),
                            position_ids=positions, past_key_values=view, use_cache=True,
                            **kwargs).logits
        if not self.keeps_logits:
            index = keep if isinstance(keep, torch.Tensor) else \
                torch.full((1,), ids.shape[1] - 1, dtype=torch.int64, device=ids.device)
            logits = logits.index_select(1, index)
        return logits[:, -1]

    def forward_all(self, view: Any, ids: torch.Tensor, positions: torch.Tensor,
                    masks: Any = None) -> torch.Tensor:
        """The model on ``ids`` over ``view``: the logits at every position,
        ``(rows, positions, vocab)``. ``masks``: prepared masks (a per-row cache's), else
        the state's 2-D mask."""
        rows, length = ids.shape[0], _transformers.view_length(view)
        kwargs = {"logits_to_keep": 0} if self.keeps_logits else {}  # 0: every position
        if masks is None:
            masks = self._masks(rows, length, ids.shape[1])
        return self.model(input_ids=ids, attention_mask=masks,
                          position_ids=positions, past_key_values=view, use_cache=True,
                          **kwargs).logits

    def _masks(self, rows: int, length: int, queries: int) -> Any:
        """The state's 2-D mask over ``length`` positions, for the model to build its masks
        from; with window layers, the masks themselves (the forward's first query at the
        layers' write counter)."""
        padding = self.state.mask[:rows, :length]
        if not self.windowed:
            return padding
        return _window_cache.window_masks(self.model.config, padding, self.counters[0],
                                          queries, self.dtype)

    def prefill(self, rows: int, prompt_bucket: int, length: int) -> None:
        """The prompt (right-padded to ``prompt_bucket``) through the model, attending over
        ``length`` cache positions, then the first token."""
        state = self.state
        _tensors.foreach_zero(self.write_positions())  # a per-row cache's from 0 too
        if self.windowed:  # a ring shorter than the prompt bucket keeps the real prompt's end
            _window_cache.set_prompt_end(self.cache, state.prompt_len)
        if self.sampler is not None:
            self.sampler.draw()
        mask = state.mask[:rows, :prompt_bucket]
        positions = mask.cumsum(-1) - 1
        positions.masked_fill_(mask == 0, 0)
        scores = self._forward(self.view(rows, length), state.ids[:rows, :prompt_bucket],
                               positions, state.last)
        # The cache holds the real prompt; decoding overwrites the padding's entries.
        _tensors.foreach_copy(self.counters, [state.prompt_len] * len(self.counters))
        if self.speculator is not None:  # a draft model's cache takes the prompt too
            self.speculator.prefill(rows, prompt_bucket, length)
        torch.sum(mask, -1, keepdim=True, out=state.next_pos[:rows])
        self._choose(rows, scores)

    def decode(self, rows: int, length: int) -> None:
        """One decode step of the first ``rows`` sequences over ``length`` cache positions (a
        while_loop body)."""
        with self._decode_experts():
            if self.speculator is not None:
                self.speculator.step(rows, length)
                return
            if self.sampler is not None:
                self.sampler.draw()
            if not self.compiled:
                self._step(self.view(rows, length), rows)
                return
            with _compile.recompile_limit(self._recompile_limit):
                self.step(self.view(rows, length), rows)

    def _step(self, view: Any, rows: int) -> None:
        state = self.state
        scores = self._forward(view, state.next_ids[:rows], state.next_pos[:rows], 1)
        state.next_pos[:rows].add_(1)
        self._choose(rows, scores)

    def within(self, length: int) -> torch.Tensor:
        """The decode loop's condition over ``length`` cache positions: some sequence runs,
        and the next step's token (at position ``cur - 1``) fits them (with speculative
        decoding: the step's drafts too)."""
        if self.speculator is not None:
            return self.speculator.within(length)
        return torch.logical_and(self.state.running, self.state.cur <= length)

    def _choose(self, rows: int, scores: torch.Tensor) -> None:
        """Greedy choice (or the sampler's), appended; EOS and length checks; whether any
        sequence runs."""
        state, sampler = self.state, self.sampler
        finished = state.finished[:rows]
        choice = scores.argmax(-1) if sampler is None else sampler.choose(rows, scores)
        token = torch.where(finished, state.pad, choice)
        if sampler is not None:  # what the repetition penalty sees, pad tokens too
            sampler.seen(rows, token)
        at = state.cur.view(1)
        state.ids[:rows].index_copy_(1, at, token[:, None])
        state.mask[:rows].index_fill_(1, at, 1)
        finished.logical_or_((token[:, None] == state.eos).any(-1))
        state.next_ids[:rows].copy_(token[:, None])
        state.cur.add_(1)
        torch.logical_and(finished.logical_not().any(), state.cur < state.max_len,
                          out=state.running)

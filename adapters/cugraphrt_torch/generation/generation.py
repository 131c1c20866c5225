"""cugraphrt_torch.Generator: generation of a Hugging Face causal LM on the device.

A generation is one prefill launch and then chunks of up to ``chunk`` decode steps, each
chunk one launch of a graph whose ``while_loop`` runs the decode step, the greedy choice, the
append and the EOS and length checks on the device: the host waits once per chunk, not once
per token. Graphs are captured on first use, per batch bucket (the decode chunk) and per
(batch bucket, prompt bucket) (the prefill), all into one memory pool; one StaticCache for the
largest batch serves every bucket (each bucket reads its first rows).

Design notes. Every graph reads and writes only the generator's state tensors, allocated
outside the pool, and keeps nothing alive in the pool once its capture ended: so the graphs
may replay in any order (the pool's capture-order rule guards graphs that hand out pool
memory, which these never do), and they replay through torch's own replay on torch's current
stream. A generator runs one generation at a time (its state is one).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cugraphrt import Graph, MemPool
from cugraphrt.errors import OptionsError

from .._internals import transformers as _transformers
from ..capture import _torch
from ..capture.capture import warmed_graph
from ..capture.cuda_graph import graph_pool_handle
from ..control.control import while_loop
from ._generation_checks import (
    bucket,
    check_prompt,
    model_device,
    special_tokens,
    speculative_options,
    static_cache,
    step_numerics,
    vocab_size,
)
from ._generation_options import generator_options
from ._generation_program import GenerationState, Program
from ._ranks import agree, split_groups
from ._sampling import SETTINGS, Sampler, call_settings
from ._speculative import DraftModel, PromptLookup

__all__ = ["Generator", "GeneratorStats"]


@dataclass(frozen=True)
class GeneratorStats:
    """What a :class:`Generator` holds.

    Attributes
    ----------
    prefill_graphs : tuple of (int, int)
        The (batch bucket, prompt bucket) pairs with a captured prefill.
    decode_graphs : tuple of (int, int)
        The (batch bucket, cache bucket) pairs with a captured decode chunk.
    capture_s : float
        Seconds spent warming up and capturing, in all.
    pool_reserved_bytes : int
        Device memory the graphs' pool reserves (their temporaries, shared).
    state_bytes : int
        Device memory of the KV cache (and a draft model's) and the generator's state
        tensors.
    speculative_steps : int
        With ``speculative``: the row-steps run so far (a verify forward counts once for
        each row still generating; each drafted and checked ``speculative.tokens`` tokens).
    speculative_tokens : int
        The tokens those row-steps kept (1 to ``tokens + 1`` each): the acceptance rate is
        ``(speculative_tokens - speculative_steps) / (speculative_steps * tokens)``.
    """

    prefill_graphs: tuple[tuple[int, int], ...]
    decode_graphs: tuple[tuple[int, int], ...]
    capture_s: float
    pool_reserved_bytes: int
    state_bytes: int
    speculative_steps: int = 0
    speculative_tokens: int = 0


class Generator:
    """Greedy or sampled generation for a Hugging Face causal LM, many tokens per launch.

    ``Generator(model, max_length=512).generate(input_ids, attention_mask, max_new_tokens=
    128)`` returns what ``model.generate(input_ids, attention_mask=attention_mask,
    max_new_tokens=128, do_sample=False)`` returns: the prompts (left-padded, as
    ``generate`` expects) followed by the new tokens, ``pad_token_id`` after a sequence's EOS,
    as many columns as the longest sequence needed.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder-only model whose layers have full or sliding-window attention (a
        sliding-window layer is cached in a ring of the window's length and attends over
        ``generate``'s keys: see docs/generation.md), on a CUDA device unless
        ``graphed=False``. Put it in ``eval()``
        mode; weights must not move afterwards (the graphs read them in place).
    max_length : int
        The longest sequence served: prompt plus new tokens. The KV cache holds this many
        positions for the largest batch bucket.
    batch_buckets : sequence of int, default (1, 2, 4, 8)
        Batch sizes with graphs of their own; a batch runs in the smallest bucket that holds
        it (its extra rows repeat its last sequence, finished from the start). Every bucket
        list is strictly increasing, as ``make_graphed``'s ``buckets`` (never sorted for you).
    prompt_buckets : sequence of int, optional
        Prompt lengths with prefill graphs of their own; a prompt is right-padded to the
        smallest that holds it. Default: 16, 32, 64, ... up to ``max_length``.
    cache_buckets : sequence of int, optional
        Cache lengths the attention reads: each step attends over the smallest that holds
        the sequence so far, not the whole cache. Default: 64, 128, 192, ... up to
        ``max_length``: as many 64-key blocks as eager's growing cache has at that step, so
        the attention kernels split and reduce the keys as they do in eager (over many more
        keys they split them otherwise, and a token can change; docs/generation.md).
    chunk : int, default 32
        Decode steps per launch at most; the host sees tokens (and ``callback`` runs) after
        each chunk, and where the sequence outgrows a cache bucket.
    compile_step : bool or "fast", default False
        Compile the decode step with Inductor, one compilation per (batch bucket, cache
        bucket) used. True: under ``eager_numerics="exact"``, fused kernels where they
        round as eager's and eager's own kernels for reductions and math functions: eager's
        tokens, in about half the time of eager's kernels for a small model. ``"fast"``:
        under ``eager_numerics=True`` (eager's rounding, Inductor's reductions and math):
        about 15% faster again, but a token can part from eager's where two logits nearly
        tie (docs/generation.md).
    graphed : bool, default True
        False runs the same program eagerly (any device, a host check per step): a
        reference, and a way to run without a GPU.
    sampling : bool, default False
        Build the graphs with transformers' logits processors and a draw in every step, so
        that ``generate`` takes ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
        ``min_p``, ``repetition_penalty`` and per-row seeds (docs/generation.md,
        "Sampling"). Settings are device tensors the graphs read: changing them captures
        nothing. Without it the graphs are greedy only, and a bit faster.
    speculative : PromptLookup or DraftModel, optional
        Speculative greedy decoding: each step drafts ``speculative.tokens`` tokens (by
        prompt lookup from the sequence so far, or with a draft model), verifies them in one
        forward and keeps, in each row, the longest prefix greedy decoding agrees with,
        inside the decode loop (docs/generation.md, "Speculative decoding"). Not with
        ``sampling`` or ``compile_step``; the model (and a draft) with ``sdpa`` or ``eager``
        attention.

    Raises
    ------
    OptionsError
        For a bad option, a model without a ``StaticCache``-compatible layout, or a model on
        the CPU with ``graphed=True``.
    """

    def __init__(self, model: Any, *, max_length: int,
                 batch_buckets: Sequence[int] = (1, 2, 4, 8),
                 prompt_buckets: Sequence[int] | None = None,
                 cache_buckets: Sequence[int] | None = None, chunk: int = 32,
                 compile_step: bool | Literal["fast"] = False, graphed: bool = True,
                 sampling: bool = False,
                 speculative: PromptLookup | DraftModel | None = None) -> None:
        opts = generator_options(
            max_length=max_length, batch_buckets=batch_buckets, prompt_buckets=prompt_buckets,
            cache_buckets=cache_buckets, chunk=chunk, compile_step=compile_step,
            graphed=graphed, sampling=sampling)
        self.max_length, self.chunk = opts.max_length, opts.chunk
        self.batch_buckets = opts.batch_buckets
        self.prompt_buckets: tuple[int, ...] = opts.prompt_buckets or ()
        self.cache_buckets: tuple[int, ...] = opts.cache_buckets or ()
        self.speculative = speculative_options(speculative, sampling, opts.compile_step,
                                               model)
        # Room past max_length for a speculative step's drafts (its cache writes), and the
        # decode buckets that hold it: a step at length L writes up to L + tokens.
        self._room = self.speculative.tokens if self.speculative is not None else 0
        capacity = self.max_length + self._room
        self._decode_buckets = (*[b for b in self.cache_buckets if b < capacity], capacity) \
            if self._room else self.cache_buckets
        self.graphed = graphed
        self.model = model
        self.device = model_device(model)
        if graphed:
            if self.device.type != "cuda":
                raise OptionsError("model", f"a model on {self.device}",
                                   "a model on a CUDA device (or graphed=False)")
            _torch.require_cuda("cugraphrt_torch.Generator")
        # Speculative decoding keeps a write position per row (rows keep different counts).
        per_row = self.speculative is not None
        self._cache = static_cache(model, capacity, self.batch_buckets[-1], self.device,
                                   per_row)
        self.state = GenerationState(self.batch_buckets[-1], capacity, self.device)
        self._sampler = Sampler(self.batch_buckets[-1], vocab_size(model), self.device) \
            if sampling else None
        self._split = split_groups(model) if sampling else ()
        draft_cache = static_cache(self.speculative.model, capacity, self.batch_buckets[-1],
                                   self.device, per_row) \
            if isinstance(self.speculative, DraftModel) else None
        self._program = Program(model, self.state, self._cache,
                                step_numerics(opts.compile_step),
                                len(self.batch_buckets) * len(self._decode_buckets),
                                self._sampler, self.speculative, draft_cache)
        self.pool: MemPool | None = graph_pool_handle() if graphed else None
        self._prefills: dict[tuple[int, int], Callable[[], None]] = {}
        self._chunks: dict[tuple[int, int], Callable[[], None]] = {}
        self._graphs: list[Graph] = []
        self._capture_s = 0.0

    # -- generation ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 *, max_new_tokens: int, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None,
                 callback: Callable[[torch.Tensor], Any] | None = None,
                 seed: Any = None, **sampling: Any) -> torch.Tensor:
        """The tokens after ``input_ids``, as Hugging Face's ``generate`` returns them.

        Parameters
        ----------
        input_ids : torch.Tensor
            ``(batch, prompt)`` int64 token ids on the model's device, left-padded.
        attention_mask : torch.Tensor, optional
            ``(batch, prompt)``, 1 for tokens and 0 for padding; all ones if omitted.
        max_new_tokens : int
            New tokens per sequence at most; the prompt plus these must fit ``max_length``.
        eos_token_id : int or sequence of int, optional
            Default: the model's ``generation_config.eos_token_id``. None: no EOS check.
        pad_token_id : int, optional
            Written after a sequence's EOS. Default: the generation config's, else the first
            EOS id (as ``generate`` does).
        callback : callable, optional
            Called after the prefill and after each chunk with the tokens it added, a
            ``(batch, n)`` int64 tensor of its own; a true return value stops the generation
            there.
        seed : int, torch.Generator, or a sequence of them, optional
            With ``sampling=True``: each row's random stream. An int seeds row ``r`` with
            ``seed + r``; a ``torch.Generator`` gives each row a seed drawn from it; a
            sequence gives one per row. Default: seeds drawn from torch's default CPU
            generator (``torch.manual_seed`` makes the call reproducible). A row's draws
            depend on its seed only; its tokens also on its logits, which another batch
            bucket may round otherwise (docs/generation.md, "Sampling"). A model split
            over ranks (tensor parallelism) samples with the split's first rank's default
            seeds, and its ranks must give the same settings and explicit seeds, or every
            rank raises OptionsError.
        **sampling
            With ``sampling=True``: ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
            ``min_p``, ``repetition_penalty``, as ``generate`` takes them, defaulting to the
            model's ``generation_config`` (without ``do_sample``, greedy).

        Returns
        -------
        torch.Tensor
            ``(batch, prompt + n)`` int64: the prompts, then ``n`` new tokens, ``n`` the
            steps until every sequence emitted EOS or ``max_new_tokens``.
        """
        batch, prompt = check_prompt(input_ids, attention_mask, max_new_tokens,
                                     self.device, self.max_length)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        eos, pad = special_tokens(self.model, eos_token_id, pad_token_id)
        settings = self._sampling_settings(batch, seed, sampling)
        rows = bucket(batch, self.batch_buckets, "batch size", "batch_buckets")
        # Capture first (every graph this call may use): warm-ups run the bodies on the
        # state, which staging then resets.
        prefill = self._prefill(rows, prompt)
        chunks = {length: self._chunk(rows, length)
                  for length in self._cache_lengths(prompt, max_new_tokens)}
        state = self.state
        state.stage(input_ids, mask, rows, max_new_tokens, pad, eos)
        if self._sampler is not None:
            self._sampler.stage(settings, input_ids)
        prefill()
        # ``length``: the longest sequence (the cache bucket's need); ``settled``: the
        # columns every sequence has (they differ with speculative decoding's rows).
        length, settled, running = self._read()
        seen = prompt
        while True:
            if callback is not None and settled > seen:
                if callback(state.ids[:batch, seen:settled].clone()):
                    break
            seen = settled
            if not running:
                break
            # The next step feeds the token at position length - 1.
            chunks[self._cache_bucket(length + self._room)]()
            length, settled, running = self._read()
        return state.ids[:batch, :settled].clone()

    def _read(self) -> tuple[int, int, bool]:
        length, settled, running = self.state.read_lengths()
        return length, settled if self._room else length, running

    @torch.no_grad()
    def capture(self, batch_size: int, prompt_length: int) -> None:
        """Capture (if not yet) the graphs a call of this batch size and prompt length uses,
        ahead of the first such call."""
        rows = bucket(batch_size, self.batch_buckets, "batch size", "batch_buckets")
        self._prefill(rows, prompt_length)
        for length in self._cache_lengths(prompt_length, self.max_length - prompt_length):
            self._chunk(rows, length)

    def stats(self) -> GeneratorStats:
        """The graphs captured so far and the memory they and the generator hold."""
        reserved = self.pool.stats().reserved_bytes if self.pool is not None else 0
        tensors = [self.state.ids, self.state.mask, self.state.next_ids, self.state.next_pos,
                   self.state.finished, self.state.eos, self.state.scalars]
        tensors += _transformers.cache_tensors(self._cache)
        speculator = self._program.speculator
        if speculator is not None and speculator.draft is not None:  # the draft's cache
            tensors += _transformers.cache_tensors(speculator.draft.cache)
        if self._sampler is not None:
            rows = self._sampler.settings
            tensors += [self._sampler.noise, rows.seen, rows.temperature, rows.top_k,
                        rows.top_p_cut, rows.min_p, rows.penalty, rows.noise_scale]
        steps, kept = speculator.counts.tolist() if speculator is not None else (0, 0)
        return GeneratorStats(tuple(sorted(self._prefills)), tuple(sorted(self._chunks)),
                              self._capture_s, reserved,
                              sum(t.numel() * t.element_size() for t in tensors), steps, kept)

    # -- graphs ----------------------------------------------------------------------------
    def _cache_lengths(self, prompt: int, max_new_tokens: int) -> list[int]:
        """The cache buckets decode steps use from a prompt of ``prompt`` tokens: the first
        step feeds position ``prompt``, the last at most ``prompt + max_new_tokens - 2``."""
        room = self._room
        first = self._cache_bucket(prompt + 1 + room)
        last = self._cache_bucket(max(prompt + max_new_tokens - 1, prompt + 1) + room)
        return [b for b in self._decode_buckets if first <= b <= last]

    def _cache_bucket(self, length: int) -> int:
        return next(b for b in self._decode_buckets if b >= length)

    def _prefill(self, rows: int, prompt: int) -> Callable[[], None]:
        prompt_bucket = bucket(prompt, self.prompt_buckets, "prompt length", "prompt_buckets")
        key = (rows, prompt_bucket)
        run = self._prefills.get(key)
        if run is None:
            program = self._program
            length = self._cache_bucket(prompt_bucket)
            run = self._graphed(lambda: program.prefill(rows, prompt_bucket, length), rows,
                                prompt_bucket)
            self._prefills[key] = run
        return run

    def _chunk(self, rows: int, length: int) -> Callable[[], None]:
        run = self._chunks.get((rows, length))
        if run is None:
            program, steps = self._program, self.chunk
            if self.graphed:
                def body() -> None:
                    while_loop(lambda: program.within(length),
                               lambda: program.decode(rows, length), max_iters=steps)
                # A compiled step holds its constants itself, and staging's function mode
                # would make dynamo recompile it inside the capture.
                run = self._graphed(body, rows, None, warm=lambda: program.decode(rows, length),
                                    stage=not program.compiled)
            else:
                def run() -> None:
                    for _ in range(steps):
                        if not bool(program.within(length)):
                            return
                        program.decode(rows, length)
            self._chunks[rows, length] = run
        return run

    def _graphed(self, body: Callable[[], None], rows: int, prompt_bucket: int | None, *,
                 warm: Callable[[], None] | None = None, stage: bool = True
                 ) -> Callable[[], None]:
        """``body`` captured into the generator's pool (after a warm-up on the capture
        stream from that pool, on a staged dummy prompt); eagerly as it is with
        ``graphed=False``. ``stage``: a model's host constants (transformers' masks make
        ``torch.tensor(0.0, device=...)`` in forward) are staged into pinned memory the graph
        keeps, the same bytes each call."""
        if not self.graphed:
            return body
        begin = time.perf_counter()
        prompt = min(prompt_bucket or 1, self.max_length - 1)
        dummy = torch.zeros(rows, prompt, dtype=torch.int64, device=self.device)

        def warm_up() -> None:
            # Kernels, library handles and workspaces for the capture stream, from the
            # generator's pool (warmed_graph), on a dummy prompt (Program.warm_up).
            self._program.warm_up(dummy, rows, warm or body)

        cuda_graph = Graph()
        # One cuBLAS workspace per stream for all of them: they never run at once.
        session = warmed_graph(cuda_graph, self.pool, warm_up, stage_host_constants=stage,
                               workspace_owner=self)
        with torch.cuda.device(self.device), session:
            body()
        captured = session.captured
        assert captured is not None  # set by a successful capture
        self._graphs.append(cuda_graph)
        if len(self._graphs) == 1:  # the generator's first capture
            _torch.give_back_dropped_workspaces()
        self._capture_s += time.perf_counter() - begin
        # torch's replay on torch's current stream, past the pool-order check (see the
        # module's design notes: these graphs hand out no pool memory).
        return captured.launch

    # -- arguments -------------------------------------------------------------------------
    def _sampling_settings(self, batch: int, seed: Any, settings: dict[str, Any]) -> list:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise OptionsError(unknown[0], settings[unknown[0]],
                               "a keyword of generate(): " + ", ".join(SETTINGS))
        if self._sampler is None:
            # A greedy generator takes greedy settings (the warpers are unused without
            # do_sample, as in generate); what changes its tokens needs sampling=True.
            penalty = settings.get("repetition_penalty")
            for name, value, changes in (
                    ("do_sample", settings.get("do_sample"), settings.get("do_sample") is True),
                    ("seed", seed, seed is not None),
                    ("repetition_penalty", penalty, penalty not in (None, 1, 1.0))):
                if changes:
                    raise OptionsError(name, value, "a Generator built with sampling=True "
                                       "(this one is greedy)")
            return []
        rows = call_settings(getattr(self.model, "generation_config", None), batch, seed,
                             settings)
        # A tensor-parallel model's ranks sample alike, or their loops part (see _ranks).
        return agree(rows, seed is None, self._split) if self._split else rows

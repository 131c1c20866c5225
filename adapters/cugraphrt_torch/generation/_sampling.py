"""Sampling on the device, with transformers' meaning: the logits processors of
``generate(do_sample=True)`` as tensor operations over per-row settings, and the draw.

What ``generate`` computes on a step's float32 scores, in its order: the repetition penalty
(over the tokens of the prompt and those generated so far), then temperature, ``top_k``,
``top_p`` and ``min_p``, then a draw from the softmax. Here every setting is a per-row device
tensor and every processor always runs, its neutral value (penalty 1, temperature 1, ``top_k``
0, ``top_p`` 1, ``min_p`` 0) leaving a row's scores as they are, bit for bit. So one graph
serves every setting and every mix of settings in a batch: nothing is decided on the host at
capture and silently reused at replay (penalties skipped on replay, TensorRT-LLM #15216), and
a row with ``top_k=1`` keeps every token tied with its best, as transformers' does.

Each processor repeats transformers' operations on the same values (its thresholds rounded to
float32 as transformers' Python scalars are), so processed scores equal
``transformers.generation.logits_process``'s bit for bit on one device
(``tests/torch/test_sampling_cpu.py``, 1,000 rows against the processors themselves).

The draw is the Gumbel-max trick, ``argmax(scores + noise)`` with ``noise`` from
:class:`cugraphrt.random.RowGenerator`: one Philox stream per row, its position advanced on
the device by every draw, so each step of a device loop and each replay draws afresh, and a
row's tokens depend on its seed only (not on its batch, bucket or chunk). A greedy row
(``do_sample`` off) adds no noise: its token is the argmax of its processed scores, as
``generate``'s greedy search takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cugraphrt.errors import OptionsError

__all__ = ["SETTINGS", "Sampling", "SamplingRows", "Sampler", "call_settings", "sampling_for",
           "process", "choose"]

_NEG_INF = float("-inf")
#: The settings ``Generator.generate`` takes, as ``generate`` names them (and ``seed``).
SETTINGS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class Sampling:
    """One request row's sampling settings, as ``generate`` names them.

    ``do_sample=False`` is greedy search: only the repetition penalty applies (as in
    ``generate``), and the row's token is the argmax. ``top_k=0``, ``top_p=1.0`` and
    ``min_p=0.0`` turn those processors off; ``seed`` picks the row's random stream.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, bool, str], ...] = (
            ("do_sample", isinstance(self.do_sample, bool), "True or False"),
            ("temperature", _number(self.temperature) and self.temperature > 0,
             "a number > 0"),
            ("top_k", isinstance(self.top_k, int) and not isinstance(self.top_k, bool)
             and self.top_k >= 0, "an integer >= 0 (0: off)"),
            ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("min_p", _number(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]"),
            ("repetition_penalty", _number(self.repetition_penalty)
             and self.repetition_penalty > 0, "a number > 0"),
            ("seed", isinstance(self.seed, int) and not isinstance(self.seed, bool)
             and 0 <= self.seed < 2**64, "an integer in [0, 2**64)"),
        )
        for name, ok, allowed in checks:
            if not ok:
                raise OptionsError(name, getattr(self, name), allowed)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value  # not NaN


def sampling_for(generation_config: Any = None, **settings: Any) -> Sampling:
    """A row's :class:`Sampling`: ``settings`` over the model's ``generation_config`` (the
    defaults ``generate`` itself starts from: ``top_k`` 50 unless the model says otherwise),
    over transformers' own defaults."""
    base: dict[str, Any] = {}
    for name in SETTINGS:
        value = getattr(generation_config, name, None)
        if value is not None:
            base[name] = value
    unknown = set(settings) - set(Sampling.__dataclass_fields__)
    if unknown:
        raise OptionsError(sorted(unknown)[0], settings[sorted(unknown)[0]],
                           "one of " + ", ".join(Sampling.__dataclass_fields__))
    base.update({k: v for k, v in settings.items() if v is not None})
    return Sampling(**base)


class SamplingRows:
    """The per-row settings of a batch, in device tensors a graph reads (written eagerly
    between generations, never during one), and each row's seen-token mask.

    Attributes
    ----------
    temperature, top_p_cut, min_p, penalty : torch.Tensor
        float32, one per row; ``top_p_cut`` is ``1 - top_p`` rounded once to float32, the
        value transformers compares against.
    top_k : torch.Tensor
        int64, one per row; ``vocab`` for off (so the threshold is the row's smallest score).
    noise_scale : torch.Tensor
        float32, 1 for a sampled row, 0 for a greedy one.
    seen : torch.Tensor
        bool, ``(rows, vocab)``: the tokens the repetition penalty applies to.
    """

    def __init__(self, rows: int, vocab: int, device: torch.device | str) -> None:
        self.rows, self.vocab = rows, vocab

        def zeros(dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(rows, dtype=dtype, device=device)

        self.temperature = zeros(torch.float32)
        self.top_k = zeros(torch.int64)
        self.top_p_cut = zeros(torch.float32)
        self.min_p = zeros(torch.float32)
        self.penalty = zeros(torch.float32)
        self.noise_scale = zeros(torch.float32)
        self.seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        self.set([Sampling()] * rows)

    def set(self, settings: Sequence[Sampling]) -> None:
        """Write one :class:`Sampling` per row (eagerly: outside any capture)."""
        if len(settings) != self.rows:
            raise OptionsError("sampling", f"{len(settings)} settings",
                               f"one per row ({self.rows})")
        sample = [s.do_sample for s in settings]

        def write(target: torch.Tensor, values: list) -> None:
            target.copy_(torch.tensor(values, dtype=target.dtype), non_blocking=False)

        # Warpers apply to sampled rows only, as in generate: greedy rows get neutral ones.
        write(self.temperature, [s.temperature if d else 1.0 for s, d in zip(settings, sample,
                                                                               strict=True)])
        write(self.top_k, [min(s.top_k, self.vocab) if d and s.top_k else self.vocab
                           for s, d in zip(settings, sample, strict=True)])
        # 1 - top_p in double, then float32: what transformers' comparison with its Python
        # float rounds to. A row with top_p 1 gets a cut below every probability.
        write(self.top_p_cut, [1.0 - s.top_p if d and s.top_p < 1.0 else -1.0
                               for s, d in zip(settings, sample, strict=True)])
        write(self.min_p, [s.min_p if d else 0.0 for s, d in zip(settings, sample,
                                                                  strict=True)])
        write(self.penalty, [s.repetition_penalty for s in settings])
        write(self.noise_scale, [1.0 if d else 0.0 for d in sample])

    def see(self, tokens: torch.Tensor) -> None:
        """Mark ``tokens`` (``(rows, n)`` int64, any n) as seen: the prompt's tokens as given
        (padding included, as transformers' penalty sees ``input_ids``), then each step's."""
        self.seen.scatter_(1, tokens, True)


def process(scores: torch.Tensor, rows: SamplingRows, n: int | None = None) -> torch.Tensor:
    """The processed float32 scores of a step for the first ``n`` rows (all by default),
    ``(n, vocab)``: repetition penalty, temperature, ``top_k``, ``top_p``, ``min_p``, as
    transformers computes them. Only tensor operations, no host reads: capturable, and the
    same graph for every setting."""
    penalty = rows.penalty[:n, None]
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    scores = torch.where(rows.seen[:n], penalized, scores)
    scores = scores / rows.temperature[:n, None]
    # top_k: drop what is below the row's k-th largest score (ties with it stay).
    ordered = torch.sort(scores, dim=-1, descending=True).values
    kth = ordered.gather(1, (rows.top_k[:n] - 1).clamp(min=0)[:, None])
    scores = scores.masked_fill(scores < kth, _NEG_INF)
    # top_p: drop the smallest tokens whose probabilities sum to at most 1 - top_p, never
    # the largest one.
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= rows.top_p_cut[:n, None]
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(1, sorted_indices, drop_sorted)
    scores = scores.masked_fill(drop, _NEG_INF)
    # min_p: drop tokens less likely than min_p times the likeliest, never the likeliest.
    probs = torch.softmax(scores, dim=-1)
    scaled = rows.min_p[:n, None] * probs.amax(dim=-1, keepdim=True)
    drop = probs < scaled
    drop.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
    return scores.masked_fill(drop, _NEG_INF)


def choose(scores: torch.Tensor, noise: torch.Tensor, rows: SamplingRows,
           n: int | None = None) -> torch.Tensor:
    """Each row's token, ``(n,)`` int64: ``argmax(scores + noise)`` for a sampled row (a
    draw from ``softmax(scores)``: the Gumbel-max trick), ``argmax(scores)`` for a greedy one
    (its noise scaled by 0)."""
    return torch.argmax(scores + noise * rows.noise_scale[:n, None], dim=-1)


class Sampler:
    """The sampling part of a generator's program: the rows' settings, one random stream per
    row, and each step's noise, drawn before the step and read by it.

    On a CUDA device the streams are a :class:`cugraphrt.random.RowGenerator` (its positions
    advance on the device: every step of a device loop and every replay draws afresh); on the
    CPU (``graphed=False``) the same Philox words come from the NumPy reference, with the
    positions kept on the host (its Gumbel noise can differ from CUDA's ``logf`` in the last
    bit, so a CPU run may part from a GPU run where two scores nearly tie).
    """

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab = rows, vocab
        self.settings = SamplingRows(rows, vocab, device)
        self.noise = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self._device = device
        self._seeds, self._positions = [0] * rows, [0] * rows
        self._rng: Any = None
        if device.type == "cuda":
            import cugraphrt.random as crandom

            from ..capture.dlpack import to_cupy

            self._rng = crandom.RowGenerator(rows, device=device.index)
            self._noise_view = to_cupy(self.noise)

    def stage(self, settings: Sequence[Sampling], prompts: torch.Tensor) -> None:
        """One call's settings and seeds (one per row of the bucket's ``rows``, the rest
        repeat the last) and the prompts' tokens as seen; eagerly, before the call's
        launches."""
        full = list(settings) + [settings[-1]] * (self.rows - len(settings))
        self.settings.set(full)
        self.settings.seen.zero_()
        self.settings.see(prompts)
        self._seeds = [s.seed for s in full]
        self._positions = [0] * self.rows
        if self._rng is not None:
            self._rng.manual_seed(self._seeds)

    def draw(self) -> None:
        """This step's noise into :attr:`noise`; every row's stream advances."""
        if self._rng is None:
            from cugraphrt.random import row_draws

            self.noise.copy_(torch.from_numpy(row_draws(
                self._seeds, self._positions, self.vocab, "gumbel")))
            step = (self.vocab + 3) // 4
            self._positions = [p + step for p in self._positions]
            return
        from ..capture import _torch

        device = self._device.index
        with _torch.cupy_stream_for(_torch.current_torch_stream_ptr(device), device):
            self._rng.gumbel(self.vocab, out=self._noise_view)

    def choose(self, n: int, scores: torch.Tensor) -> torch.Tensor:
        """The first ``n`` rows' tokens from their scores (the model's, any float dtype:
        processed in float32, as ``generate`` processes them)."""
        processed = process(scores.float(), self.settings, n)
        return choose(processed, self.noise[:n], self.settings, n)

    def seen(self, n: int, token: torch.Tensor) -> None:
        """Mark each of the first ``n`` rows' new token as seen."""
        self.settings.seen[:n].scatter_(1, token[:, None], True)


def call_settings(generation_config: Any, batch: int, seed: Any,
                  settings: dict[str, Any]) -> list[Sampling]:
    """One :class:`Sampling` per row of a ``generate`` call: ``settings`` over the model's
    ``generation_config``, and each row's seed from ``seed``: an int (row ``r`` gets
    ``seed + r``), a ``torch.Generator`` (a seed drawn from it per row), a sequence of either
    (one per row), or None (seeds drawn from torch's default CPU generator, so
    ``torch.manual_seed`` makes a call reproducible, as it makes ``generate``'s)."""
    base = sampling_for(generation_config, **settings)
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch:
            raise OptionsError("seed", f"{len(seed)} seeds", f"one per row ({batch})")
        seeds = [_seed_of(s) for s in seed]
    elif seed is None or isinstance(seed, torch.Generator):
        seeds = [_seed_of(seed) for _ in range(batch)]
    else:
        first = _seed_of(seed)
        seeds = [(first + r) % 2**64 for r in range(batch)]
    return [Sampling(**{**base.__dict__, "seed": s}) for s in seeds]


def _seed_of(value: Any) -> int:
    if value is None or isinstance(value, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=value).item())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise OptionsError("seed", value, "an int in [0, 2**64), a torch.Generator, a "
                           "sequence of them (one per row), or None")
    return value

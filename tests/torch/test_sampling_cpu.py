"""Sampling's processors and draw, without a GPU: processed scores against transformers' own
logits processors (bit for bit, on 1,000 rows of mixed settings), draws against the processed
softmax (a chi-square test over 20,000 draws from the Philox reference's noise), and the
settings' checks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
logits_process = pytest.importorskip("transformers.generation.logits_process")

from cugraphrt_torch.generation._sampling import (  # noqa: E402
    Sampling,
    SamplingRows,
    choose,
    process,
    sampling_for,
)

from cugraphrt import OptionsError  # noqa: E402
from cugraphrt._libraries.philox import reference_rows  # noqa: E402

VOCAB = 1000

#: Settings as users pass them, each with the processors generate() builds for it.
SETTINGS = [
    Sampling(),  # greedy, no penalty: scores untouched
    Sampling(repetition_penalty=1.3),  # greedy with a penalty
    Sampling(do_sample=True),  # transformers' defaults: top_k 50
    Sampling(do_sample=True, temperature=0.7, top_k=0, top_p=0.9),
    Sampling(do_sample=True, temperature=1.3, top_k=20, top_p=0.8, min_p=0.05,
             repetition_penalty=1.1),
    Sampling(do_sample=True, top_k=1),  # ties with the best stay, as in transformers
    Sampling(do_sample=True, top_k=0, min_p=0.2, temperature=0.5),
    Sampling(do_sample=True, top_k=5000, top_p=0.95, repetition_penalty=0.8),
    Sampling(do_sample=True, top_k=0, min_p=0.9),
    Sampling(do_sample=True, top_k=0, top_p=0.5, temperature=1.7),
]


def transformers_processors(s: Sampling) -> list:
    """The processors generate() applies for ``s``, in its order (utils.py,
    _get_logits_processor): the penalty always, the warpers when sampling."""
    lp = logits_process
    out = []
    if s.repetition_penalty != 1.0:
        out.append(lp.RepetitionPenaltyLogitsProcessor(penalty=s.repetition_penalty))
    if s.do_sample:
        if s.temperature != 1.0:
            out.append(lp.TemperatureLogitsWarper(s.temperature))
        if s.top_k != 0:
            out.append(lp.TopKLogitsWarper(top_k=s.top_k, min_tokens_to_keep=1))
        if s.top_p < 1.0:
            out.append(lp.TopPLogitsWarper(top_p=s.top_p, min_tokens_to_keep=1))
        if s.min_p:
            out.append(lp.MinPLogitsWarper(min_p=s.min_p, min_tokens_to_keep=1))
    return out


def batch(rows: int, seed: int = 0, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, VOCAB, generator=gen) * spread
    scores[::7, :40] = scores[::7, :1]  # ties, some with the row's best
    prompts = torch.randint(0, VOCAB, (rows, 24), generator=gen)
    return scores, prompts


@pytest.mark.parametrize("spread", [3.0, 0.05])
def test_processed_scores_equal_transformers_processors_bit_for_bit(spread):
    # Spread 0.05: nearly flat rows, many tokens close to every threshold.
    rows = 1000
    scores, prompts = batch(rows, spread=spread)
    settings = [SETTINGS[i % len(SETTINGS)] for i in range(rows)]
    state = SamplingRows(rows, VOCAB, "cpu")
    state.set(settings)
    state.see(prompts)
    ours = process(scores.clone(), state)
    for k, s in enumerate(SETTINGS):
        index = torch.arange(k, rows, len(SETTINGS))
        theirs = scores[index].clone()
        for processor in transformers_processors(s):
            theirs = processor(prompts[index], theirs)
        assert torch.equal(ours[index], theirs), s
    # Neutral settings leave a row's scores as they are, bit for bit.
    assert torch.equal(ours[0::len(SETTINGS)], scores[0::len(SETTINGS)])
    # And something was dropped or changed wherever a processor is on.
    for k in range(1, len(SETTINGS)):
        assert not torch.equal(ours[k::len(SETTINGS)], scores[k::len(SETTINGS)]), SETTINGS[k]


def test_tokens_seen_as_generation_goes_are_penalized():
    scores, prompts = batch(4, seed=1)
    state = SamplingRows(4, VOCAB, "cpu")
    state.set([Sampling(repetition_penalty=2.0)] * 4)
    state.see(prompts)
    step = torch.tensor([[3], [5], [7], [11]])
    state.see(step)
    ids = torch.cat([prompts, step], dim=1)
    theirs = logits_process.RepetitionPenaltyLogitsProcessor(penalty=2.0)(ids, scores.clone())
    assert torch.equal(process(scores.clone(), state), theirs)


def _noise(seed: int, draws: int, vocab: int) -> torch.Tensor:
    """``draws`` consecutive draws of one row from the Philox reference (what a
    RowGenerator's ``gumbel`` gives one row on ``draws`` successive steps)."""
    step = (vocab + 3) // 4
    noise = reference_rows([seed] * draws, [i * step for i in range(draws)], vocab, "gumbel")
    return torch.from_numpy(noise)


def test_draws_follow_the_processed_softmax():
    vocab, draws = 12, 20_000
    gen = torch.Generator().manual_seed(3)
    scores = (torch.randn(1, vocab, generator=gen) * 1.5).expand(draws, vocab).contiguous()
    state = SamplingRows(draws, vocab, "cpu")
    state.set([Sampling(do_sample=True, temperature=0.8, top_k=8, top_p=0.97)] * draws)
    processed = process(scores, state)
    tokens = choose(processed, _noise(11, draws, vocab), state)
    probs = torch.softmax(processed[0].double(), dim=-1)
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert counts[probs == 0].sum() == 0  # a dropped token is never drawn
    kept = probs > 0
    expected = probs[kept] * draws
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    # 99.9% quantile of chi-square with (kept - 1) degrees of freedom, for up to 7 of them.
    critical = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
    assert int(kept.sum()) - 1 in critical
    assert chi2 < critical[int(kept.sum()) - 1], (chi2, counts, expected)


def test_greedy_rows_take_the_argmax_whatever_their_noise():
    scores, prompts = batch(6, seed=2)
    state = SamplingRows(6, VOCAB, "cpu")
    state.set([Sampling(repetition_penalty=1.2)] * 6)
    state.see(prompts)
    processed = process(scores, state)
    tokens = choose(processed, _noise(5, 6, VOCAB), state)
    assert torch.equal(tokens, processed.argmax(dim=-1))


def test_seeds_give_their_own_streams():
    same = _noise(7, 4, 64)
    assert torch.equal(same, _noise(7, 4, 64))
    other = _noise(8, 4, 64)
    assert not torch.equal(same, other)
    assert len({tuple(row.tolist()) for row in same}) == 4  # no step repeats a draw
    # A row's stream does not depend on the other rows of the batch.
    together = reference_rows([7, 8], [0, 0], 64, "gumbel")
    np.testing.assert_array_equal(together[0], same[0].numpy())
    np.testing.assert_array_equal(together[1], other[0].numpy())


def test_settings_are_checked_and_default_to_the_models():
    for bad in ({"temperature": 0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5},
                {"min_p": 2}, {"repetition_penalty": 0}, {"seed": -1}, {"do_sample": 1},
                {"temperature": float("nan")}, {"top_k": True}):
        name = next(iter(bad))
        with pytest.raises(OptionsError, match=name):
            Sampling(**bad)
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9)
    s = sampling_for(config, seed=5)
    assert (s.do_sample, s.temperature, s.top_k, s.top_p, s.seed) == (True, 0.6, 50, 0.9, 5)
    assert sampling_for(config, top_k=0).top_k == 0
    with pytest.raises(OptionsError, match="topk"):
        sampling_for(config, topk=3)
    rows = SamplingRows(2, VOCAB, "cpu")
    with pytest.raises(OptionsError, match="one per row"):
        rows.set([Sampling()])

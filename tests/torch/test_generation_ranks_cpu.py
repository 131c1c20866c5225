"""What the ranks of a tensor-parallel model agree on before a sampled generation
(cugraphrt_torch.generation._ranks), with the exchange faked: each test gives the rows every
rank of a split holds. The real exchange, over gloo and NCCL, runs in tests/distributed
(generation.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.generation import _ranks  # noqa: E402
from cugraphrt_torch.generation._sampling import Sampling  # noqa: E402

from cugraphrt.errors import OptionsError  # noqa: E402


def _split(monkeypatch, ranks_rows, me=0):
    """Fake a group whose ranks hold ``ranks_rows`` (the caller is rank ``me``); returns the
    groups the exchange ran over."""
    seen = []

    def all_gather_object(out, rows, group):
        assert rows == ranks_rows[me]  # the caller's own rows go in
        seen.append(group)
        out[:] = ranks_rows

    monkeypatch.setattr(_ranks.dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(_ranks.dist, "get_world_size", lambda group: len(ranks_rows))
    return seen


def _rows(*seeds, **settings):
    return [Sampling(do_sample=True, seed=s, **settings) for s in seeds]


def test_drawn_seeds_become_the_first_ranks(monkeypatch):
    first, second = _rows(11, 12, temperature=0.8), _rows(91, 92, temperature=0.8)
    seen = _split(monkeypatch, [first, second])
    assert _ranks.agree(first, True, ("tp",)) == first
    assert seen == ["tp"]


def test_another_rank_samples_with_the_first_ranks_drawn_seeds(monkeypatch):
    first, second = _rows(11, 12, top_k=5), _rows(91, 92, top_k=5)
    _split(monkeypatch, [first, second], me=1)
    assert _ranks.agree(second, True, ("tp",)) == first


def test_every_group_of_a_split_is_exchanged_in_turn(monkeypatch):
    rows = _rows(5)
    seen = _split(monkeypatch, [rows, rows])
    assert _ranks.agree(rows, True, ("dim0", "dim1")) == rows
    assert seen == ["dim0", "dim1"]


def test_explicit_seeds_that_differ_raise_naming_the_row_and_rank(monkeypatch):
    first, second = _rows(7, 8), _rows(7, 9)
    _split(monkeypatch, [first, second])
    with pytest.raises(OptionsError, match=r"'seed' \(got 9\): 8 for row 1, as on the split's "
                       r"first rank \(rank 1 has this\)"):
        _ranks.agree(first, False, ("tp",))


def test_a_setting_that_differs_raises_even_with_drawn_seeds(monkeypatch):
    first, second = _rows(1, temperature=0.8), _rows(2, temperature=0.9)
    _split(monkeypatch, [first, second])
    with pytest.raises(OptionsError, match=r"'temperature' \(got 0.9\): 0.8 for row 0"):
        _ranks.agree(first, True, ("tp",))


@pytest.mark.parametrize("drawn", [True, False])
@pytest.mark.parametrize("counts", [(2, 1), (1, 2)])
def test_batches_that_differ_raise(monkeypatch, counts, drawn):
    first, second = _rows(*range(counts[0])), _rows(*range(counts[1]))
    _split(monkeypatch, [first, second])
    with pytest.raises(OptionsError, match=rf"'input_ids' \(got '{counts[1]} rows'\): "
                       rf"{counts[0]} rows"):
        _ranks.agree(first, drawn, ("tp",))


def test_a_model_outside_a_process_group_is_no_split():
    assert not torch.distributed.is_initialized()
    assert _ranks.split_groups(torch.nn.Linear(3, 3)) == ()


def test_a_greedy_generator_exchanges_nothing(monkeypatch):
    # split_groups is only asked for a sampling generator: a greedy one's ranks agree by
    # themselves (the same logits everywhere).
    transformers = pytest.importorskip("transformers")

    from cugraphrt_torch import Generator

    asked = []
    monkeypatch.setattr("cugraphrt_torch.generation.generation.split_groups",
                        lambda model: asked.append(model) or ())
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(config).eval()
    Generator(model, max_length=16, graphed=False)
    assert asked == []
    Generator(model, max_length=16, graphed=False, sampling=True)
    assert asked == [model]

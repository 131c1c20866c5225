"""The Generator's sampling, run eagerly on the CPU (``graphed=False``): greedy settings equal
transformers' ``generate`` (a repetition penalty included), and sampled tokens depend on each
row's seed only, not on the batch, the buckets or the chunk."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cugraphrt_torch import Generator  # noqa: E402

from cugraphrt.errors import OptionsError  # noqa: E402

from .test_generation_cpu import _model, _prompts, _reference  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return _model("llama")


def _generator(model, **kwargs):
    options = dict(max_length=64, graphed=False, chunk=5, batch_buckets=(1, 2, 4),
                   prompt_buckets=(8, 20), cache_buckets=(16, 24, 40, 64), sampling=True)
    options.update(kwargs)
    return Generator(model, **options)


def test_greedy_settings_equal_transformers_generate(llama):
    generator = _generator(llama)
    ids, mask = _prompts([5, 9, 17, 3])
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=20, pad_token_id=0),
                       _reference(llama, ids, mask, max_new_tokens=20))
    # The penalty sees the prompt (its padding too) and every token generated, as
    # transformers' does.
    got = generator.generate(ids, mask, max_new_tokens=20, pad_token_id=0,
                             repetition_penalty=1.5)
    assert torch.equal(got, _reference(llama, ids, mask, max_new_tokens=20,
                                       repetition_penalty=1.5))
    # Sampling from the top 1 token is greedy search, whatever the seed (float32 scores of a
    # random model: no ties at the top, which top_k keeps and the draw would choose among).
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=20, pad_token_id=0,
                                          do_sample=True, top_k=1, seed=123),
                       _reference(llama, ids, mask, max_new_tokens=20))


def test_a_rows_tokens_depend_on_its_seed_only(llama):
    ids, mask = _prompts([5, 9, 17, 3], seed=4)
    settings = dict(max_new_tokens=24, pad_token_id=0, do_sample=True, temperature=1.2,
                    top_p=0.95, top_k=0)
    seeds = [11, 22, 33, 44]
    together = _generator(llama).generate(ids, mask, seed=seeds, **settings)
    # Other buckets, another chunk, another batch: row 2 alone, then rows 1 and 2.
    other = _generator(llama, chunk=3, cache_buckets=(24, 64), prompt_buckets=(20,))
    alone = other.generate(ids[2:3], mask[2:3], seed=[33], **settings)
    assert torch.equal(alone[0], together[2])
    ids_pair, mask_pair = ids[1:3], mask[1:3]
    width = int(mask_pair.sum(1).max())  # left padding of the pair alone
    pair = other.generate(ids_pair[:, -width:], mask_pair[:, -width:], seed=[22, 33],
                          **settings)
    for got, row in zip(pair, (1, 2), strict=True):
        n = int(mask[row].sum())
        assert torch.equal(got[-(24 + n):], together[row, -(24 + n):]), row
    # Another seed, other tokens; the same call again, the same tokens.
    again = _generator(llama).generate(ids, mask, seed=seeds, **settings)
    assert torch.equal(again, together)
    changed = _generator(llama).generate(ids, mask, seed=[11, 22, 34, 44], **settings)
    assert torch.equal(changed[[0, 1, 3]], together[[0, 1, 3]])
    assert not torch.equal(changed[2], together[2])


def test_seeds_from_an_int_a_generator_or_torchs_default(llama):
    generator = _generator(llama)
    ids, mask = _prompts([6, 6])
    settings = dict(max_new_tokens=16, pad_token_id=0, do_sample=True)
    by_int = generator.generate(ids, mask, seed=7, **settings)
    assert torch.equal(by_int, generator.generate(ids, mask, seed=[7, 8], **settings))
    first = generator.generate(ids, mask, seed=torch.Generator().manual_seed(3), **settings)
    assert torch.equal(first, generator.generate(
        ids, mask, seed=torch.Generator().manual_seed(3), **settings))
    torch.manual_seed(9)
    a = generator.generate(ids, mask, **settings)
    torch.manual_seed(9)
    assert torch.equal(a, generator.generate(ids, mask, **settings))


def test_bad_sampling_calls_are_refused(llama):
    ids, mask = _prompts([5])
    greedy = Generator(llama, max_length=64, graphed=False)
    for kwargs, field in [(dict(do_sample=True), "do_sample"), (dict(seed=3), "seed"),
                          (dict(repetition_penalty=1.2), "repetition_penalty"),
                          (dict(topk=3), "topk")]:
        with pytest.raises(OptionsError) as info:
            greedy.generate(ids, mask, max_new_tokens=4, **kwargs)
        assert info.value.field == field
    # Greedy settings are fine on a greedy generator (the warpers are unused, as in
    # generate).
    greedy.generate(ids, mask, max_new_tokens=4, pad_token_id=0, do_sample=False,
                    temperature=0.5)
    sampler = _generator(llama)
    for kwargs, field in [(dict(temperature=0), "temperature"), (dict(top_p=2.0), "top_p"),
                          (dict(seed=[1, 2]), "seed"), (dict(seed=-1), "seed")]:
        with pytest.raises(OptionsError) as info:
            sampler.generate(ids, mask, max_new_tokens=4, do_sample=True, **kwargs)
        assert info.value.field == field

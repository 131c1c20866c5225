"""Speculative decoding (prompt lookup) in the Generator, without a GPU: the program run
eagerly (``graphed=False``) against transformers' greedy ``generate``, and the draft lookup
against a plain Python one.

Random weights rarely repeat themselves, so drafts are rarely right there; a *cycling*
model (every layer's output projections zeroed, the head mapping each token's embedding to
the next token of a fixed permutation) continues every sequence along cycles of 7 tokens,
which prompt lookup predicts: most drafts are kept, steps take several tokens at once, and
rows that stop at an EOS do so inside a step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cugraphrt_torch import Generator, PromptLookup  # noqa: E402

from cugraphrt.bench.generate_models import causal_lm  # noqa: E402
from cugraphrt.errors import OptionsError  # noqa: E402

from ._generation_models import VOCAB, cycling_model, one_row_ahead  # noqa: E402
from ._generation_prompts import prompts  # noqa: E402


def _reference(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                              **kwargs)


def _generator(model, tokens: int = 4, **kwargs):
    return Generator(model, max_length=64, graphed=False, chunk=5, batch_buckets=(1, 4),
                     prompt_buckets=(8, 20), cache_buckets=(16, 24, 40, 64),
                     speculative=PromptLookup(tokens=tokens), **kwargs)


def test_a_cycling_model_keeps_most_drafts_and_generates_greedys_tokens():
    model, successor = cycling_model(torch)
    ids, mask = prompts(torch, [5, 12, 9], VOCAB, seed=4)
    want = _reference(model, ids, mask, max_new_tokens=37)
    # The model does what it was built to: each new token is the previous one's successor.
    assert torch.equal(want[:, -36:], successor[want[:, -37:-1]])
    generator = _generator(model)
    got = generator.generate(ids, mask, max_new_tokens=37, pad_token_id=0)
    assert torch.equal(got, want)
    stats = generator.stats()
    # 36 tokens after the prefill's first, in each of the 3 rows: once the cycles show (3
    # tokens of the n-gram, then 7 to repeat), steps keep up to 5 tokens each.
    assert stats.speculative_tokens == 3 * 36
    assert stats.speculative_steps <= 3 * 16, stats


def test_rows_that_stop_at_an_eos_inside_a_step_get_generates_padding():
    model, successor = cycling_model(torch)
    ids, mask = prompts(torch, [5, 12, 9], VOCAB, seed=4)
    plain = _reference(model, ids, mask, max_new_tokens=37)
    # An EOS each row meets at a different step (row 0's 9th new token).
    eos = int(plain[0, ids.shape[1] + 8])
    want = _reference(model, ids, mask, max_new_tokens=37, eos_token_id=eos)
    got = _generator(model).generate(ids, mask, max_new_tokens=37, pad_token_id=0,
                                     eos_token_id=eos)
    assert torch.equal(got, want)
    assert got.shape[1] < plain.shape[1] or (got == eos).any()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "mixtral", "gemma2", "gemma3",
                                  "gpt_oss"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_random_models_generate_greedys_tokens(arch, tokens):
    model = causal_lm(arch, window=8)
    for lengths in ([19], [5, 12, 9]):
        ids, mask = prompts(torch, lengths, 512, seed=3)
        want = _reference(model, ids, mask, max_new_tokens=30)
        got = _generator(model, tokens).generate(ids, mask, max_new_tokens=30, pad_token_id=0)
        assert torch.equal(got, want), (arch, tokens, lengths)


def test_each_row_keeps_its_own_count():
    # Each row of a batch keeps what its own drafts earn: the batch's verify steps and kept
    # tokens are the sums of each row's run alone (rows moving together would take the
    # slowest row's steps in every row), and each row's tokens are its own run's.
    model, ids, mask = one_row_ahead(torch)
    batch = _generator(model)
    together = batch.generate(ids, mask, max_new_tokens=37, pad_token_id=0)
    alone = []
    for row in range(3):
        real = ids[row][mask[row].bool()][None]
        generator = _generator(model)
        tokens = generator.generate(real, None, max_new_tokens=37, pad_token_id=0)
        assert torch.equal(tokens[0, real.shape[1]:], together[row, ids.shape[1]:]), row
        alone.append(generator.stats())
    assert len({stats.speculative_steps for stats in alone}) > 1, alone  # rows differ
    stats = batch.stats()
    assert stats.speculative_steps == sum(one.speculative_steps for one in alone)
    assert stats.speculative_tokens == sum(one.speculative_tokens for one in alone) == 3 * 36


def _lookup_reference(row: list[int], real: list[bool], cur: int, ngram: int,
                      tokens: int) -> list[int]:
    """What follows the latest earlier occurrence of the last ``ngram`` tokens, in Python."""
    tail = row[cur - ngram:cur]
    for start in range(cur - ngram - 1, -1, -1):
        if row[start:start + ngram] == tail and all(real[start:start + ngram]):
            return [row[i] if i < cur else row[cur - 1]
                    for i in range(start + ngram, start + ngram + tokens)]
    return [row[cur - 1]] * tokens


def test_prompt_lookup_drafts_what_followed_the_latest_match():
    from cugraphrt_torch.generation._speculative import prompt_lookup

    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        ids = torch.randint(1, 5, (3, 24), generator=generator)  # few tokens: many matches
        mask = torch.ones_like(ids)
        mask[1, :6] = 0  # left padding
        cur = int(torch.randint(8, 24, (1,), generator=generator))
        ngram = int(torch.randint(1, 4, (1,), generator=generator))
        got = prompt_lookup(ids, mask, torch.tensor(cur), ngram, 4)
        for r in range(3):
            want = _lookup_reference(ids[r].tolist(), mask[r].bool().tolist(), cur, ngram, 4)
            assert got[r].tolist() == want, (r, cur, ngram)


@pytest.mark.parametrize("kwargs, field", [
    (dict(speculative=PromptLookup(), sampling=True), "speculative"),
    (dict(speculative=PromptLookup(), compile_step=True), "speculative"),
    (dict(speculative=4), "speculative"),
])
def test_speculative_options_are_checked(kwargs, field):
    model = causal_lm("llama")
    with pytest.raises(OptionsError) as info:
        Generator(model, max_length=64, graphed=False, **kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("tokens, ngram", [(0, 3), (4, 0), (True, 3), (2.0, 3)])
def test_prompt_lookup_takes_positive_integers(tokens, ngram):
    with pytest.raises(OptionsError):
        PromptLookup(tokens=tokens, ngram=ngram)


# -- a draft model -------------------------------------------------------------------------------

def _first_layers(model, layers: int):
    """The target's first ``layers`` layers and its head, as the issue's draft model."""
    import copy

    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_a_draft_model_generates_greedys_tokens(arch):
    from cugraphrt_torch import DraftModel

    model = causal_lm(arch, layers=3, window=8)
    draft = _first_layers(model, 1)
    for lengths in ([19], [5, 12, 9]):
        ids, mask = prompts(torch, lengths, 512, seed=3)
        want = _reference(model, ids, mask, max_new_tokens=30)
        generator = Generator(model, max_length=64, graphed=False, chunk=5,
                              batch_buckets=(1, 4), prompt_buckets=(8, 20),
                              cache_buckets=(16, 24, 40, 64),
                              speculative=DraftModel(draft, tokens=3))
        got = generator.generate(ids, mask, max_new_tokens=30, pad_token_id=0)
        assert torch.equal(got, want), (arch, lengths)


def test_the_target_as_its_own_draft_keeps_every_draft():
    # Every draft is the target's own greedy choice: each step keeps all `tokens` of them
    # (a draft model's step keeps at most `tokens`, not `tokens + 1`).
    from cugraphrt_torch import DraftModel

    model = causal_lm("llama")
    ids, mask = prompts(torch, [5, 12, 9], 512, seed=3)
    want = _reference(model, ids, mask, max_new_tokens=31)
    generator = Generator(model, max_length=64, graphed=False, batch_buckets=(4,),
                          prompt_buckets=(20,), cache_buckets=(64,),
                          speculative=DraftModel(causal_lm("llama"), tokens=3))
    got = generator.generate(ids, mask, max_new_tokens=31, pad_token_id=0)
    assert torch.equal(got, want)
    stats = generator.stats()
    # Rows 0 and 1: 30 tokens in 10 steps of 3; row 2 meets its EOS at its first step.
    first = ids.shape[1] + 1  # the first decode step's token
    assert int(want[2, first]) != 0 and not want[2, first + 1:].any()
    assert (stats.speculative_steps, stats.speculative_tokens) == (10 + 10 + 1, 30 + 30 + 1)


def test_a_draft_model_with_another_vocabulary_is_refused():
    from cugraphrt_torch import DraftModel

    with pytest.raises(OptionsError, match="vocabulary of 512 tokens") as info:
        Generator(causal_lm("llama"), max_length=64, graphed=False,
                  speculative=DraftModel(causal_lm("llama", vocab=256)))
    assert info.value.field == "speculative.model"
    with pytest.raises(OptionsError):
        DraftModel(object())


def test_a_callback_sees_only_columns_every_row_has_and_a_second_call_no_stale_tokens():
    # Rows of different lengths: the callback gets, chunk by chunk, only the columns every
    # row has settled, and they add up to the result; a second call over the same state
    # (a row that stops at an EOS early, its later columns never written) reads padding.
    model, ids, mask = one_row_ahead(torch)
    generator = _generator(model)
    seen = []
    got = generator.generate(ids, mask, max_new_tokens=37, pad_token_id=0,
                             callback=lambda tokens: seen.append(tokens) and False)
    assert torch.equal(got, _reference(model, ids, mask, max_new_tokens=37))
    assert len(seen) > 2 and torch.equal(torch.cat(seen, 1), got[:, ids.shape[1]:])
    eos = int(got[0, ids.shape[1] + 2])  # row 0 stops at its third new token
    again = generator.generate(ids, mask, max_new_tokens=37, pad_token_id=0, eos_token_id=eos)
    assert torch.equal(again, _reference(model, ids, mask, max_new_tokens=37,
                                         eos_token_id=eos))


@pytest.mark.parametrize("speculative", ["lookup", "draft"])
def test_a_capture_warm_up_writes_inside_the_cache_and_counts_nothing(speculative):
    # What a decode chunk's capture runs first (Program.warm_up): one step on a dummy
    # prompt, after a call that left every row's length near the end of the cache. The
    # step must start from the dummy prompt (a row left at its old length would write past
    # the cache bucket), and leave the counts and the next call's tokens as they were.
    from cugraphrt_torch import DraftModel

    model = causal_lm("llama")
    model.generation_config.eos_token_id = None  # every row runs to the end
    options = PromptLookup(tokens=3) if speculative == "lookup" else \
        DraftModel(causal_lm("llama", layers=1), tokens=3)
    generator = Generator(model, max_length=64, graphed=False, batch_buckets=(4,),
                          prompt_buckets=(20,), cache_buckets=(16, 64), speculative=options)
    ids, mask = prompts(torch, [5, 12, 9], 512, seed=3)
    want = _reference(model, ids, mask, max_new_tokens=40)
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0), want)
    before = generator.stats()
    program, speculator = generator._program, generator._program.speculator
    assert int(speculator.lengths[:3].min()) > 16  # past the small bucket
    dummy = torch.zeros(4, 1, dtype=torch.int64)
    with torch.no_grad():  # as the capture's warm-up runs
        program.warm_up(dummy, 4, lambda: program.decode(4, 16))
    assert int(speculator.lengths.max()) <= 1 + 4  # the dummy prompt, one step on
    assert generator.stats() == before
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0), want)

"""Sliding-window layers held in a ring of the window's length (``_internals.window_cache``):
forward by forward, the keys, values and masks a WindowLayer hands attention against those of
transformers' own evicting cache (``DynamicCache`` with a ``DynamicSlidingWindowLayer``) and
its own mask builder, fed the same states."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cugraphrt_torch._internals import transformers as cache_utils  # noqa: E402
from cugraphrt_torch._internals import window_cache  # noqa: E402

WINDOW, LENGTH, ROWS, HEADS, DIM = 8, 40, 2, 2, 4
#: Forwards of a prefill, decode steps across the window's edge and around the ring several
#: times, a 3-token forward (a speculative verify's shape) once the window is full, and decode
#: steps after it.
QUERIES = [5] + [1] * 10 + [3] + [1] * 20


def _config():
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=DIM,
        sliding_window=WINDOW, max_position_embeddings=128)
    config._attn_implementation = "sdpa"
    return config


def _states(generator, queries):
    return tuple(torch.randn(ROWS, HEADS, queries, DIM, generator=generator) for _ in range(2))


def test_a_window_layer_attends_over_generates_keys_under_generates_mask():
    config = _config()
    theirs = transformers.DynamicCache(config=config)
    mine = window_cache.window_layer(WINDOW, torch.tensor(0))
    # Row 1 starts with two padding tokens, as a left-padded batch does.
    real = torch.ones(ROWS, sum(QUERIES), dtype=torch.int64)
    real[1, :2] = 0
    generator = torch.Generator().manual_seed(0)
    seen = 0
    for queries in QUERIES:
        embeds = torch.zeros(ROWS, queries, config.hidden_size)
        want_mask = transformers.masking_utils.create_sliding_window_causal_mask(
            config=config, inputs_embeds=embeds, attention_mask=real[:, :seen + queries],
            past_key_values=theirs, layer_idx=0, allow_is_causal_skip=False)
        padding = torch.zeros(ROWS, LENGTH, dtype=torch.int64)
        padding[:, :seen + queries] = real[:, :seen + queries]
        got_mask = window_cache.window_masks(config, padding, torch.tensor(seen), queries,
                                             torch.float32)
        keys, values = _states(generator, queries)
        want = theirs.layers[0].update(keys, values)
        got = mine.update(keys, values)
        count = WINDOW - 1 + queries
        assert got[0].shape[2] == got_mask.shape[-1] == count
        assert mine.keys.shape[2] == WINDOW  # the ring, never longer
        if seen >= WINDOW - 1:  # the evicting cache is full: the same attention, bit for bit
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), seen
            assert torch.equal(got_mask, want_mask), seen
        else:  # generate's keys from index 0, then the slots not written yet, masked
            held = seen + queries
            assert torch.equal(got[0][:, :, :held], want[0]), seen
            assert torch.equal(got[1][:, :, :held], want[1]), seen
            assert torch.equal(got_mask[..., :held], want_mask), seen
            assert not got_mask[..., held:].any(), seen
        seen += queries
    assert mine.cumulative_length == seen


def test_a_prefill_longer_than_the_ring_keeps_the_real_prompts_last_positions():
    """A prompt of 10 tokens padded to a bucket of 12 (past the ring's 8 slots): the ring
    keeps positions 2 to 9, not the padding; decoding from position 10 on attends as
    generate does after the same 10 tokens."""
    theirs = transformers.DynamicCache(config=_config())
    mine = window_cache.window_layer(WINDOW, torch.tensor(10))
    generator = torch.Generator().manual_seed(1)
    keys, values = _states(generator, 12)
    got = mine.update(keys, values)
    theirs.layers[0].update(keys[:, :, :10], values[:, :, :10])
    assert got[0].shape[2] == WINDOW - 1 + 12
    assert torch.equal(got[0][:, :, :12], keys)  # the prefill attends over its own, first
    mine.cumulative_length.fill_(10)  # what the Generator does after a prefill
    for _ in range(12):
        keys, values = _states(generator, 1)
        want, got = theirs.layers[0].update(keys, values), mine.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_view_of_a_ring_keeps_every_slot():
    """A position's slot is taken modulo the slots held: a view narrower than the ring
    would move them (the full-attention layers' views narrow to the view's length)."""
    config = _config()
    cache = cache_utils.static_cache(config, LENGTH,
                                     lambda size, width: window_cache.window_layer(
                                         width, torch.tensor(0)))
    layer = cache.layers[0]
    assert window_cache.is_window_layer(layer)
    layer.update(*_states(torch.Generator().manual_seed(2), 1))  # allocates the ring
    for length in (4, 16):
        view = cache_utils.cache_view(cache, 1, length)
        assert view.layers[0].keys.shape[2] == WINDOW
        assert view.layers[0].keys.data_ptr() == layer.keys.data_ptr()
        assert cache_utils.view_length(view) == length


def test_a_window_layer_refuses_a_mask_built_from_a_2d_one():
    """transformers builds a mask from a 2-D one with a full-length cache's positions, not
    the joined keys': the layer refuses it instead of attending under the wrong mask."""
    config = _config()
    model = transformers.MistralForCausalLM(config).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=LENGTH)
    cache.layers = [window_cache.window_layer(WINDOW, torch.tensor(0))]
    ids = torch.zeros(1, 1, dtype=torch.int64)
    with torch.no_grad(), pytest.raises(RuntimeError, match="masks of window_masks"):
        model(input_ids=ids, attention_mask=torch.ones(1, 1, dtype=torch.int64),
              past_key_values=cache, use_cache=True)


def test_a_mask_over_a_view_shorter_than_the_joined_keys():
    """A prefill into a cache bucket shorter than the window: the joined keys run past the
    view's last position; those are slots not written yet, masked, and the written ones
    keep transformers' mask."""
    config = _config()
    queries, length = 5, 6
    padding = torch.ones(ROWS, length, dtype=torch.int64)
    padding[1, :2] = 0
    got = window_cache.window_masks(config, padding, torch.tensor(0), queries, torch.float32)
    want = transformers.masking_utils.create_sliding_window_causal_mask(
        config=config, inputs_embeds=torch.zeros(ROWS, queries, config.hidden_size),
        attention_mask=padding[:, :queries], past_key_values=transformers.DynamicCache(
            config=config), layer_idx=0, allow_is_causal_skip=False)
    assert got.shape[-1] == WINDOW - 1 + queries
    assert torch.equal(got[..., :queries], want)
    assert not got[..., queries:].any()

"""Sliding-window layers that attend over generate's keys (``_internals.window_cache``): forward
by forward, the keys, values and masks a WindowLayer hands attention against those of
transformers' own evicting cache (``DynamicCache`` with a ``DynamicSlidingWindowLayer``) and
its own mask builder, fed the same states."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cugraphrt_torch._internals import window_cache  # noqa: E402

WINDOW, LENGTH, ROWS, HEADS, DIM = 8, 40, 2, 2, 4
#: Forwards of a prefill, decode steps across the window's edge, a 3-token forward (a
#: speculative verify's shape) once the window is full, and decode steps after it.
QUERIES = [5] + [1] * 10 + [3] + [1] * 12


def _config():
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=DIM,
        sliding_window=WINDOW, max_position_embeddings=128)
    config._attn_implementation = "sdpa"
    return config


def test_a_window_layer_attends_over_generates_keys_under_generates_mask():
    config = _config()
    theirs = transformers.DynamicCache(config=config)
    mine = window_cache.window_layer(LENGTH, WINDOW)
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
        position = torch.tensor(seen)
        got_mask = window_cache.window_masks(config, padding, position, queries, torch.float32)
        keys, values = (torch.randn(ROWS, HEADS, queries, DIM, generator=generator)
                        for _ in range(2))
        want = theirs.layers[0].update(keys, values)
        got = mine.update(keys, values)
        full = seen >= WINDOW - 1  # the evicting cache holds window - 1 keys before it
        count = WINDOW - 1 + queries
        assert got[0].shape[2] == got_mask.shape[-1] == count
        if full:  # the same keys, values and mask: the same attention, bit for bit
            assert want[0].shape[2] == count
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), seen
            assert torch.equal(got_mask, want_mask), seen
        else:  # positions from 0: generate's, then the ones not yet written, masked
            held = seen + queries
            assert torch.equal(got[0][:, :, :held], want[0]), seen
            assert torch.equal(got_mask[..., :held], want_mask), seen
            assert not got_mask[..., held:].any(), seen
        seen += queries
    assert mine.cumulative_length == seen


def test_a_window_layer_attends_over_its_whole_view_where_that_is_no_longer():
    """A view of at most window - 1 + queries positions is all of the layer's keys: the
    layer hands them over as they are, and the masks cover the view."""
    config = _config()
    layer = window_cache.window_layer(WINDOW, WINDOW)
    keys = torch.randn(ROWS, HEADS, 1, DIM)
    got, _ = layer.update(keys, keys)
    assert got.shape[2] == WINDOW and got.data_ptr() == layer.keys.data_ptr()
    assert window_cache.gathered(WINDOW, 1, WINDOW) is None
    masks = window_cache.window_masks(config, torch.ones(ROWS, WINDOW, dtype=torch.int64),
                                      torch.tensor(0), 1, torch.float32)
    assert masks.shape[-1] == WINDOW


def test_a_window_layer_refuses_a_mask_built_from_a_2d_one():
    """transformers builds a mask from a 2-D one with positions from 0, which the gathered
    keys do not start at: the layer refuses it instead of attending under the wrong mask."""
    config = _config()
    model = transformers.MistralForCausalLM(config).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=LENGTH)
    cache.layers = [window_cache.window_layer(LENGTH, WINDOW)]
    ids = torch.zeros(1, 1, dtype=torch.int64)
    with torch.no_grad(), pytest.raises(RuntimeError, match="masks of window_masks"):
        model(input_ids=ids, attention_mask=torch.ones(1, 1, dtype=torch.int64),
              past_key_values=cache, use_cache=True)

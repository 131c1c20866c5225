"""A write position per row for transformers' ``StaticCache``, and the attention masks that go
with it: what lets the rows of a speculative step keep different numbers of tokens.

transformers' ``StaticLayer`` writes a forward's keys and values at one position for the
whole batch (its ``cumulative_length``) and the model builds its masks from that position.
:func:`per_row_cache` swaps each layer for one that writes row ``r``'s keys from
``row_starts[r]`` on (a scatter, on the device), every layer reading the same
``row_starts``; :func:`row_masks` builds the masks that match: row ``r``'s query ``j``
sits at cache position ``offsets[r] + j`` and attends to what the row's 2-D mask keeps at or
before it (and, in a sliding-window layer, inside the window), through transformers' own
mask interface, so that each attention implementation gets its own format (a boolean mask
for ``sdpa``, an additive one for ``eager``) as from the model's own masks.

Tested on transformers 5.17: ``cache_utils.StaticLayer`` (``keys``, ``values``,
``update``), ``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`` (``sdpa_mask`` and
``eager_mask`` with ``mask_function``, ``q_offset``, ``use_vmap`` and
``allow_is_causal_skip``), ``create_causal_mask`` and ``create_sliding_window_causal_mask``
returning a 4-D mask as it is, and the hybrid models (Gemma 2 and 3, gpt-oss, Qwen3) taking a
dict of masks per layer type in ``attention_mask``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .transformers import layer_kinds

__all__ = ["MASKED_IMPLEMENTATIONS", "attention_implementation", "per_row_cache", "row_starts",
           "row_masks"]

#: Attention implementations whose masks :func:`row_masks` builds (flash attention takes
#: 2-D masks, which cannot offset a row's queries).
MASKED_IMPLEMENTATIONS = ("sdpa", "eager")


def attention_implementation(config: Any) -> str | None:
    """The attention implementation a model's config names (``config._attn_implementation``
    in transformers 5.17), or None where it names none."""
    return getattr(config, "_attn_implementation", None)


@functools.cache
def _row_layer() -> Any:
    from transformers.cache_utils import StaticLayer

    class RowLayer(StaticLayer):
        """A ``StaticLayer`` (allocated) that writes row ``r`` from ``row_starts[r]`` on."""

        row_starts: torch.Tensor

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            rows, heads, length = key_states.shape[:3]
            at = self.row_starts[:rows, None] + torch.arange(length, device=key_states.device)
            at = at[:, None, :, None]
            self.keys.scatter_(2, at.expand(rows, heads, length, self.keys.shape[-1]),
                               key_states)
            self.values.scatter_(2, at.expand(rows, heads, length, self.values.shape[-1]),
                                 value_states)
            return self.keys, self.values

    return RowLayer


def per_row_cache(cache: Any) -> torch.Tensor:
    """Make every layer of ``cache`` (a ``StaticCache`` whose layers are allocated
    ``StaticLayer``) write each row from its own position; returns those positions, one
    int64 per row on the cache's device, shared by every layer (and by
    :func:`~.transformers.cache_view`'s views, which copy the layers)."""
    first = cache.layers[0]
    starts = torch.zeros(first.keys.shape[0], dtype=torch.int64, device=first.keys.device)
    kind = _row_layer()
    layers = []
    for layer in cache.layers:
        mine = object.__new__(kind)  # the layer's state moves over as it is
        mine.__dict__.update(layer.__dict__)
        mine.row_starts = starts
        layers.append(mine)
    cache.layers = layers
    return starts


def row_starts(cache: Any) -> torch.Tensor | None:
    """The write positions of a :func:`per_row_cache`, or None for any other cache."""
    return getattr(cache.layers[0], "row_starts", None)


def row_masks(config: Any, padding: torch.Tensor, offsets: torch.Tensor, queries: int,
              dtype: torch.dtype, gathered: tuple[torch.Tensor, int] | None = None) -> Any:
    """The ``attention_mask`` argument for a forward of ``queries`` tokens per row over a
    :func:`per_row_cache` view of ``padding.shape[1]`` positions: row ``r``'s query ``j``
    at cache position ``offsets[r] + j`` attends to the positions ``kv`` with
    ``padding[r, kv]`` set and ``kv <= offsets[r] + j`` (and, in sliding-window layers,
    ``kv > offsets[r] + j - config.sliding_window``, transformers' window). ``offsets`` of
    one element holds for every row. ``gathered``, ``(start, count)``: the sliding-window
    layers attend over the ``count`` positions from ``start`` (a 0-d device tensor; those
    past the last query masked) only (:mod:`.window_cache`), the full-attention ones over
    the whole view.

    One 4-D mask where every layer has the same kind; a dict by layer type (the hybrid
    models' ``causal_mask_mapping``) where kinds mix."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    rows, length = padding.shape
    keep = padding.bool()
    at = offsets.view(-1).expand(rows)
    start, count = gathered if gathered is not None else (0, length)

    def causal(batch: Any, head: Any, query: Any, key: Any) -> Any:
        return (key <= query + at[batch]) & keep[batch, key]

    def sliding(batch: Any, head: Any, query: Any, key: Any) -> Any:
        # The key's position in the cache; those past the last query are slots not written
        # yet, masked by causality (and may lie past the view: clamped to read ``keep``).
        position = key + start
        return (position <= query + at[batch]) & (
            position > query + at[batch] - config.sliding_window) & \
            keep[batch, position.clamp(0, length - 1)]

    make = ALL_MASK_ATTENTION_FUNCTIONS[attention_implementation(config)]
    masks = {}
    for kind in sorted(set(layer_kinds(config))):
        function, keys = (sliding, count) if kind == "sliding_attention" else (causal, length)
        masks[kind] = make(batch_size=rows, q_length=queries, kv_length=keys, q_offset=0,
                           kv_offset=0, mask_function=function, attention_mask=None,
                           allow_is_causal_skip=False, dtype=dtype, config=config,
                           use_vmap=False, device=padding.device)
    return next(iter(masks.values())) if len(masks) == 1 else masks

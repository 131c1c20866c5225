"""Sliding-window layers held in a ring of the window's length, whose attention gets the keys
of ``generate``'s evicting cache: the same positions, in the same order, under the same mask.

transformers' ``DynamicSlidingWindowLayer`` keeps a sliding layer's last ``window - 1`` keys;
a forward of ``q`` tokens attends over those and its own, ``window - 1 + q`` keys oldest
first, under an explicit mask once the window is full. Attending instead over every
position of a full-length cache, the oldest masked, computes the same softmax over more
keys, which the attention kernels reduce in other blocks; in bfloat16 a tie between two
logits can then go the other way (measured on an H200: docs/generation.md).

A :class:`WindowLayer` holds ``window`` slots, position ``p`` in slot ``p % window``. A
forward whose first query is at position ``p0`` (the layer's write counter, on the device)
gathers the positions before ``p0`` that the window holds (``min(p0, window - 1)``) from
their slots, oldest first, writes its own keys into theirs, and hands attention
``window - 1 + q`` keys for ``q`` queries: those positions, its own keys, then slots not
written yet. Once the window is full that is ``generate``'s keys exactly; before, it is
``generate``'s from index 0 with the unwritten slots after them, masked, as a full-length
layer lays out its keys (a layout whose first keys were the masked ones reduced in other
blocks than ``generate``'s and parted from its tokens before the window's edge, measured on
an H200). One graph serves every step before the window fills and after.
:func:`window_masks` builds the mask over the same positions through transformers' own mask
interface (a boolean mask for ``sdpa``, an additive one for ``eager``), and the
full-attention layers' over the whole view. A prefill longer than the ring keeps the last
``window`` positions of the prompt, up to the prompt's real length (:func:`set_prompt_end`),
not of its padding.

Tested on transformers 5.17: ``cache_utils.StaticLayer`` (``lazy_initialization``,
``is_initialized``, ``keys``, ``values``, ``cumulative_length``, ``max_cache_len``),
``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`` and the models taking a 4-D mask, or a dict of
them by layer type, as they are (see :mod:`.row_cache`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .row_cache import row_masks

__all__ = ["window_layer", "is_window_layer", "set_prompt_end", "window_masks"]


@functools.cache
def _window_layer() -> Any:
    from transformers.cache_utils import StaticLayer

    class WindowLayer(StaticLayer):
        """A sliding-window layer of ``window`` slots (see the module)."""

        #: Views keep every slot (:func:`.transformers.cache_view`): a position's slot is
        #: taken modulo the slots held.
        ring = True
        window: int
        #: Where the prompt's real tokens end (a 0-d device tensor shared by the cache's
        #: window layers): a forward longer than the ring keeps the positions before it.
        prompt_end: torch.Tensor

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            queries, slots = key_states.shape[2], self.keys.shape[2]
            first = self.cumulative_length
            device = key_states.device
            # The positions held before the first query (window - 1 once the window is
            # full), oldest first, then the forward's own keys, then the slots not written
            # yet (masked): generate's keys from index 0, as a full-length layer lays them.
            held = first.clamp(max=self.window - 1)
            joined = torch.arange(self.window - 1 + queries, device=device)
            at = (first - held + joined).remainder(slots)
            keys, values = self.keys.index_select(2, at), self.values.index_select(2, at)
            if queries <= slots:
                into = (first + torch.arange(queries, device=device)).remainder(slots)
                self.keys.index_copy_(2, into, key_states)
                self.values.index_copy_(2, into, value_states)
            else:  # a prefill longer than the ring: the last positions of the real prompt
                kept = self.prompt_end - slots + torch.arange(slots, device=device)
                source = (kept - first).clamp(0, queries - 1)
                into = kept.remainder(slots)
                self.keys.index_copy_(2, into, key_states.index_select(2, source))
                self.values.index_copy_(2, into, value_states.index_select(2, source))
            self.cumulative_length.add_(queries)
            own = held + joined[:queries]
            keys.index_copy_(2, own, key_states)
            values.index_copy_(2, own, value_states)
            return keys, values

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            # What transformers asks before it builds a mask from a 2-D one: its positions
            # would be those of a full-length cache, not of the joined keys.
            raise RuntimeError("a WindowLayer's attention takes the masks of window_masks "
                               "(4-D, or a dict of them by layer type), not a 2-D mask")

    return WindowLayer


def window_layer(window: int, prompt_end: torch.Tensor) -> Any:
    """A :class:`WindowLayer` of ``window`` slots (allocated by the first forward that uses
    it, as a ``StaticLayer``), reading the prompt's end from ``prompt_end``."""
    layer = _window_layer()(max_cache_len=window)
    layer.window = window
    layer.prompt_end = prompt_end
    return layer


def is_window_layer(layer: Any) -> bool:
    """Whether ``layer`` is a :class:`WindowLayer` (a per-row cache's layers are not)."""
    return isinstance(layer, _window_layer())


def set_prompt_end(cache: Any, end: torch.Tensor) -> None:
    """Before a prefill: the real prompt ends at ``end`` (a 0-d device tensor), for every
    window layer of ``cache``."""
    for layer in cache.layers:
        if is_window_layer(layer):
            layer.prompt_end.copy_(end)
            return  # one tensor, shared by the cache's window layers


def window_masks(config: Any, padding: torch.Tensor, position: torch.Tensor, queries: int,
                 dtype: torch.dtype) -> Any:
    """The ``attention_mask`` argument for a forward of ``queries`` tokens whose first query
    is written at ``position`` (a 0-d device tensor, every row's) over a view of
    ``padding.shape[1]`` positions of a cache with :class:`WindowLayer` s: the masks of
    :func:`.row_cache.row_masks`, the sliding-window layers' over the ``window - 1 +
    queries`` positions from the oldest the window holds (those past the last query
    masked)."""
    window = config.sliding_window
    where = ((position - (window - 1)).clamp(min=0), window - 1 + queries)
    return row_masks(config, padding, position, queries, dtype, gathered=where)

"""Sliding-window layers that attend over the keys of ``generate``'s evicting cache: the same
positions, in the same order, under the same mask.

transformers' ``DynamicSlidingWindowLayer`` keeps a sliding layer's last ``window - 1`` keys;
a forward of ``q`` tokens attends over those and its own, ``window - 1 + q`` keys oldest
first, under an explicit mask once the window is full. The Generator's cache keeps every
position (a ``StaticLayer`` at full length, the window masked,
:func:`.transformers.static_cache`): its attention computes the same softmax over more keys,
which the attention kernels reduce in other blocks, and in bfloat16 a tie between two
logits can then go the other way (measured on an H200: docs/generation.md).

A :class:`WindowLayer` keeps that full-length store, written at its device counter as a
``StaticLayer`` writes, and where a view of the cache is longer than ``window - 1 + q``
hands attention only the ``window - 1 + q`` positions that end at the forward's last query
(:func:`span`: gathered on the device, from a start computed from the write counter, so
that one graph serves every step). :func:`window_masks` builds the masks over those
positions, through transformers' own mask interface (a boolean mask for ``sdpa``, an
additive one for ``eager``), and over the whole view for the model's full-attention
layers. Before the window fills, the gathered positions start at 0 and the ones not yet
written are masked, as the full-length layout masks them.

Tested on transformers 5.17: ``cache_utils.StaticLayer`` (``update``, ``cumulative_length``,
``max_cache_len``), ``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`` and the models taking a
4-D mask, or a dict of them by layer type, as they are (see :mod:`.row_cache`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .row_cache import row_masks

__all__ = ["gathered", "span", "window_layer", "is_window_layer", "window_masks"]


def gathered(window: int, queries: int, length: int) -> int | None:
    """How many positions a sliding layer of ``window`` attends over in a forward of
    ``queries`` tokens over a view of ``length`` positions (``window - 1 + queries``, what
    ``generate``'s evicting cache holds then), or None where that is the whole view."""
    count = window - 1 + queries
    return count if count < length else None


def span(position: torch.Tensor, window: int, queries: int, length: int
         ) -> tuple[torch.Tensor, int] | None:
    """The positions a sliding layer attends over in a forward whose first query is written
    at ``position`` (a 0-d device tensor): their start (a 0-d device tensor: the window's
    oldest key, 0 before the window fills, never past ``length - count``) and their count
    (:func:`gathered`), or None where the layer attends over the whole view."""
    count = gathered(window, queries, length)
    if count is None:
        return None
    return (position - (window - 1)).clamp(0, length - count), count


@functools.cache
def _window_layer() -> Any:
    from transformers.cache_utils import StaticLayer

    class WindowLayer(StaticLayer):
        """A full-length ``StaticLayer`` whose attention reads the positions of
        ``generate``'s sliding-window cache (:func:`span`)."""

        window: int

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            queries = key_states.shape[2]
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            # The counter has moved past this forward's tokens: its first query sits at
            # counter - queries.
            where = span(self.cumulative_length - queries, self.window, queries,
                         keys.shape[2])
            if where is None:
                return keys, values
            start, count = where
            at = start + torch.arange(count, device=keys.device)
            return keys.index_select(2, at), values.index_select(2, at)

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            # What transformers asks before it builds a mask from a 2-D one: its positions
            # would start at 0, not at the gathered keys' start (a device value).
            raise RuntimeError("a WindowLayer's attention takes the masks of window_masks "
                               "(4-D, or a dict of them by layer type), not a 2-D mask")

    return WindowLayer


def window_layer(length: int, window: int) -> Any:
    """A :class:`WindowLayer` of ``length`` positions for a sliding layer of ``window``
    (allocated by the first forward that uses it, as a ``StaticLayer``)."""
    layer = _window_layer()(max_cache_len=length)
    layer.window = window
    return layer


def is_window_layer(layer: Any) -> bool:
    """Whether ``layer`` is a :class:`WindowLayer` (a per-row cache's layers are not)."""
    return isinstance(layer, _window_layer())


def window_masks(config: Any, padding: torch.Tensor, position: torch.Tensor, queries: int,
                 dtype: torch.dtype) -> Any:
    """The ``attention_mask`` argument for a forward of ``queries`` tokens whose first query
    is written at ``position`` (a 0-d device tensor, every row's) over a view of
    ``padding.shape[1]`` positions of a cache with :class:`WindowLayer` s: the masks of
    :func:`.row_cache.row_masks`, the sliding-window layers' over the positions of
    :func:`span`."""
    where = span(position, config.sliding_window, queries, padding.shape[1])
    return row_masks(config, padding, position, queries, dtype, gathered=where)

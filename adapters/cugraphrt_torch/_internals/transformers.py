"""transformers' ``StaticCache`` internals: its layers' tensors, write counters and length.

Tested on transformers 5.17 (``StaticCache`` holds ``layers``, each a ``StaticLayer`` with
``keys``, ``values``, ``max_cache_len``, ``cumulative_length``, and ``batch_size`` once
allocated, or a sliding layer with ``is_sliding``). Earlier releases kept one tensor list
per cache (``key_cache``): :func:`static_cache` refuses what lacks ``layers`` or their
write counters, with the reason.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["static_cache", "sliding_layers", "has_write_counters", "write_counters",
           "cache_tensors", "cache_view", "view_length"]


def static_cache(config: Any, length: int) -> Any:
    """``transformers.StaticCache(config=config, max_cache_len=length)``; its tensors are
    allocated by the first forward that uses it."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=length)


def sliding_layers(cache: Any) -> list[int]:
    """The indices of the cache's sliding-window layers (``layer.is_sliding``)."""
    return [i for i, layer in enumerate(cache.layers) if getattr(layer, "is_sliding", False)]


def has_write_counters(cache: Any) -> bool:
    """Whether the cache's layers count their writes on the device (``cumulative_length``:
    transformers 5 ``StaticLayer``)."""
    layers: Any = getattr(cache, "layers", None)
    return bool(layers) and hasattr(layers[0], "cumulative_length")


def write_counters(cache: Any) -> list[Any]:
    """Each layer's write counter (``layer.cumulative_length``, a 0-d int64 device tensor)."""
    return [layer.cumulative_length for layer in cache.layers]


def cache_tensors(cache: Any) -> list[Any]:
    """Every layer's keys and values."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def cache_view(cache: Any, rows: int, length: int) -> Any:
    """A cache over the first ``rows`` sequences and ``length`` positions of ``cache``.

    A shallow copy of the cache and of each layer, with ``keys`` and ``values`` narrowed and
    ``max_cache_len`` (and ``batch_size``, where the layer has one) set: the view shares
    every layer's write counter with ``cache``, and its attention reads ``length`` keys.
    """
    view = copy.copy(cache)
    view.layers = []
    for layer in cache.layers:
        mine = copy.copy(layer)
        mine.keys = layer.keys[:rows, :, :length]
        mine.values = layer.values[:rows, :, :length]
        mine.max_cache_len = length
        if hasattr(mine, "batch_size"):
            mine.batch_size = rows
        view.layers.append(mine)
    return view


def view_length(view: Any) -> int:
    """The positions a cache (or :func:`cache_view`) attends over."""
    return view.layers[0].max_cache_len

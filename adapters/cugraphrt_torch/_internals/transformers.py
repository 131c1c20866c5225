"""transformers' ``StaticCache`` internals: its layers' tensors, write counters and length;
and the experts implementation of its mixture-of-experts models.

Tested on transformers 5.17 (``StaticCache`` holds ``layers``, each a ``StaticLayer`` with
``keys``, ``values``, ``max_cache_len``, ``cumulative_length``, and ``batch_size`` once
allocated, or a sliding layer with ``is_sliding``). Earlier releases kept one tensor list
per cache (``key_cache``): :func:`static_cache` refuses what lacks ``layers`` or their
write counters, with the reason.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["static_cache", "layer_kinds", "uncached_kinds", "sliding_layers",
           "has_write_counters", "write_counters",
           "cache_tensors", "cache_view", "view_length", "graph_safe_experts"]

#: Experts implementations whose forward never reads routing on the host (transformers 5.17:
#: ``batched_mm`` gathers each token's experts' weights and runs batched matmuls).
GRAPH_SAFE_EXPERTS = ("batched_mm",)


#: Layer kinds (``config.layer_types``) a full-length ``StaticLayer`` caches exactly: full
#: attention, and sliding-window attention, whose window the model's own mask applies.
CACHED_AT_FULL_LENGTH = ("full_attention", "sliding_attention")


def static_cache(config: Any, length: int,
                 sliding: Callable[[int, Any], Any] | None = None) -> Any:
    """``transformers.StaticCache(config=config, max_cache_len=length)`` with every layer a
    ``StaticLayer`` of ``length`` positions, sliding-window layers included (or what
    ``sliding(length, window)`` makes for them, ``window`` the text config's
    ``sliding_window``: the Generator's rings, :func:`.window_cache.window_layer`); its
    tensors are allocated by the first forward that uses it.

    transformers' ``StaticSlidingWindowLayer`` keeps its fill level in a Python int and
    branches on it (append, then roll once full): a graph would bake in the branch of the
    step it captured. A full-length layer writes at its device counter like any other, and
    the model's sliding-window mask (built from ``config.sliding_window`` over the cache
    positions, the same mask function as for transformers' own caches) keeps each query to
    its window: the keys outside it are masked, not evicted. Tested on transformers 5.17
    (``cache_utils.StaticLayer``, ``cache_utils.get_layer_types_and_kwargs``); layers of
    other kinds (:func:`uncached_kinds`) keep transformers' own.
    """
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=config, max_cache_len=length)
    kinds = layer_kinds(config)
    if len(kinds) == len(cache.layers):
        make = sliding or (lambda size, window: StaticLayer(max_cache_len=size))
        window = getattr(config.get_text_config(decoder=True), "sliding_window", None)
        cache.layers = [make(length, window) if kind == "sliding_attention"
                        else layer for kind, layer in zip(kinds, cache.layers, strict=True)]
    return cache


def layer_kinds(config: Any) -> list[str]:
    """The kind of every cached layer of ``config``'s text model (``layer_types``, or what
    transformers infers without it: sliding everywhere where the config has a window)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    return list(get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0])


def uncached_kinds(config: Any) -> list[str]:
    """The layer kinds of ``config`` that :func:`static_cache` does not cache at full length
    (chunked, linear and hybrid attention, ...), each once."""
    return sorted({kind for kind in layer_kinds(config) if kind not in CACHED_AT_FULL_LENGTH})


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
        # A ring (window_cache) keeps every slot: its positions map to them modulo the slots.
        held = None if getattr(layer, "ring", False) else length
        mine.keys = layer.keys[:rows, :, :held]
        mine.values = layer.values[:rows, :, :held]
        mine.max_cache_len = length
        if hasattr(mine, "batch_size"):
            mine.batch_size = rows
        view.layers.append(mine)
    return view


def view_length(view: Any) -> int:
    """The positions a cache (or :func:`cache_view`) attends over."""
    return view.layers[0].max_cache_len


@contextlib.contextmanager
def graph_safe_experts(module: Any, implementation: str | None = None) -> Iterator[bool]:
    """While the block runs, every transformers mixture-of-experts model in ``module`` (itself
    or a submodule) computes its experts with ``batched_mm`` (yields True), whose forward reads
    no routing on the host; each model's own implementation comes back after. Anything else
    runs as it is (yields False). ``implementation``: that one instead, for every model (a
    name :func:`.experts.register_experts` registered: ``batched_mm``'s forward too).

    The default experts of transformers 5.17 read routing counts on the host (``offs.tolist()``
    in ``grouped_mm``'s fallback, a loop over the experts hit in ``eager``), which a capture
    refuses. Tested on transformers 5.17: ``_can_set_experts_implementation`` (a class method
    reading the model's source for ``@use_experts_implementation``),
    ``get_experts_implementation`` and ``set_experts_implementation`` (a dict per sub-config).
    """
    switched: list[tuple[Any, dict]] = []
    modules = module.modules() if hasattr(module, "modules") else (module,)
    try:
        for model in modules:
            can_set = getattr(type(model), "_can_set_experts_implementation", None)
            if can_set is None or not can_set() \
                    or not hasattr(model, "get_experts_implementation"):
                continue
            original = model.get_experts_implementation()
            wanted = {key: implementation or (
                value if value in GRAPH_SAFE_EXPERTS else GRAPH_SAFE_EXPERTS[0])
                for key, value in original.items()}
            if wanted != original:
                model.set_experts_implementation(wanted)
                switched.append((model, original))
        yield bool(switched)
    finally:
        for model, original in reversed(switched):
            model.set_experts_implementation(original)

"""A family of torch CUDA graphs built the way vLLM builds one: the reference of the bucket
workloads (``many_shapes``, ``serving``).

vLLM captures its decode step once per batch size it serves (its ``CUDAGraphWrapper``, run by
the model runner's ``capture_model``): sizes largest first, all in one
``torch.cuda.graph_pool_handle()``, every size's inputs views of one buffer of the largest
size, its outputs kept as weak references (``weak_ref_tensors``: the next capture may reuse
their memory). Per size it runs the step once eagerly, then captures it with
``torch.cuda.graph`` on the stream that warm-up ran on. From the second capture on it patches
``gc.collect`` and ``torch.cuda.empty_cache`` out of ``torch.cuda.graph``'s entry (a
collection and an emptied cache per size would cost each capture time and give nothing
back). :class:`VllmGraphs` does the same with torch alone. torch is imported by the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from .torch_common import weak_ref

__all__ = ["VllmGraphs", "WARMUPS"]

#: Eager runs per size before its capture: vLLM's one.
WARMUPS = 1


class VllmGraphs:
    """One ``torch.cuda.graph`` per size, built as the module docstring says.

    Parameters
    ----------
    torch : module
    fn : callable
        ``fn(*args)`` returns a tensor; captured under the caller's grad mode.
    args_for : callable
        ``args_for(size)``: the size's static inputs (views of the caller's buffers).
    sizes : sequence of int
        The sizes to capture; captured largest first.
    warmups : int, default :data:`WARMUPS`

    Attributes
    ----------
    graphs : dict of int to (torch.cuda.CUDAGraph, torch.Tensor)
        Per size, the graph and its output (a weak reference over the pool's memory, valid
        until the next replay of any graph of the family).
    stream : torch.cuda.Stream
        The one stream every warm-up and capture ran on.
    """

    def __init__(self, torch, fn: Callable[..., Any], args_for: Callable[[int], tuple],
                 sizes: Sequence[int], warmups: int = WARMUPS) -> None:
        pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        self.graphs: dict[int, tuple[Any, Any]] = {}
        with torch.cuda.stream(self.stream):
            for size in sorted(sizes, reverse=True):
                args = args_for(size)
                for _ in range(warmups):
                    fn(*args)
                graph = torch.cuda.CUDAGraph()
                with _quiet_entry(torch, first=not self.graphs), \
                        torch.cuda.graph(graph, pool=pool, stream=self.stream):
                    out = weak_ref(torch, fn(*args))
                self.graphs[size] = (graph, out)
        torch.cuda.current_stream().wait_stream(self.stream)


def _quiet_entry(torch, first: bool) -> contextlib.AbstractContextManager:
    """vLLM's patches around every capture but the first: no collection, no emptied cache."""
    if first:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("gc.collect", lambda *args, **kwargs: 0))
    stack.enter_context(mock.patch.object(torch.cuda, "empty_cache", lambda: None))
    return stack

"""The warm-up of an inference capture: ``module(*args)`` run on the capture stream, from the
capture's pool, right before the capture (:func:`~cugraphrt_torch.capture.capture.warmed_graph`).

:func:`graph_module` captures its one shape this way, and a bucket family its first bucket
(the largest: what the warm-ups load, every smaller bucket's capture finds loaded).
"""

from __future__ import annotations

from cugraphrt import Graph, MemPool

from ..capture.capture import graph, warmed_graph

__all__ = ["warmed_capture"]


def warmed_capture(cuda_graph: Graph, pool: MemPool | None, module, args: tuple,
                   iterations: int) -> graph:
    """The capture of ``module(*args)`` into ``cuda_graph``, after ``iterations`` eager runs
    on the capture stream whose memory comes from the capture's pool: the capture reuses
    their activations, and the cuBLAS workspace they create is the graph's own. The caller
    sets the autograd and inference modes."""
    if iterations == 0:
        return graph(cuda_graph, pool=pool)

    def warm_up() -> None:
        for _ in range(iterations):
            module(*args)

    return warmed_graph(cuda_graph, pool, warm_up)

"""cugraphrt_torch: capture PyTorch work into cugraphrt graphs.

* :func:`to_cupy` / :func:`from_cupy`: zero-copy DLPack views, safe during capture.
* :class:`graph`: capture torch work (and CuPy work on the same stream) into a
  :class:`cugraphrt.Graph`, with torch's memory from the cugraphrt pool and a graph-safe
  CUDA RNG.
* :func:`graph_module`: a module's inference forward as a replayed graph.

See ``docs/torch.md`` for the design and ``examples/torch_inference.py``.
"""

from __future__ import annotations

from .capture import graph
from .dlpack import from_cupy, to_cupy
from .module import GraphedModule, graph_module

__all__ = ["GraphedModule", "from_cupy", "graph", "graph_module", "to_cupy"]

"""cugraphrt_torch: capture PyTorch work into cugraphrt graphs.

* :func:`to_cupy` / :func:`from_cupy`: zero-copy DLPack views, safe during capture.
* :class:`graph`: capture torch work (and CuPy work on the same stream) into a
  :class:`cugraphrt.Graph`, with torch's memory from the cugraphrt pool and a graph-safe
  CUDA RNG; its ``captured`` (:class:`CapturedGraph`) is what code built on a capture keeps:
  the graph, its replays, its memory and its number in the pool's order.
* :class:`CUDAGraph`, :func:`graph_pool_handle`, :func:`is_current_stream_capturing`:
  ``torch.cuda``'s graph names over cugraphrt's pools; with :class:`graph` and
  :func:`make_graphed_callables`, swapping the names is the whole migration
  (``docs/migrating.md``).
* :func:`graph_module`: a module's inference forward as a replayed graph, or with
  ``buckets`` one graph per shape bucket (:class:`BucketedModule`), or with ``pieces`` in
  pieces around the statements that need the host (:class:`PiecewiseModule`).
* :func:`while_loop` / :func:`cond`: loops and branches decided on the device, captured
  as CUDA conditional nodes (``docs/control-flow.md``).
* :class:`Generator`: greedy generation of a Hugging Face causal LM, many tokens per launch
  (``docs/generation.md``).
* :func:`make_graphed_callables`: forward and backward graphs for training, a drop-in for
  ``torch.cuda.make_graphed_callables`` that accumulates gradients safely.
* ``torch.compile(model, backend="cugraphrt")``: compiled code replayed as cugraphrt graphs
  (:mod:`cugraphrt_torch.compile.dynamo`); :func:`compile_report` says what was graphed.

See ``docs/torch.md`` and ``docs/training.md`` for the design, and ``examples/``.
"""

from __future__ import annotations

# The adapter ships in the cugraphrt distribution (pyproject.toml): one version for both.
from cugraphrt import __version__

from .autograd.autograd import make_graphed_callables
from .capture._adopted import CapturedGraph
from .capture.capture import graph
from .capture.cuda_graph import CUDAGraph, graph_pool_handle, is_current_stream_capturing
from .capture.dlpack import from_cupy, to_cupy
from .compile.dynamo import CompileOptions, compile_report, format_compile_report
from .control.control import cond, while_loop
from .generation._speculative import DraftModel, PromptLookup
from .generation.generation import Generator, GeneratorStats
from .inference.bucketed import BucketedModule
from .inference.module import GraphedModule, graph_module
from .inference.pieces import PiecewiseModule

__all__ = ["__version__", "BucketedModule", "CUDAGraph", "CapturedGraph", "CompileOptions",
           "GraphedModule",
           "DraftModel", "Generator", "GeneratorStats", "PromptLookup", "compile_report",
           "cond",
           "format_compile_report",
           "from_cupy", "graph",
           "graph_module", "graph_pool_handle", "is_current_stream_capturing",
           "make_graphed_callables", "PiecewiseModule", "to_cupy", "while_loop"]

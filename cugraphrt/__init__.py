"""cugraphrt: capture CuPy work as CUDA graphs and replay it with one launch.

The public namespace is assembled here from the modules that own each concept; see
``docs/`` for the concepts and ``examples/`` for complete programs.
"""

from __future__ import annotations

from cugraphrt import _require  # noqa: F401 - first: a clear error without CuPy
from cugraphrt._callables.graphed import BucketedFunction, GraphedFunction, make_graphed
from cugraphrt._capture.graph_context import default_capture_stream, graph
from cugraphrt._capture.graphs import Graph
from cugraphrt._capture.graphs import hooks as _hooks
from cugraphrt._capture.launcher import Launcher
from cugraphrt._capture.stream import Stream, StreamGraph
from cugraphrt._capture.stream_capture import is_current_stream_capturing
from cugraphrt._control.bodies import BodyNodes
from cugraphrt._control.loops import cond, while_loop
from cugraphrt._libraries.capture_setup import prepare_capture as _prepare_capture
from cugraphrt._memory.pool import MemPool, empty_cache, graph_pool_handle
from cugraphrt._memory.pool_summary import device_stats, memory_summary
from cugraphrt._memory.replay_order import pool_checks_enabled, set_pool_checks
from cugraphrt.distributed.replay import arm_graph as _arm_graph
from cugraphrt.errors import (
    CaptureError,
    CollectiveTimeoutError,
    CugraphrtError,
    OptionsError,
    OverwrittenOutputError,
    PoolOrderError,
    PoolOutOfMemoryError,
    ReplayError,
)
from cugraphrt.options import (
    BucketStat,
    BucketStats,
    CaptureOptions,
    DeviceStats,
    GeneratorState,
    MakeGraphedOptions,
    PoolStats,
)

# The floors above the capture layer plug into it (it never imports them): the libraries
# prepare every capture, the collectives room arms graphs that captured collectives.
_hooks.prepare_capture = _prepare_capture
_hooks.arm_collectives = _arm_graph

__version__ = "0.1.0"

__all__ = [
    "BodyNodes", "BucketStat", "BucketStats", "BucketedFunction", "CaptureError", "CaptureOptions",
    "CollectiveTimeoutError",
    "CugraphrtError", "DeviceStats", "GeneratorState", "Graph", "GraphedFunction",
    "MakeGraphedOptions", "MemPool", "OptionsError", "OverwrittenOutputError", "PoolOrderError",
    "PoolOutOfMemoryError",
    "PoolStats", "ReplayError", "Launcher", "__version__", "default_capture_stream", "device_stats",
    "empty_cache", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed",
    "memory_summary", "pool_checks_enabled", "random", "set_pool_checks", "cond", "while_loop",
    "Stream", "StreamGraph",
]



def __getattr__(name: str):
    # cugraphrt.random compiles its kernels on first use; load it only when asked for.
    if name == "random":
        import importlib

        return importlib.import_module(".random", __name__)
    raise AttributeError(f"module 'cugraphrt' has no attribute {name!r}")

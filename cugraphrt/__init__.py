"""cugraphrt: capture CuPy work as CUDA graphs and replay it with one launch.

The public namespace is assembled here from the modules that own each concept; see
``docs/`` for the concepts and ``examples/`` for complete programs.
"""

from __future__ import annotations

from . import _require  # noqa: F401 - first: a clear error without CuPy
from . import errors as _errors
from . import graphed as _graphed
from . import graphs as _graphs
from . import options as _options
from . import pool as _pool
from ._capture import is_current_stream_capturing
from .errors import (
    CaptureError,
    CugraphrtError,
    OptionsError,
    PoolOrderError,
    PoolOutOfMemoryError,
    ReplayError,
)
from .graphed import BucketedFunction, GraphedFunction, make_graphed
from .graphs import Graph, default_capture_stream, graph
from .options import (
    BucketStat,
    BucketStats,
    CaptureOptions,
    GeneratorState,
    MakeGraphedOptions,
    PoolStats,
)
from .pool import (
    MemPool,
    empty_cache,
    graph_pool_handle,
    memory_summary,
    pool_checks_enabled,
    set_pool_checks,
)

__version__ = "0.1.0"

__all__ = sorted(
    set(_errors.__all__)
    | set(_graphs.__all__)
    | set(_graphed.__all__)
    | set(_pool.__all__)
    | {"CaptureOptions", "MakeGraphedOptions", "PoolStats", "GeneratorState", "BucketStat",
       "BucketStats"}
    | {"is_current_stream_capturing", "default_capture_stream", "random", "__version__"}
)

del _errors, _graphs, _graphed, _options, _pool


def __getattr__(name: str):
    # cugraphrt.random compiles its kernels on first use; load it only when asked for.
    if name == "random":
        import importlib

        return importlib.import_module(".random", __name__)
    raise AttributeError(f"module 'cugraphrt' has no attribute {name!r}")

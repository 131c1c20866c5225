"""make_graphed: turn a plain CuPy function into a replayed graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy

from . import _tree
from .errors import OptionsError, ReplayError
from .graphs import Graph, graph
from .options import MakeGraphedOptions, validate_options
from .pool import MemPool

__all__ = ["make_graphed", "GraphedFunction"]

_ndarray = cupy.ndarray
_copyto = cupy.copyto


def make_graphed(
    fn: Callable[..., Any],
    sample_args: tuple,
    *,
    num_warmup_iters: int = 3,
    pool: MemPool | None = None,
    copy_outputs: bool = False,
) -> GraphedFunction:
    """Capture ``fn(*sample_args)`` once and return a callable that replays it.

    The sample arrays become the graph's static inputs. Each call copies new inputs into
    them (no copy when the caller passes a static input itself), replays the graph and
    returns the static outputs.

    Parameters
    ----------
    fn : callable
        A function of CuPy arrays that issues its work on the current stream.
    sample_args : tuple
        Arguments to capture with: CuPy arrays, nested in tuples, lists and dicts as the
        function expects; other values are fixed at capture and must be passed equal.
    num_warmup_iters : int, default 3
        Eager runs on a side stream before capture.
    pool : MemPool, optional
        Pool for the capture (see :meth:`Graph.capture_begin`).
    copy_outputs : bool, default False
        Return copies of the outputs. By default the static outputs are returned, and the
        next call overwrites them.

    Returns
    -------
    GraphedFunction

    Raises
    ------
    OptionsError
        For bad options.
    CaptureError
        If ``fn`` does something capture forbids.
    """
    options = validate_options(MakeGraphedOptions, num_warmup_iters=num_warmup_iters,
                               copy_outputs=copy_outputs)
    if not callable(fn):
        raise OptionsError("fn", fn, "a callable")
    if not isinstance(sample_args, (tuple, list)):
        sample_args = (sample_args,)
    sample_args = tuple(sample_args)
    leaves, spec, paths = _tree.flatten(sample_args, "args")
    device_id = cupy.cuda.runtime.getDevice()
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, _ndarray) and leaf.data.device_id != device_id:
            raise OptionsError("sample_args", path, f"arrays on the current device "
                               f"{device_id} (got {path} on device {leaf.data.device_id})")

    _warm_up(fn, sample_args, options.num_warmup_iters)
    cuda_graph = Graph()
    with graph(cuda_graph, pool=pool):
        outputs = fn(*sample_args)
    return GraphedFunction(cuda_graph, fn, sample_args, outputs, options.copy_outputs)


def _warm_up(fn: Callable, args: tuple, iterations: int) -> None:
    if iterations == 0:
        return
    side = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(cupy.cuda.get_current_stream().record())
    with side:
        for _ in range(iterations):
            fn(*args)
    side.synchronize()


class GraphedFunction:
    """A captured function: call it like the original.

    Attributes
    ----------
    graph : Graph
        The underlying graph.
    static_inputs : tuple
        The arguments captured with (the sample arguments).
    static_outputs : Any
        The outputs the graph writes on every replay.
    """

    def __init__(self, cuda_graph: Graph, fn: Callable, sample_args: tuple, outputs: Any,
                 copy_outputs: bool) -> None:
        self.graph = cuda_graph
        self.__wrapped__ = fn
        self.static_inputs = sample_args
        self.static_outputs = outputs
        self._copy_outputs = copy_outputs
        leaves, self._spec, paths = _tree.flatten(sample_args, "args")
        self._flat = self._spec.is_flat_tuple
        self._num_leaves = len(leaves)
        # One entry per leaf, everything the call path needs precomputed.
        self._arrays = []
        self._constants = []
        for index, (leaf, path) in enumerate(zip(leaves, paths)):
            if isinstance(leaf, _ndarray):
                self._arrays.append((index, leaf, leaf.shape, leaf.dtype, leaf.data.device_id,
                                     leaf.nbytes, bool(leaf._c_contiguous), path))
            else:
                self._constants.append((index, leaf, path))
        self._out_leaves, self._out_spec, _ = _tree.flatten(outputs)
        self._replay = cuda_graph.replay

    def __call__(self, *args: Any) -> Any:
        if self._flat and len(args) == self._num_leaves:
            leaves = args
        else:
            leaves = self._structured_leaves(args)
        for index, static, shape, dtype, device, nbytes, contiguous, path in self._arrays:
            value = leaves[index]
            if value is static:
                continue
            if (type(value) is not _ndarray or value.shape != shape or value.dtype != dtype
                    or value.data.device_id != device):
                raise _mismatch(path, static, value)
            if not (contiguous and value._c_contiguous and value.data.ptr == static.data.ptr):
                _copy_into(static, value, nbytes, contiguous and value._c_contiguous)
        for index, expected, path in self._constants:
            if leaves[index] != expected:
                raise ReplayError(
                    f"argument {path} differs from the capture (expected {expected!r}, got "
                    f"{leaves[index]!r}); non-array arguments are baked into the graph: "
                    f"pass the captured value or graph the function again"
                )
        self._replay()
        if self._copy_outputs:
            return _tree.unflatten(self._out_spec, [
                leaf.copy() if isinstance(leaf, _ndarray) else leaf for leaf in self._out_leaves
            ])
        return self.static_outputs

    def _structured_leaves(self, args: tuple) -> list:
        leaves, spec, _ = _tree.flatten(args, "args")
        if spec != self._spec:
            raise ReplayError(
                f"arguments do not match the capture (expected structure "
                f"{self._spec.describe()} with {self._num_leaves} leaves, got "
                f"{spec.describe()}); pass arguments shaped like sample_args"
            )
        return leaves

    def __repr__(self) -> str:
        name = getattr(self.__wrapped__, "__name__", repr(self.__wrapped__))
        return f"<cugraphrt.GraphedFunction of {name} ({self._num_leaves} inputs)>"


def _copy_into(static: cupy.ndarray, value: cupy.ndarray, nbytes: int, flat: bool) -> None:
    """Copy a new input into its static buffer on the current stream."""
    if flat:
        static.data.copy_from_device_async(value.data, nbytes)  # one memcpy, no kernel
    else:
        _copyto(static, value)


def _describe(value: Any) -> str:
    if isinstance(value, _ndarray):
        return f"shape {value.shape} {value.dtype} on device {value.data.device_id}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__module__}.{type(value).__name__} of shape {value.shape}"
    return f"{type(value).__name__} {value!r}"


def _mismatch(path: str, static: Any, value: Any) -> ReplayError:
    return ReplayError(
        f"argument {path} does not match the capture (expected {_describe(static)}, got "
        f"{_describe(value)}); pass a CuPy array of the captured shape, dtype and device, "
        f"or graph the function again for the new shape"
    )

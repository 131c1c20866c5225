"""One compiled FX graph of the dynamo backend, run as cugraphrt graphs: the runtime.

A *piece* is what AOTAutograd hands a compiler: the inference graph, or the forward or the
backward graph, of one region dynamo traced between graph breaks. Its compiled code (Inductor's
or the FX interpreter's) takes a list of inputs and returns a list of outputs.

Per call: the first ``warmup`` calls of each shape run the compiled code eagerly (kernels are
compiled and loaded lazily, which a capture forbids); the next call captures it with
:class:`cugraphrt_torch.graph` and replays it once; later calls replay. Static inputs
(parameters, buffers, ``mark_static_address``) are read in place, so in-place updates of them
(KV caches, counters) are part of the graph. Other tensors are copied into buffers owned by
the recording, and those the graph writes to are copied back after each replay. A static
input found at another address re-records, a bounded number of times. Outputs are copies, or
with ``copy_outputs=False`` fresh tensors over the recording's outputs that raise when read
after a later replay overwrote them (``_output_check``).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cugraphrt import Graph, MemPool
from cugraphrt.adapter import CallPath, HandOut, OutputCheck, OverwriteOrder, order_for
from cugraphrt.errors import CaptureError, CugraphrtError, ReplayError

from .._internals import tensors as _tensors
from ..capture._output_check import FIX_COMPILE, checkable, make_check
from ..capture.capture import graph as _capture
from ..capture.framework import TORCH
from ._aot_graph_buckets import AotGraphBuckets, static_addresses

__all__ = ["AotGraph", "AotGraphReport", "AotGraphSettings", "live_aot_graphs", "shared_pool"]

_Tensor = torch.Tensor


def _same_ptrs_py(tensors: list, ptrs: list, indices: list[int]) -> bool:
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


# The check of every static input's address runs on each call: torch's CUDA builds do it in
# C++ (what its CUDA graph trees use); CPU builds lack it.
_same_ptrs = _tensors.data_ptrs_equal(_same_ptrs_py)
_foreach_copy = _tensors.foreach_copy


@dataclass(frozen=True)
class AotGraphSettings:
    """The backend options a piece needs (validated by :mod:`cugraphrt_torch.compile.dynamo`)."""

    warmup: int
    max_graphs: int
    max_rerecords: int
    copy_outputs: bool
    strict: bool
    buckets: tuple[int, ...] | None = None
    check_outputs: bool | None = None


@dataclass(frozen=True)
class AotGraphReport:
    """What the backend did with one piece.

    Attributes
    ----------
    name : str
        The region and the graph: ``"graph 0 inference"``, ``"graph 1 backward"``.
    compiler : str
        ``"inductor"`` or ``"aot_eager"``.
    graphed : bool
        Whether calls are served by CUDA graph replays (False before the first capture and
        after a fallback).
    reason : str or None
        Why the piece runs eagerly, when it does for good.
    graphs : int
        Recordings held (one per input shape).
    replays : int
        Calls served by a replay (the capturing call included).
    rerecords : int
        Recordings redone because a static input moved.
    static_inputs, copied_inputs, mutated_inputs : tuple of str
        Input names read in place, copied in, and written by the graph.
    buckets : tuple of int
        The buckets whose graph is held, for a piece served by shape buckets.
    bucket_note : str or None
        Why a dynamic piece is not served by buckets although they were asked for.
    """

    name: str
    compiler: str
    graphed: bool
    reason: str | None
    graphs: int
    replays: int
    rerecords: int
    static_inputs: tuple[str, ...]
    copied_inputs: tuple[str, ...]
    mutated_inputs: tuple[str, ...]
    buckets: tuple[int, ...] = ()
    bucket_note: str | None = None


class _Recording:
    """One capture of a piece: the graph, its call path, the static inputs' addresses."""

    __slots__ = ("graph", "path", "static_ptrs", "copy_from", "outputs")

    def __init__(self, cuda_graph: Graph, path: CallPath, static_ptrs: list,
                 copy_from: list[int], outputs: list) -> None:
        self.graph = cuda_graph
        self.path = path
        self.static_ptrs = static_ptrs
        self.copy_from = copy_from
        self.outputs = outputs  # what the graph writes


class _CopyIn:
    """A piece's load step: the copied inputs into its buffers, in one foreach copy."""

    __slots__ = ("buffers", "copy_from")

    def __init__(self, buffers: list, copy_from: list[int]) -> None:
        self.buffers = buffers
        self.copy_from = copy_from

    def __call__(self, args: list) -> list:
        if self.copy_from:
            _foreach_copy(self.buffers, [args[i] for i in self.copy_from])
        return args  # the hand-out step writes mutated inputs back


class _HandOut:
    """A piece's hand-out step: mutated copied inputs written back, then the outputs."""

    __slots__ = ("write_back", "outputs")

    def __init__(self, write_back: list, outputs: HandOut) -> None:
        self.write_back = write_back
        self.outputs = outputs

    def __call__(self, args: list) -> list:
        for index, buffer in self.write_back:
            args[index].copy_(buffer)
        return self.outputs()


class AotGraph:
    """Runs one compiled AOT graph as cugraphrt graphs (see the module docstring).

    Called by AOTAutograd with a list of inputs (``_boxed_call``); returns the list of outputs.
    """

    def __init__(self, compiled, *, name: str, compiler: str, names: Sequence[str],
                 static: Sequence[int], mutated: frozenset[int], dynamic: bool,
                 reason: str | None, settings: AotGraphSettings,
                 buckets: AotGraphBuckets | None = None, bucket_note: str | None = None) -> None:
        # An instance attribute: AOTAutograd wraps the backward in torch._dynamo.disable,
        # whose functools.wraps copies the instance's __dict__, not its class attributes.
        self._boxed_call = True
        self._compiled = compiled
        self.name = name
        self.compiler = compiler
        self._names = list(names)
        self._static = sorted(set(static))
        self._mutated = mutated
        self._dynamic = dynamic
        self._settings = settings
        self._reason = reason  # set: run eagerly for good
        self._recordings: dict[tuple, _Recording] = {}
        self._warm: dict[tuple, int] = {}
        self._over_limit: set[tuple] = set()
        self._copied: tuple[str, ...] = ()
        self._replays = 0
        self._rerecords = 0
        self._pool: MemPool | None = None
        self._order = OverwriteOrder()  # the pool's, from the first capture on
        self._check: OutputCheck | None = None
        self._buckets = buckets  # serves the sizes its buckets fit; the rest: per shape
        self._bucket_note = bucket_note
        self._released = False  # by its owner: left out of live_aot_graphs() until it records
        self._bucket_warm = 0
        _register(self)

    # -- the call path -------------------------------------------------------------------
    def __call__(self, args: list):
        if self._reason is not None:
            return self._run_eagerly(args)
        if self._buckets is not None and self._buckets.serves(args):
            return self._bucketed(args)
        key = self._key(args) if self._dynamic else ()
        rec = self._recordings.get(key)
        if rec is None:
            return self._first_calls(key, args)
        if self._static and not _same_ptrs(args, rec.static_ptrs, self._static):
            return self._moved(key, rec, args)
        self._replays += 1
        return rec.path(args)  # the core's call path: copy in, settle, replay, hand out

    def _key(self, args: list) -> tuple:
        # Dynamic graphs take their symbolic sizes as int inputs; copied tensors' shapes are
        # included for sizes that reach the graph only through a tensor.
        return tuple(a if isinstance(a, int) else tuple(a.shape) for i, a in enumerate(args)
                     if isinstance(a, int) or (isinstance(a, _Tensor) and i not in self._static))

    def _eager(self, args: list):
        return self._compiled(list(args))

    def _run_eagerly(self, args: list):
        if self._settings.strict:
            raise CaptureError(f"piece '{self.name}' cannot be captured ({self._reason}); "
                               f"run it without strict=True to fall back to eager")
        return self._eager(args)

    def _first_calls(self, key: tuple, args: list):
        warm = self._warm.get(key, 0)
        if warm < self._settings.warmup:
            self._warm[key] = warm + 1
            return self._eager(args)
        if len(self._recordings) >= self._settings.max_graphs:
            return self._too_many(key, args)
        return self._record(key, args)

    def _too_many(self, key: tuple, args: list):
        message = (f"piece '{self.name}' already holds {len(self._recordings)} graphs, one per "
                   f"input shape (got another shape: {key}); raise max_graphs, mark the "
                   f"sizes static, or pad inputs to a few shapes")
        if self._settings.strict:
            raise ReplayError(message + " (strict=True)")
        if key not in self._over_limit:
            self._over_limit.add(key)
            warnings.warn(message + "; running this shape eagerly", UserWarning, stacklevel=3)
        return self._eager(args)

    def _moved(self, key: tuple, rec: _Recording, args: list):
        if self._may_record_again(args, rec.static_ptrs):
            self._recordings.pop(key)
            rec.graph.reset()
            return self._record(key, args)
        return self._eager(args)

    def _may_record_again(self, args: list, ptrs: list) -> bool:
        """A static input moved: count a re-recording, or give up (or raise if strict)."""
        index = next(i for i in self._static if args[i].data_ptr() != ptrs[i])
        self._rerecords += 1
        if self._rerecords <= self._settings.max_rerecords:
            return True
        message = (f"static input '{self._names[index]}' of piece '{self.name}' moved to "
                   f"another address (got 0x{args[index].data_ptr():x}, captured "
                   f"0x{ptrs[index]:x}) after {self._settings.max_rerecords} "
                   f"re-recordings; keep static tensors in place (update them with copy_) or "
                   f"raise max_rerecords")
        if self._settings.strict:
            raise ReplayError(message + " (strict=True)")
        self._give_up(message)
        warnings.warn(message + "; running this piece eagerly from now on", UserWarning,
                      stacklevel=4)
        return False

    def _give_up(self, reason: str) -> None:
        self._reason = reason
        self._drop_recordings()

    def release(self) -> None:
        """Drop every recording and bucket graph, and the memory they hold; a later call
        warms up and records again. For an owner that goes while dynamo keeps its compiled
        code, and the pieces in it, for the life of the process (a PiecewiseModule)."""
        self._released = True
        self._warm.clear()
        self._drop_recordings()

    def _drop_recordings(self) -> None:
        recordings, self._recordings = self._recordings, {}
        for rec in recordings.values():
            rec.graph.reset()
        if self._buckets is not None:
            self._buckets.release()

    # -- shape buckets (see _aot_graph_buckets) ----------------------------------------------
    def _bucketed(self, args: list):
        buckets = self._buckets
        assert buckets is not None
        if self._bucket_warm < self._settings.warmup:
            self._bucket_warm += 1
            return self._eager(args)
        ptrs = buckets.static_ptrs
        if self._static and ptrs and not _same_ptrs(args, ptrs, self._static):
            if not self._may_record_again(args, ptrs):
                return self._eager(args)
            buckets.rebind(args)
        if self._pool is None:
            self._pool = shared_pool(_device_of(args))
        try:
            outputs = buckets(args, self._pool)
        except ReplayError:
            raise  # strict=True: a call the buckets could not serve
        except CugraphrtError as exc:
            # A bucket could not be captured: the piece keeps its per-shape recordings.
            buckets.release()
            self._buckets = None
            self._bucket_note = f"a bucket's capture failed: {exc}"
            if self._settings.strict:
                raise CaptureError(f"piece '{self.name}': {self._bucket_note} "
                                   f"(strict=True)") from exc
            warnings.warn(f"piece '{self.name}' leaves its shape buckets: "
                          f"{self._bucket_note}", UserWarning, stacklevel=3)
            return self(args)
        self._replays += 1
        return outputs

    # -- capture -------------------------------------------------------------------------
    def _record(self, key: tuple, args: list):
        try:
            rec = self._capture(args)
        except CugraphrtError as exc:
            self._give_up(f"the capture failed: {exc}")
            if self._settings.strict:
                raise CaptureError(f"piece '{self.name}' cannot be captured "
                                   f"({self._reason}); run it without strict=True to fall "
                                   f"back to eager") from exc
            warnings.warn(f"piece '{self.name}' runs eagerly: {self._reason}", UserWarning,
                          stacklevel=4)
            return self._eager(args)
        self._recordings[key] = rec
        self._released = False
        self._replays += 1
        return rec.path(args)  # a capture records work without running it: replay now

    def _capture(self, args: list) -> _Recording:
        static = set(self._static)
        copy_from = [i for i, a in enumerate(args) if isinstance(a, _Tensor) and i not in static]
        for i in copy_from:
            if any(s == 0 and n > 1 for s, n in zip(args[i].stride(), args[i].shape,
                                                      strict=True)):
                raise CaptureError(f"input '{self._names[i]}' is expanded (a stride of 0, "
                                   f"got strides {args[i].stride()}); pass a contiguous tensor")
        # Buffers are allocated outside the capture pool, with the caller's layout: the
        # compiled code checks strides.
        buffers = [torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype,
                                       device=args[i].device) for i in copy_from]
        inputs = list(args)
        for i, buffer in zip(copy_from, buffers, strict=True):
            buffer.copy_(args[i])
            inputs[i] = buffer
        if self._pool is None:
            self._pool = shared_pool(_device_of(inputs))
        cuda_graph = Graph()
        context = _capture(cuda_graph, pool=self._pool, capture_error_mode="thread_local")
        with context:
            outputs = self._compiled(list(inputs))
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        # An output that views an input keeps aliasing it (AOTAutograd rebuilds such views
        # from the caller's tensor); every other tensor output lives in the pool.
        input_storages = {t.untyped_storage().data_ptr() for t in inputs
                          if isinstance(t, _Tensor)}
        clone = [isinstance(o, _Tensor) and o.untyped_storage().data_ptr() not in input_storages
                 for o in outputs]
        static_ptrs = static_addresses(args, self._static)
        write_back = [(i, b) for i, b in zip(copy_from, buffers, strict=True)
                      if i in self._mutated]
        self._copied = tuple(self._names[i] for i in copy_from)
        captured = context.captured
        assert captured is not None  # set by a successful capture
        order = self._order = order_for(self._pool)
        seq = captured.seq
        if self._check is None and not self._settings.copy_outputs:
            self._check = make_check(self._settings.check_outputs,
                                     f"torch.compile piece '{self.name}'", FIX_COMPILE, order)
        copy = self._settings.copy_outputs
        if copy:  # clones of what lives in the pool; outputs viewing an input pass through
            which = [i for i, c in enumerate(clone) if c]
        else:
            which = [i for i, c in enumerate(clone) if c and checkable(outputs[i])]
        hand_out = HandOut(outputs, TORCH, copy=copy, check=self._check, seq=seq, which=which,
                           as_list=True)
        path = CallPath(_CopyIn(buffers, copy_from), order, seq, captured.on_torch_stream,
                        _HandOut(write_back, hand_out))
        return _Recording(cuda_graph, path, static_ptrs, copy_from, outputs)

    # -- report --------------------------------------------------------------------------
    def report(self) -> AotGraphReport:
        """This piece's :class:`AotGraphReport`."""
        buckets = self._buckets.captured() if self._buckets is not None else ()
        copied = self._copied or (tuple(self._names[i] for i in self._buckets.plan.copied)
                                  if self._buckets is not None else ())
        return AotGraphReport(
            name=self.name, compiler=self.compiler,
            graphed=self._reason is None and bool(self._recordings or buckets),
            reason=self._reason, graphs=len(self._recordings) + len(buckets),
            replays=self._replays, rerecords=self._rerecords,
            static_inputs=tuple(self._names[i] for i in self._static),
            copied_inputs=copied,
            mutated_inputs=tuple(self._names[i] for i in sorted(self._mutated)),
            buckets=buckets, bucket_note=self._bucket_note)


def _device_of(inputs: list) -> int:
    for value in inputs:
        if isinstance(value, _Tensor) and value.is_cuda:
            return value.device.index
    return torch.cuda.current_device()


# Pieces replay one after another on one stream and hand out copies (or keep their outputs
# allocated), so every piece of a thread can share one pool: memory one graph frees during
# its capture is scratch for the others. Per thread, because graphs of two threads may run
# at the same time (autograd runs backward graphs on its own thread).
_pools = threading.local()


def shared_pool(device: int) -> MemPool:
    """The cugraphrt pool the pieces of this thread use on ``device`` (created once)."""
    pools = getattr(_pools, "by_device", None)
    if pools is None:
        pools = _pools.by_device = {}
    pool = pools.get(device)
    if pool is None:
        pool = pools[device] = MemPool(device=device)
    return pool


_lock = threading.Lock()
_registry: list[weakref.ref] = []


def _register(piece: AotGraph) -> None:
    with _lock:
        _registry[:] = [ref for ref in _registry if ref() is not None]
        _registry.append(weakref.ref(piece))


def live_aot_graphs() -> list[AotGraph]:
    """Pieces still in use (compiled code dynamo keeps, not released by an owner that went),
    in the order they were compiled."""
    with _lock:
        pieces = [piece for piece in (ref() for ref in _registry) if piece is not None]
    return [piece for piece in pieces if not piece._released]

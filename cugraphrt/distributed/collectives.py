"""NCCL collectives on CuPy arrays, safe to capture inside ``cugraphrt.graph``.

NCCL (2.9.6 and newer) records its collectives into a CUDA graph like any other stream work:
a replay runs the collective again, on the same buffers, with the same peers. What makes that
work, and what this module checks while a capture is underway:

* **The capture stream.** A collective must be issued on the capturing stream. CuPy's
  ``NcclCommunicator`` takes a raw stream handle; passing ``Stream.null.ptr`` (a habit from
  eager code) issues it on the legacy stream, which breaks the capture. :class:`Collectives`
  always issues on CuPy's current stream.
* **The communicator's device.** A communicator belongs to one GPU: the current device and
  every buffer must be that GPU.
* **Warm-up.** NCCL sets connections and buffers up lazily, for the algorithm a message size
  selects; doing that inside a capture fails or records it. Run each collective once eagerly
  with the same dtype, size and operation first: :class:`Collectives` refuses a captured
  collective it has not seen run eagerly (``require_warmup=False`` turns that off).
* **The same capture on every rank.** Whether a collective is captured is a collective
  property: every rank must capture the same collectives in the same order, and replay the
  graphs in the same order. :class:`Collectives` records what each capture holds, and the
  graph's first replay compares it across the ranks (:mod:`cugraphrt.distributed.crossrank`):
  through ``store`` if one was given, else an eager NCCL all-gather of the records.
* **Lifetime.** NCCL does not destroy a communicator while a graph that captured its
  operations is alive: :meth:`Collectives.close` releases those graphs, then destroys it.

The core never imports torch; PyTorch's process groups are covered by
``cugraphrt_torch.distributed``.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import cupy
import numpy

from cugraphrt._capture import stream_capture as _capture
from cugraphrt._control.bodies import collective_call
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import capture_activity
from cugraphrt.distributed.crossrank import exchange_over_store
from cugraphrt.distributed.log import Collective, log_for, release_graphs
from cugraphrt.distributed.watchdog import collective_timeout, set_collective_timeout
from cugraphrt.errors import CaptureError, CugraphrtError, OptionsError

__all__ = ["Collectives", "MIN_NCCL_VERSION", "nccl_version", "check_nccl_version",
           "blocking_wait_variable", "collective_timeout", "set_collective_timeout",
           "release_graphs"]

#: The first NCCL release whose operations can be captured (NCCL's own documentation).
MIN_NCCL_VERSION = 20906
# Environment variables that make collective waits block the host (torch's names, old and
# new): a host wait inside a capture is illegal.
_BLOCKING_WAIT = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
_DTYPES = {"b": "NCCL_INT8", "B": "NCCL_UINT8", "i": "NCCL_INT32", "I": "NCCL_UINT32",
           "l": "NCCL_INT64", "L": "NCCL_UINT64", "q": "NCCL_INT64", "Q": "NCCL_UINT64",
           "e": "NCCL_FLOAT16", "f": "NCCL_FLOAT32", "d": "NCCL_FLOAT64"}
_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN",
        "avg": "NCCL_AVG"}


def _nccl():
    """CuPy's NCCL bindings; CugraphrtError when libnccl cannot be loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy warns on a missing libnccl; the error says it
        from cupy.cuda import nccl
    if not nccl.available:
        raise CugraphrtError("NCCL is not available to CuPy (got cupy.cuda.nccl.available = "
                             "False); install it: pip install nvidia-nccl-cu13 (or -cu12)")
    return nccl


def nccl_version() -> int:
    """NCCL's version as an integer (2.27.7 is 22707), as CuPy loads it."""
    return int(_nccl().get_version())


def check_nccl_version(version: int) -> None:
    """Raise CaptureError when ``version`` cannot record collectives into graphs."""
    if version < MIN_NCCL_VERSION:
        raise CaptureError(
            f"NCCL {version} cannot capture collectives into CUDA graphs (got a version below "
            f"{MIN_NCCL_VERSION}, NCCL 2.9.6); install a newer NCCL")


def blocking_wait_variable(environ: Mapping[str, str] | None = None) -> str | None:
    """The blocking-wait environment variable that is set to a true value, or None.

    ``TORCH_NCCL_BLOCKING_WAIT=1`` (or the older ``NCCL_BLOCKING_WAIT``) makes a collective's
    ``wait()`` block the host until it finishes, which capture forbids.
    """
    environ = os.environ if environ is None else environ
    for name in _BLOCKING_WAIT:
        if environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


class Collectives:
    """NCCL collectives of one communicator on CuPy arrays, issued on CuPy's current stream.

    Eager outside a capture; recorded into the graph inside ``cugraphrt.graph`` (every
    replay runs them again on the same buffers).

    Parameters
    ----------
    comm : cupy.cuda.nccl.NcclCommunicator
        One rank's communicator; its GPU must be current for every call.
    require_warmup : bool, default True
        Refuse a captured collective whose (kind, dtype, size, op) never ran eagerly here.
    store : torch.distributed.Store or similar, optional
        Where the ranks compare the collectives of a graph before its first replay
        (``set``, ``get``, ``check``, ``wait``: a rank that never arrives is named after the
        collective timeout). Without it they compare through an eager NCCL all-gather of
        this communicator, which cannot time out.
    label : str, default "cupy-nccl"
        The communicator's name in records and messages; the same on every rank.

    Examples
    --------
    >>> comm = cupy.cuda.nccl.NcclCommunicator(world, uid, rank)
    >>> coll = cugraphrt.distributed.Collectives(comm)
    >>> coll.all_reduce(x, out=y)             # warm-up, eager
    >>> with cugraphrt.graph(g):
    ...     coll.all_reduce(x * 2, out=y)      # captured
    >>> g.replay()                             # on every rank, in the same order

    .. seealso:: ``ncclAllReduce``, ``ncclAllGather``, ``ncclReduceScatter``,
       ``ncclBroadcast``
    """

    def __init__(self, comm: Any, *, require_warmup: bool = True, store: Any = None,
                 label: str = "cupy-nccl") -> None:
        if not isinstance(require_warmup, bool):
            raise OptionsError("require_warmup", require_warmup, "True or False")
        self.comm = comm
        self.device_id = int(comm.device_id())
        self.rank = int(comm.rank_id())
        self.world_size = int(comm.size())
        self.require_warmup = require_warmup
        self.label = str(label)
        self._warm: set[tuple] = set()
        self._exchanger = _NcclExchanger(self, store)
        # The exchanger and this object reference each other, so one dropped without close()
        # is freed by the garbage collector, whenever it runs: inside another capture, the
        # communicator's destruction there (ncclCommDestroy frees and synchronizes) would
        # invalidate it. The finalizer keeps the communicator until no capture is underway.
        weakref.finalize(self, _release_when_safe, comm)

    def close(self) -> None:
        """Release the graphs holding this communicator's collectives, then destroy it.

        NCCL waits for every graph that captured a communicator's operations to be destroyed
        before it destroys the communicator; released graphs raise ReplayError if replayed.
        """
        release_graphs(exchanger=self._exchanger)
        self.comm.destroy()

    def all_reduce(self, array: cupy.ndarray, out: cupy.ndarray | None = None,
                   op: str = "sum") -> cupy.ndarray:
        """``out = op(array over ranks)``, elementwise; ``out`` may be ``array`` (in place)."""
        out = cupy.empty_like(array) if out is None else out
        self._check_sizes("all_reduce", array, out, array.size)
        self._run(("all_reduce", array.dtype.char, array.size, op), (array, out),
                  lambda nccl, s: self.comm.allReduce(array.data.ptr, out.data.ptr, array.size,
                                                     self._dtype(nccl, array), self._op(nccl, op),
                                                     s))
        return out

    def all_gather(self, array: cupy.ndarray, out: cupy.ndarray | None = None) -> cupy.ndarray:
        """Every rank's ``array`` concatenated in rank order along a new first axis."""
        if out is None:
            out = cupy.empty((self.world_size, *array.shape), dtype=array.dtype)
        self._check_sizes("all_gather", array, out, array.size * self.world_size)
        self._run(("all_gather", array.dtype.char, array.size), (array, out),
                  lambda nccl, s: self.comm.allGather(array.data.ptr, out.data.ptr, array.size,
                                                     self._dtype(nccl, array), s))
        return out

    def reduce_scatter(self, array: cupy.ndarray, out: cupy.ndarray | None = None,
                       op: str = "sum") -> cupy.ndarray:
        """This rank's block of ``op(array over ranks)``: ``array`` splits along axis 0."""
        if array.shape[0] % self.world_size:
            raise OptionsError("array", f"shape {array.shape}",
                               f"a first dimension divisible by the {self.world_size} ranks")
        if out is None:
            out = cupy.empty((array.shape[0] // self.world_size, *array.shape[1:]),
                             dtype=array.dtype)
        self._check_sizes("reduce_scatter", out, array, out.size * self.world_size)
        self._run(("reduce_scatter", array.dtype.char, out.size, op), (array, out),
                  lambda nccl, s: self.comm.reduceScatter(array.data.ptr, out.data.ptr, out.size,
                                                         self._dtype(nccl, array),
                                                         self._op(nccl, op), s))
        return out

    def broadcast(self, array: cupy.ndarray, root: int = 0) -> cupy.ndarray:
        """Rank ``root``'s ``array`` copied into ``array`` on every rank (in place)."""
        if not 0 <= root < self.world_size:
            raise OptionsError("root", root, f"a rank from 0 to {self.world_size - 1}")
        self._run(("broadcast", array.dtype.char, array.size, root), (array,),
                  lambda nccl, s: self.comm.broadcast(array.data.ptr, array.data.ptr,
                                                     array.size, self._dtype(nccl, array), root,
                                                     s))
        return array

    # -- checks and the call ---------------------------------------------------------------

    def _run(self, key: tuple, arrays: tuple, call) -> None:
        nccl = _nccl()
        device = _cuda.current_device()
        if device != self.device_id:
            raise OptionsError("current device", device,
                               f"the communicator's device {self.device_id}; run the "
                               f"collective under `with cupy.cuda.Device({self.device_id}):`")
        for array in arrays:
            if not isinstance(array, cupy.ndarray) or not array.flags.c_contiguous:
                raise OptionsError("array", type(array).__name__,
                                   "C-contiguous CuPy arrays (use cupy.ascontiguousarray)")
            if array.device.id != self.device_id:
                raise OptionsError("array", f"an array on device {array.device.id}",
                                   f"arrays on the communicator's device {self.device_id}")
        stream = cupy.cuda.get_current_stream()
        capturing = _capture.is_current_stream_capturing()
        if not capturing:
            call(nccl, stream.ptr)
            self._warm.add(key)
            return
        self._check_capturable(key, nccl)
        kind, dtype, size, *rest = key
        detail = (f"root {rest[0]}" if kind == "broadcast" else str(rest[0])) if rest else ""
        record = Collective(kind, cupy.dtype(dtype).name, int(size), self.label, detail)
        # In a loop or branch body, the event nodes NCCL adds are taken out when the body
        # ends (a body cannot hold them; see cugraphrt._control.bodies).
        with collective_call(record.describe()):
            call(nccl, stream.ptr)
        capture = _capture.current_capture()
        if capture is not None:  # a cugraphrt capture: the graph is checked across ranks
            log_for(capture, self._exchanger).add(record)

    def _check_capturable(self, key: tuple, nccl) -> None:
        check_nccl_version(int(nccl.get_version()))
        if self.require_warmup and key not in self._warm:
            kind, dtype, size, *rest = key
            raise CaptureError(
                f"{kind} of {size} {cupy.dtype(dtype).name} values"
                f"{' (' + str(rest[0]) + ')' if rest else ''} was captured before it ran "
                f"eagerly on this communicator (got no warm-up); NCCL sets connections up "
                f"for a size on first use, which capture forbids: run the same collective "
                f"once before capturing, on every rank")

    @staticmethod
    def _check_sizes(kind: str, small: cupy.ndarray, large: cupy.ndarray, expected: int) -> None:
        if large.size != expected or large.dtype != small.dtype:
            raise OptionsError("out", f"{large.size} {large.dtype} values",
                               f"{expected} {small.dtype} values for this {kind}")

    @staticmethod
    def _dtype(nccl, array: cupy.ndarray) -> int:
        name = _DTYPES.get(array.dtype.char)
        if name is None and array.dtype.name == "bfloat16":
            name = "NCCL_BFLOAT16"
        if name is None or not hasattr(nccl, name):
            raise OptionsError("dtype", array.dtype.name, "an NCCL type: int8/32/64, "
                               "uint8/32/64, float16/32/64 (bfloat16 where NCCL has it)")
        return int(getattr(nccl, name))

    @staticmethod
    def _op(nccl, op: str) -> int:
        name = _OPS.get(op)
        if name is None:
            raise OptionsError("op", op, "one of " + ", ".join(_OPS))
        return int(getattr(nccl, name))


def _release_when_safe(comm: Any) -> None:
    """Let go of a dropped Collectives' communicator, at once or when the last capture
    underway ends (its destructor may destroy it)."""
    capture_activity.defer_or_run(lambda: _let_go(comm))


def _let_go(comm: Any) -> None:
    """Nothing: the reference to ``comm`` that the deferred call held goes with it."""


class _NcclExchanger:
    """How the ranks of a :class:`Collectives` communicator compare their graphs (see
    :class:`cugraphrt.distributed.log.Exchanger`)."""

    def __init__(self, coll: Collectives, store: Any) -> None:
        self.coll = coll
        self.store = store
        self.rank = coll.rank
        self.ranks = tuple(range(coll.world_size))
        self._count = 0

    def next_index(self) -> int:
        self._count += 1
        return self._count - 1

    def exchange(self, tag: str, payload: bytes, timeout_s: float) -> dict[int, bytes]:
        if len(self.ranks) == 1:
            return {self.rank: payload}
        if self.store is not None:
            return exchange_over_store(self.store, f"cugraphrt/{self.coll.label}/{tag}",
                                       self.rank, self.ranks, payload, timeout_s)
        return self._all_gather(payload)

    def _all_gather(self, payload: bytes) -> dict[int, bytes]:
        # Two eager all-gathers on a stream of our own (never a capturing one): the lengths,
        # then the records padded to the longest.
        coll = self.coll
        with cupy.cuda.Device(coll.device_id), cupy.cuda.Stream(non_blocking=True) as stream:
            sizes = coll.all_gather(cupy.asarray([len(payload)], dtype=cupy.int64))
            lengths = [int(n) for n in cupy.asnumpy(sizes).ravel()]
            buffer = cupy.zeros(max(lengths), dtype=cupy.uint8)
            buffer[: len(payload)] = cupy.asarray(numpy.frombuffer(payload, dtype=numpy.uint8))
            gathered = cupy.asnumpy(coll.all_gather(buffer))
            stream.synchronize()
        return {r: gathered[r, : lengths[r]].tobytes() for r in self.ranks}

    def default_timeout_s(self) -> float:
        return 600.0

    def abort(self) -> None:
        self.coll.comm.abort()

    def describe(self) -> str:
        return (f"rank {self.rank} of {len(self.ranks)} (NCCL communicator "
                f"{self.coll.label!r} on device {self.coll.device_id})")

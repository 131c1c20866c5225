"""The interface between cugraphrt and a framework adapter: all an adapter may use.

A framework adapter (``cugraphrt_torch``; the DLPack example of ``examples/``) builds on this
module and on the package's public names, never on the core's private modules
(``tests/unit/test_layers.py`` fails otherwise). Like CuPy's ``cupy/cuda/graph.pxd``, it
declares what other code may rely on; everything it names is kept stable for adapters.

What an adapter **implements**: :class:`Framework`, once, in one module (arrays, outputs,
streams, capture). What the core **offers** it, in four groups:

* **Callables**: :class:`CallPath` (the one call path: copy in, settle, replay, hand out),
  its usual steps :class:`CopyIn` and :class:`HandOut`, the :class:`Mismatch` a step raises,
  :func:`load_step` (the ``load`` step for ``inputs="copy"`` or ``"rebind"``, with
  :func:`plan_for`, :func:`rebind_step`, :func:`with_write_back` (the replay that copies
  written inputs back), :func:`byte_extent`, :func:`check_inputs_mode`);
  shape buckets (:class:`Bucketed`, :class:`CapturedBucket`, :func:`resolve_buckets`, and the
  one rule for lists of sizes: :func:`checked_sizes`, :func:`doubling`, :func:`stepping`); the
  overwritten-output check (:class:`OutputCheck`, :class:`OutputOps`,
  :class:`OverwriteOrder`, :func:`order_for`, :func:`resolve_check_outputs`).
* **Capture hooks**, for a framework that must own the CUDA-level capture (torch does: its
  RNG and allocator must know of it): :func:`begin_capture`, :func:`end_capture`,
  :func:`abort_capture`, :func:`adopt`, :func:`capture_of`, :func:`graph_handles`,
  :func:`ready_exec`, :func:`resolve_pool`; host constants a capture copies to the device,
  staged in pinned memory its graph keeps (:func:`pinned_constant`); the allocation hooks
  that serve the framework's
  allocator from a pool (:func:`allocate`, :func:`capture_activity`); the replay-order
  checks of a routed replay (:func:`check_replay`, :func:`note_replay`) and the switches
  every replay reads (:data:`FLAGS`).
* **Namespaces** of lower-level services: :data:`cuda` (stream captures and statuses),
  :data:`blas` (cuBLAS calls on a framework's handle), :data:`diagnose` (why a capture
  failed), :data:`control` (building loops and branches), :data:`collectives` (recording
  and checking collectives), :data:`tree` (nested arguments).
* **Streams and devices**: :func:`check_capture_stream`, :func:`check_replay_stream`,
  :func:`stream_ptr`.
* **Backing allocators**, where a pool's segments come from (``MemPool(backing=...)``):
  :class:`BackingAllocator` (version :data:`BACKING_INTERFACE_VERSION`),
  :class:`CudaBackingAllocator`, :class:`BackingOutOfMemoryError`.

The lifetime rule every adapter follows is stated once, in ``docs/concepts.md``
("Lifetimes"): a Graph lives as long as anything that can replay it, so what an adapter
installs on a Graph (a route, an owner) reaches the Graph weakly at most.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from cugraphrt import _tree
from cugraphrt._callables.bucket_plan import checked_sizes, doubling, resolve_buckets, stepping
from cugraphrt._callables.bucket_table import CapturedBucket, instantiate_measured
from cugraphrt._callables.buckets import Bucketed
from cugraphrt._callables.call_path import CallPath, CopyIn, HandOut, Mismatch
from cugraphrt._callables.cupy_framework import CUPY, CupyFramework
from cugraphrt._callables.framework import Framework
from cugraphrt._callables.rebind import (
    INPUT_MODES,
    check_inputs_mode,
    load_step,
    plan_for,
    rebind_step,
    with_write_back,
)
from cugraphrt._callables.rebind_plan import byte_extent
from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture.graphs import Graph
from cugraphrt._capture.graphs import _resolve_pool as resolve_pool
from cugraphrt._capture.host_constants import pinned_constant
from cugraphrt._capture.stream_capture import Capture
from cugraphrt._control import bodies as _bodies
from cugraphrt._control import loops as _loops
from cugraphrt._control.loops import Frontend as ControlFrontend
from cugraphrt._cuda import cublas as _cublas
from cugraphrt._cuda import runtime as _runtime
from cugraphrt._cuda.devices import check_capture_stream, check_replay_stream, stream_ptr
from cugraphrt._flags import FLAGS, ReplayFlags
from cugraphrt._memory.backing import (
    BACKING_INTERFACE_VERSION,
    BackingAllocator,
    BackingOutOfMemoryError,
    CudaBackingAllocator,
    capture_activity,
)
from cugraphrt._memory.overwrites import ENV as CHECK_OUTPUTS_ENV
from cugraphrt._memory.overwrites import (
    OutputCheck,
    OutputOps,
    OverwriteOrder,
    order_for,
    resolve_check_outputs,
)
from cugraphrt._memory.pool import MemPool
from cugraphrt.distributed import log as _log
from cugraphrt.distributed import replay as _replay
from cugraphrt.distributed import watchdog as _watchdog
from cugraphrt.distributed.crossrank import exchange_over_store
from cugraphrt.options import Frozen

__all__ = [
    # what an adapter implements
    "Framework", "CUPY", "CupyFramework",
    # callables
    "CallPath", "CopyIn", "HandOut", "Mismatch", "Bucketed", "CapturedBucket",
    "instantiate_measured",
    "resolve_buckets", "checked_sizes", "doubling", "stepping",
    "load_step", "plan_for", "rebind_step", "with_write_back", "byte_extent",
    "INPUT_MODES",
    "check_inputs_mode", "OutputCheck", "OutputOps", "OverwriteOrder", "order_for",
    "resolve_check_outputs", "CHECK_OUTPUTS_ENV",
    # capture hooks
    "Capture", "begin_capture", "end_capture", "abort_capture", "adopt", "capture_of",
    "pinned_constant",
    "graph_handles", "route_of", "ready_exec", "resolve_pool", "allocate", "capture_activity",
    "check_replay", "note_replay", "FLAGS", "ReplayFlags",
    # backing allocators (where a pool's segments come from)
    "BACKING_INTERFACE_VERSION", "BackingAllocator", "BackingOutOfMemoryError",
    "CudaBackingAllocator",
    # streams, devices, options
    "check_capture_stream", "check_replay_stream", "stream_ptr", "Frozen", "ControlFrontend",
    # namespaces
    "cuda", "blas", "diagnose", "control", "collectives", "tree",
]


# -- capture hooks -----------------------------------------------------------------------------

def begin_capture(cuda_graph: Graph, pool: MemPool | None, mode: str, *,
                  start: Callable[[Any, str, object], None] | None) -> Capture:
    """Begin a capture into ``cuda_graph``; ``start(stream, mode, token)`` performs the
    CUDA-level begin (the framework's own, such as ``torch.cuda.CUDAGraph.capture_begin``).
    ``token`` is the capture's: whatever ``start`` runs first (warm-ups whose memory the
    capture will reuse) may :func:`allocate` from the pool with it.

    Returns the :class:`Capture` underway: its ``finish_hooks`` and ``abort_hooks`` run when
    it ends, and its ``token`` identifies it to :func:`allocate`.
    """
    return cuda_graph._begin(pool, mode, start=start)


def end_capture(cuda_graph: Graph, *, finish: Callable[[Capture], int] | None,
                instantiate: bool) -> int:
    """End the capture; ``finish(capture)`` performs the CUDA-level end and returns the raw
    ``cudaGraph_t``. Returns that handle (0 once destroyed, when the definition is not kept).
    """
    return cuda_graph._end(finish=finish, instantiate=instantiate)


def abort_capture(cuda_graph: Graph, error: BaseException | None = None) -> None:
    """Roll the capture underway back (its abort hooks first); nothing if none is."""
    cuda_graph._abort_capture(error)


def adopt(cuda_graph: Graph, owner: object, raw_graph: int, exec_handle: int, *,
          route: Callable[..., None] | None = None,
          instantiate: Callable[[], int] | None = None) -> None:
    """Hand ``cuda_graph`` a graph and executable that ``owner`` frees (the Graph keeps
    ``owner`` alive until reset). ``route(stream=None)``, if given, replays instead of the
    core's launch, and must reach the Graph weakly at most; ``instantiate()`` (re-)creates
    the executable through the owner and returns it."""
    cuda_graph._adopt(owner, raw_graph, exec_handle, replay=route, instantiate=instantiate)


def capture_of(cuda_graph: Graph) -> Capture | None:
    """The capture underway into ``cuda_graph``, or None."""
    return cuda_graph._capture


def route_of(cuda_graph: Graph) -> Callable[..., None] | None:
    """The route ``cuda_graph`` replays through (see :func:`adopt`), or None."""
    return cuda_graph._route


def graph_handles(cuda_graph: Graph) -> Any:
    """What ``cuda_graph`` owns: ``graph`` and ``exec`` (raw handles, 0 when none), ``pool``
    and ``seq`` (its capture order in the pool), ``keepalive``."""
    return cuda_graph._handles


def ready_exec(cuda_graph: Graph, what: str) -> int:
    """The executable, instantiated now if needed; ReplayError before a capture (``what``
    names the call, for the message)."""
    return cuda_graph._ready_exec(what)


def allocate(pool: MemPool, nbytes: int, stream: int, token: object) -> Any:
    """A segment of ``pool`` for the capture ``token`` (a CuPy ``MemoryPointer``): what a
    framework's allocator hook calls during a capture."""
    return pool._allocate(nbytes, stream, token)


def check_replay(pool: MemPool, seq: int, stream: int) -> None:
    """Before a routed replay, with :data:`FLAGS` ``.pool_checks`` on: the replay-order check."""
    pool._check_replay(seq, stream)


def note_replay(pool: MemPool, seq: int, stream: int) -> None:
    """After a routed replay, with the checks on: note it for the next check."""
    pool._note_replay(seq, stream)


# -- namespaces ----------------------------------------------------------------------------------

#: CUDA, for adapters (every CUDA call of cugraphrt goes through its ``_cuda`` package):
#: ``get_device``, ``event_record``, ``stream_wait_event``, stream captures
#: (``capture_info``, ``begin_capture``, ``abandon_capture``), ``debug_dot_print``,
#: ``error_from_status`` and the status numbers.
cuda = SimpleNamespace(
    get_device=_runtime.get_device, event_record=_runtime.event_record,
    stream_wait_event=_runtime.stream_wait_event, capture_info=_runtime.capture_info,
    begin_capture=_runtime.begin_capture,
    abandon_capture=_runtime.abandon_capture, debug_dot_print=_runtime.debug_dot_print,
    error_from_status=_runtime.error_from_status, STATUS_NONE=_runtime.STATUS_NONE,
    STATUS_ACTIVE=_runtime.STATUS_ACTIVE, CAPTURE_UNSUPPORTED=_runtime.CAPTURE_UNSUPPORTED,
    CAPTURE_INVALIDATED=_runtime.CAPTURE_INVALIDATED, CAPTURE_MERGE=_runtime.CAPTURE_MERGE,
    CAPTURE_UNMATCHED=_runtime.CAPTURE_UNMATCHED, CAPTURE_UNJOINED=_runtime.CAPTURE_UNJOINED,
    CAPTURE_ISOLATION=_runtime.CAPTURE_ISOLATION, CAPTURE_IMPLICIT=_runtime.CAPTURE_IMPLICIT,
    CAPTURED_EVENT=_runtime.CAPTURED_EVENT,
    CAPTURE_WRONG_THREAD=_runtime.CAPTURE_WRONG_THREAD,
)

#: cuBLAS calls a framework makes on its own handle: ``gemm_batched_ex`` (pointer arrays), and
#: ``mapped_libraries`` (the cuBLAS files in the process: the call is bound to the first one,
#: so a framework's handle may be passed only where there is one).
blas = SimpleNamespace(gemm_batched_ex=_cublas.gemm_batched_ex,
                       mapped_libraries=_cublas.mapped_libraries)

#: Why a capture failed: ``capture_error_from``, ``invalidated_error``,
#: ``where_in_user_code``.
diagnose = SimpleNamespace(
    capture_error_from=_diagnose.capture_error_from,
    invalidated_error=_diagnose.invalidated_error,
    where_in_user_code=_diagnose.where_in_user_code,
)

#: Building device-side loops and branches for a framework (with :class:`ControlFrontend`):
#: ``check_loop_args``, ``check_branch_args``, ``active_capture``,
#: ``run_eagerly``, ``capture_while``, ``capture_cond``; and for a framework's collectives,
#: ``collective_call`` (wrap the issue of each one: inside a body, what NCCL adds that a
#: body cannot hold is taken out) and ``scope`` (the bodies work lands in now).
control = SimpleNamespace(
    check_loop_args=_loops.check_loop_args,
    check_branch_args=_loops.check_branch_args, active_capture=_loops.active_capture,
    run_eagerly=_loops.run_eagerly, capture_while=_loops.capture_while,
    capture_cond=_loops.capture_cond, collective_call=_bodies.collective_call,
    scope=_bodies.scope,
)

#: Collectives recorded into captures: ``Collective``, ``log_for``, ``track``,
#: ``release_graphs``, ``first_replay``, ``collective_timeout``, ``set_collective_timeout``,
#: ``guard_capture``, ``exchange_over_store``.
collectives = SimpleNamespace(
    Collective=_log.Collective, log_for=_log.log_for, track=_log.track,
    release_graphs=_log.release_graphs, first_replay=_replay.first_replay,
    collective_timeout=_watchdog.collective_timeout,
    set_collective_timeout=_watchdog.set_collective_timeout,
    guard_capture=_watchdog.guard_capture, exchange_over_store=exchange_over_store,
)

#: Nested arguments (tuples, lists, dicts): ``flatten``, ``unflatten``, ``leaves_of``.
tree = SimpleNamespace(flatten=_tree.flatten, unflatten=_tree.unflatten,
                       leaves_of=_tree.leaves_of)

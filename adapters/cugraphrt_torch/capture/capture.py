"""cugraphrt_torch.graph: capture torch work (and CuPy work on the same stream) into a Graph.

Design. The CUDA-level capture is torch's own ``torch.cuda.CUDAGraph(keep_graph=True)``,
begun and ended through the core's capture hooks (:mod:`cugraphrt.adapter`: ``begin_capture``,
``end_capture``, ``adopt``), on one stream that is current for both CuPy
and torch. Torch must own the capture: only its ``capture_begin``/``replay`` make the CUDA
RNG graph-safe (a fresh philox offset on every replay), and only its ``capture_begin`` tells
its caching allocator which pool to allocate from. That pool is a ``torch.cuda.MemPool``
whose segments come from the cugraphrt pool (see :mod:`cugraphrt_torch.capture._alloc`), and CuPy's
allocations go to the same cugraphrt pool through the core's router.

Failures. Torch skips its allocator bookkeeping when ``capture_end`` fails (the pool stays
"being recorded to", and the next capture into it fails). To end torch's capture cleanly
after any failure, we end the broken CUDA capture ourselves, begin an empty one on the same
stream and let torch end *that*, then reset its graph (see :meth:`_TorchCapture.unwind`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from cugraphrt import Graph, MemPool
from cugraphrt import adapter as core
from cugraphrt.adapter import check_capture_stream
from cugraphrt.adapter import cuda as _cuda
from cugraphrt.adapter import resolve_pool as _resolve_pool
from cugraphrt.errors import CaptureError, CugraphrtError, OptionsError
from cugraphrt.options import CaptureOptions, validate_options

from .._internals import cuda as _cuda_internals
from . import _alloc, _collective_mode, _errors, _torch
from ._adopted import CapturedGraph, Instantiate, Owner, Replay
from ._fence import fenced
from ._host_constants import HostConstants

if TYPE_CHECKING:
    from cugraphrt.adapter import Capture

__all__ = ["graph", "warmed_graph"]

# Torch graphs whose capture could not be ended cleanly: torch's allocator may still hold a
# filter that points into them, so they must never be destroyed.
_stranded: list = []


class graph:
    """Context manager that captures torch (and CuPy) work of its block into a Graph.

    On entry it makes one side stream current for both CuPy and torch (without synchronizing
    the device, so other threads' captures are unaffected) and begins a capture owned by a
    ``torch.cuda.CUDAGraph``. Inside the block every allocation torch or CuPy makes comes
    from the cugraphrt pool, and torch's CUDA RNG is graph-safe: each replay draws fresh
    numbers, exactly those an eager run would draw from the same generator state. On a
    normal exit the capture ends and ``cuda_graph`` holds the graph; if the block raises,
    the capture is rolled back, the streams are restored, and an error caused by an
    operation capture forbids comes out as :class:`cugraphrt.CaptureError` naming it,
    chained from the original.

    Parameters
    ----------
    cuda_graph : cugraphrt.Graph
        The graph to capture into. Its :meth:`~cugraphrt.Graph.replay` replays through
        torch, on CuPy's current stream by default (or the ``stream`` given); a
        :class:`cugraphrt_torch.CUDAGraph` replays on torch's current stream, as
        ``torch.cuda.graph``'s graphs do.
    pool : cugraphrt.MemPool, optional
        Pool for the capture; a private one if omitted. One pool may serve CuPy-only and
        torch graphs alike.
    stream : cupy.cuda.Stream or torch.cuda.Stream, optional
        Capture stream (non-default). cugraphrt's per-thread capture stream by default.
    capture_error_mode : {"global", "thread_local", "relaxed"}
        See :class:`cugraphrt.options.CaptureOptions`.
    stage_host_constants : bool, default False
        Let the block copy constants it makes on the host to the device (``torch.tensor(v,
        device="cuda")``, index lists, host tensors it builds and moves): each is copied at
        capture into pinned memory the graph keeps, and every replay copies it from there.
        A pageable CPU tensor made before the capture is refused instead (docs/torch.md,
        "Host constants"). Off by default: it adds a little host time to every torch call
        of the block.

    Attributes
    ----------
    captured : CapturedGraph or None
        After a successful exit, what the capture hands its caller: the graph, its replays
        (``launch`` past the pool-order checks, for code that keeps the order itself), the
        memory and the capture's number in its pool's order. None before.
    torch_graph : torch.cuda.CUDAGraph or None
        The torch graph that owns the capture, after a successful exit; None before, and
        once ``cuda_graph`` let it go (reset, or garbage collected). A weak reference: the
        Graph owns it, and destroys it as soon as it lets go.
    memory : object or None
        After a successful exit, what keeps the torch MemPool the capture allocated from:
        while it lives, torch never returns that pool's segments (to the cugraphrt pool), so
        memory the capture's tensors let go of stays mapped (shape buckets share outputs
        that way); when it dies, the pool goes at the next safe point.

    Examples
    --------
    >>> g = cugraphrt.Graph()
    >>> with cugraphrt_torch.graph(g):
    ...     y = torch.nn.functional.dropout(model(x), 0.1)
    >>> x.copy_(new_input); g.replay()      # y holds the new result

    .. seealso:: ``torch.cuda.graph``, ``cudaStreamBeginCapture``
    """

    def __init__(self, cuda_graph: Graph, pool: MemPool | None = None, stream=None,
                 capture_error_mode: str = "global", stage_host_constants: bool = False) -> None:
        if not isinstance(cuda_graph, Graph):
            raise OptionsError("cuda_graph", cuda_graph, "a cugraphrt.Graph")
        validate_options(CaptureOptions, capture_error_mode=capture_error_mode)
        if pool is not None and not isinstance(pool, MemPool):
            raise OptionsError("pool", pool, "a cugraphrt.MemPool or None")
        if stream is not None and not (hasattr(stream, "ptr") or hasattr(stream, "cuda_stream")):
            raise OptionsError("stream", stream, "a cupy.cuda.Stream, a torch.cuda.Stream or None")
        if not isinstance(stage_host_constants, bool):
            raise OptionsError("stage_host_constants", stage_host_constants, "True or False")
        self.stage_host_constants = stage_host_constants
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self.stream = stream
        self.captured: CapturedGraph | None = None
        self._session: _TorchCapture | None = None
        self._contexts: _torch.Switched | None = None
        #: Warm-ups run on the capture stream right before the capture begins, their memory
        #: from its pool (see :func:`warmed_graph`); None: none.
        self._warm_up: Callable[[], None] | None = None
        #: An object whose captures share torch's cuBLAS workspaces (see warmed_graph).
        self._workspace_owner: object | None = None

    @property
    def torch_graph(self):
        return None if self.captured is None else self.captured.torch_graph

    @property
    def memory(self) -> Any:
        return None if self.captured is None else self.captured.memory

    def __enter__(self) -> graph:
        _torch.require_cuda("cugraphrt_torch.graph()")
        import torch

        device = _cuda.get_device()
        self.captured = None
        if self.stream is not None:
            check_capture_stream(self.stream, device)
        cupy_stream, torch_stream = _torch.stream_pair(self.stream, device)
        # Warm-ups are fenced against the stream current at entry: the caller's.
        warm_up = None if self._warm_up is None else _Fenced(
            self._warm_up, _torch.current_torch_stream(device), torch_stream)
        # No device synchronization: it would invalidate other threads' captures (see
        # cugraphrt.graph.__enter__), and nothing runs during a capture anyway.
        # torch's device is the runtime's current one, read above: no switch to make there.
        contexts = _torch.Switched(cupy_stream, torch.cuda.stream(torch_stream))
        try:
            self._session = _TorchCapture.begin(self.cuda_graph, self.pool, self.capture_error_mode,
                                                torch_stream, device, warm_up,
                                                self.stage_host_constants, self._workspace_owner)
        except BaseException:
            contexts.close()
            raise
        self._contexts = contexts
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        # Both are set by a successful __enter__.
        session, self._session = cast("_TorchCapture", self._session), None
        contexts, self._contexts = cast("_torch.Switched", self._contexts), None
        try:
            if exc is None:
                torch_graph = session.end()
                # Numbered before any other capture into the pool can begin (this thread's
                # stream is still the capture stream; the pool's order is per pool).
                seq = core.order_for(session.pool).next_seq()
                self.captured = CapturedGraph(self.cuda_graph, session.replay,
                                              _alloc.MemoryKeep(session.mempool), seq,
                                              torch_graph)
                return False
            session.abort(exc)
        finally:
            contexts.close()
        translated = session.error_for(exc)
        if translated is not None and translated is not exc:
            raise translated from exc
        return False


def warmed_graph(cuda_graph: Graph, pool: MemPool | None, warm_up: Callable[[], None],
                 stage_host_constants: bool = False,
                 workspace_owner: object | None = None) -> graph:
    """A :class:`graph` whose capture first runs ``warm_up()`` on the capture stream, every
    allocation from the capture's pool: the one warm-up of the adapter's captures.

    The warm-ups' activations are then freed into the pool the capture allocates from, so
    the capture reuses them rather than leaving them cached in torch's general pool, and the
    cuBLAS workspace they create, which the capture bakes in, is the graph's own: one
    workspace per graph instead of one for the warm-ups and another for the capture (see
    :func:`_torch.drop_blas_workspaces`). ``warm_up`` runs with the capture stream current
    for torch and CuPy, right before the CUDA-level begin, fenced on both sides: the capture
    stream waits for the stream current at entry (the caller's work the warm-ups read), and
    that stream waits for the warm-ups (the capture reuses their memory, which the caller's
    later replays write).

    ``workspace_owner``: an object all of whose graphs live and die together and never run
    at once (a Generator): its captures share one cuBLAS workspace per stream instead of
    each making its own (:func:`_torch.blas_workspaces_for`).
    """
    capture = graph(cuda_graph, pool=pool, stage_host_constants=stage_host_constants)
    capture._warm_up = warm_up
    capture._workspace_owner = workspace_owner
    return capture


class _Fenced:
    """``warm_up()`` on the capture stream, fenced against the caller's stream on both sides
    (see :func:`warmed_graph`)."""

    __slots__ = ("_warm_up", "_caller", "_stream")

    def __init__(self, warm_up: Callable[[], None], caller, stream) -> None:
        self._warm_up = warm_up
        self._caller = caller
        self._stream = stream

    def __call__(self) -> None:
        with fenced(self._caller, self._stream):
            self._warm_up()


class _TorchCapture:
    """One torch capture into a cugraphrt Graph, from begin to adopt or roll-back."""

    def __init__(self, cuda_graph: Graph, pool: MemPool, torch_stream, device: int,
                 warm_up: Callable[[], None] | None = None) -> None:
        import torch

        self.cuda_graph = cuda_graph
        self.warm_up = warm_up
        self.pool = pool
        self.torch_stream = torch_stream
        self.stream_ptr = int(torch_stream.cuda_stream)
        self.device = device
        self.mempool = _alloc.torch_mempool(pool)
        # Generator states registered on a cugraphrt_torch.CUDAGraph (register_generator_state)
        # go to each torch graph that owns one of its captures.
        self.generator_states = tuple(getattr(cuda_graph, "_generator_states", ()))
        try:
            self.torch_graph = self._new_torch_graph()
        except TypeError as exc:
            raise CugraphrtError(
                f"cugraphrt_torch needs torch.cuda.CUDAGraph(keep_graph=True) (got torch "
                f"{torch.__version__}); upgrade to torch >= 2.11"
            ) from exc
        self.capture: Capture | None = None
        self.failed: Capture | None = None  # the capture, once aborted
        self.pool_error: BaseException | None = None
        self.recorder: contextlib.AbstractContextManager[None] | None = None
        #: Host constants staged while the block runs (stage_host_constants), or None.
        self.constants: HostConstants | None = None
        #: Whose captures share torch's cuBLAS workspaces with this one (see warmed_graph).
        self.workspace_owner: object | None = None

    def _new_torch_graph(self):
        import torch

        torch_graph = _alloc.hold(torch.cuda.CUDAGraph(keep_graph=True))
        for state in self.generator_states:
            torch_graph.register_generator_state(state)
        return torch_graph

    @classmethod
    def begin(cls, cuda_graph: Graph, pool, mode: str, torch_stream, device: int,
              warm_up: Callable[[], None] | None = None, stage_host_constants: bool = False,
              workspace_owner: object | None = None) -> _TorchCapture:
        _collective_mode.prepare()  # outside the capture: what the recorder's first use loads
        session = cls(cuda_graph, _resolve_pool(pool), torch_stream, device, warm_up)
        session.workspace_owner = workspace_owner
        try:
            capture = core.begin_capture(cuda_graph, session.pool, mode, start=session._start)
        except BaseException:
            # Refused before torch began (the default stream, a pool of another device): the
            # torch pool taken for this capture has one user fewer.
            _alloc.release(session.pool, session.mempool)
            raise
        session.capture = capture
        _alloc.sweep_when_safe()  # at this capture's end: torch objects freed meanwhile
        _alloc.register(capture)
        capture.finish_hooks.append(_alloc.unregister)
        capture.abort_hooks.append(session._on_abort)
        # Collectives issued during the capture are recorded (a dispatch mode, only with
        # torch.distributed initialized), by every entry point: graph(), CUDAGraph,
        # make_graphed_callables. See _collective_mode.
        recorder = _collective_mode.recording(capture)
        try:
            recorder.__enter__()
        except BaseException as exc:
            session.abort(exc)
            raise
        session.recorder = recorder
        if stage_host_constants:  # entered last, left first (see _stop_recording)
            session.constants = HostConstants(capture, device)
            session.constants.__enter__()
        return session

    def _stop_recording(self) -> None:
        constants, self.constants = self.constants, None
        if constants is not None:
            constants.__exit__(None, None, None)
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            recorder.__exit__(None, None, None)

    def _start(self, stream, mode: str, token: object) -> None:
        """The CUDA-level begin, by torch, so its RNG and allocator know of the capture."""
        # The capture's matmuls get a workspace from its pool, not torch's shared cache,
        # which torch.compile's graph trees clear and free (see drop_blas_workspaces): the
        # warm-ups create it there, or else the capture does; or it is the one the captures
        # of its workspace owner share.
        _torch.blas_workspaces_for(self.workspace_owner)
        if self.warm_up is not None:
            with _alloc.warming(self.pool, token, self.mempool, self.device):
                self.warm_up()
        try:
            self.torch_graph.capture_begin(pool=self.mempool.id, capture_error_mode=mode)
            return
        except RuntimeError as exc:
            if "already recording" not in str(exc):
                self._strand()
                raise CaptureError(
                    f"torch could not begin the capture (got: {str(exc).strip()}); make sure "
                    f"no other capture runs on stream 0x{self.stream_ptr:x}"
                ) from exc
        # An earlier capture into this pool failed in a way torch could not clean up: its
        # pool id is still marked as recording. Start over with a fresh torch pool.
        self._strand()
        self.mempool = _alloc.torch_mempool(self.pool)
        self.torch_graph = self._new_torch_graph()
        self.torch_graph.capture_begin(pool=self.mempool.id, capture_error_mode=mode)

    def _finish(self, capture) -> int:
        """The CUDA-level end, by torch; returns the raw cudaGraph_t."""
        try:
            with warnings.catch_warnings():
                # The core warns about an empty graph itself.
                warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
                self.torch_graph.capture_end()
        except Exception as exc:
            self.unwind()
            translated = _errors.capture_error(exc, "torch.cuda.CUDAGraph.capture_end()",
                                               capture=capture)
            if translated is None:
                translated = CaptureError(f"torch could not end the capture (got: {exc}); "
                                          f"see the chained exception")
            raise translated from exc
        if self.workspace_owner is None:  # nothing after the capture shares its workspace
            _torch.drop_blas_workspaces()
        return int(self.torch_graph.raw_cuda_graph())

    def end(self):
        """End the capture, instantiate through torch and hand the graph to the Graph.

        With ``keep_graph=True`` the instantiation waits, as in the core and in torch, for
        :meth:`Graph.instantiate` or the first use of the executable.
        """
        self._stop_recording()
        cuda_graph = self.cuda_graph
        try:
            raw_graph = core.end_capture(cuda_graph, finish=self._finish, instantiate=False)
        except CugraphrtError as exc:
            if core.capture_of(cuda_graph) is not None:  # still underway: a stream switched
                core.abort_capture(cuda_graph, exc)
            raise
        replay = Replay(self.torch_graph.replay, core.graph_handles(cuda_graph), self.device)
        owner = Owner(self.torch_graph, self.pool, self.mempool, replay)
        instantiate = Instantiate(owner)
        try:
            exec_handle = 0 if cuda_graph.keep_graph else instantiate()
        except Exception as exc:
            core.adopt(cuda_graph, owner, raw_graph, 0)  # torch owns the handles: it frees them
            cuda_graph.reset()
            raise CaptureError(f"torch could not instantiate the captured graph (got: {exc}); "
                               f"see the chained exception") from exc
        # A cugraphrt_torch.CUDAGraph replays through torch itself (its own replay method):
        # it takes the replay object, where a plain Graph takes it as its route.
        adopted = getattr(cuda_graph, "_adopted", None)
        core.adopt(cuda_graph, owner, raw_graph, exec_handle,
                   route=replay if adopted is None else None, instantiate=instantiate)
        if adopted is not None:
            adopted(replay, exec_handle)
        log = self.capture.collectives if self.capture is not None else None
        if log is not None:  # checked across ranks before its first replay, and so on
            _collective_mode.arm(cuda_graph, log, replay, self.torch_graph, self.device)
        self.replay = replay
        self.capture = None  # the Capture's hooks point back here: let both go now
        return self.torch_graph

    def abort(self, exc: BaseException) -> None:
        self._stop_recording()
        self.failed = self.capture  # its mode and stream explain the error (error_for)
        core.abort_capture(self.cuda_graph, exc)  # runs _on_abort first, then rolls back
        self.capture = None

    def _on_abort(self, capture) -> None:
        # Read before the finish hooks unregister the capture from the allocator.
        self.pool_error = _alloc.pool_error(capture)
        self.unwind(destroy=not capture.keep_graph_on_abort)

    def error_for(self, exc: BaseException) -> BaseException | None:
        """What the caller sees for ``exc``: a pool error behind a torch OOM (also a
        ``torch.OutOfMemoryError``), or a CaptureError."""
        if self.pool_error is not None:
            return _errors.torch_out_of_memory(self.pool_error)
        return _errors.capture_error(exc, capture=self.failed)

    def unwind(self, destroy: bool = True) -> None:
        """Leave torch as if the capture had never begun; never raises.

        Ends whatever capture is active on the stream, begins an empty one and lets torch's
        ``capture_end`` end it: that runs torch's own bookkeeping (allocator pools, RNG
        capture state) that a failed end skips. Then torch's graph is reset.
        """
        import torch

        ptr = self.stream_ptr
        done = False
        try:
            _cuda.abandon_capture(ptr, destroy=destroy)  # False: see keep_graph_on_abort
            _cuda.begin_capture(ptr, "relaxed")
            try:
                with torch.cuda.stream(self.torch_stream), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.torch_graph.capture_end()
            finally:
                _cuda.abandon_capture(ptr)
            self.torch_graph.reset()
            _alloc.release(self.pool, self.mempool)
            done = True
        except Exception:  # noqa: BLE001 - fall back to a fresh torch pool next time
            pass
        with contextlib.suppress(Exception):  # the failed capture's workspace is not shared
            _torch.drop_blas_workspaces()
        if not done:
            self._strand()

    def _strand(self) -> None:
        """Give up on this torch graph and its torch pool; never raises."""
        _stranded.append(self.torch_graph)
        _alloc.retire(self.pool)
        try:  # torch's allocator may still route allocations to the old pool: stop that
            _cuda_internals.end_allocate_to_pool(self.device, self.mempool.id)
        except Exception:  # noqa: BLE001 - it was not recording: nothing to stop
            pass

"""What a framework provides to the core: the :class:`Framework` interface.

cugraphrt captures and replays CUDA graphs; a *framework* (CuPy, PyTorch, a framework of
your own over DLPack) owns the arrays, streams and allocator the captured work runs with.
An adapter implements this interface once, in one module (CuPy's is
:mod:`cugraphrt._callables.cupy_framework`, torch's ``cugraphrt_torch.capture.framework``), and
every graphed callable (the call path, shape buckets, the overwritten-output check) runs on
it. ``docs/adapters.md`` walks through an implementation.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["Framework"]


class Framework(Protocol):
    """One framework's arrays, outputs, streams and capture, as the core uses them.

    Arrays (the call path's copy-in, shape buckets)
        ``array_type``, ``signature``, ``address``, ``same_layout``, ``copy``, ``fill``,
        ``empty``, ``clone``, ``is_contiguous``, ``describe``.
    Outputs (the overwritten-output check)
        ``hand_out``, ``expire``, ``message``
        (:class:`cugraphrt.adapter.OutputOps`).
    Streams
        ``current_stream``, ``use_stream``.
    Capture and allocation
        ``capture``: the block that captures the framework's work into a
        :class:`cugraphrt.Graph`, with its allocations served by a cugraphrt pool (for
        torch, through its allocator hooks; see :func:`cugraphrt.adapter.begin_capture`).
    """

    name: str

    # -- arrays ------------------------------------------------------------------------------

    @property
    def array_type(self) -> type[Any]:
        """The framework's array class."""

    def signature(self, array: Any) -> Any:
        """What must equal the capture's for an argument to be copied in: shape, dtype and
        device (anything comparable). Raises AttributeError or TypeError for a value that is
        no array. On the call path: best a C-level callable (``operator.attrgetter``)."""

    def address(self, array: Any) -> int:
        """The device address of the array's first element. On the call path: best a
        C-level callable (a method descriptor, ``operator.attrgetter``)."""

    # Optional, for ``inputs="rebind"`` (docs/rebinding.md): ``strides(array)`` (anything
    # comparable; on the call path, best C-level) and ``extent(array) -> (lo, hi)``, the
    # device bytes the array covers (cugraphrt.adapter.byte_extent computes it). Without
    # them, rebinding falls back to copying. ``copy_changed(dst, src)``: write into ``dst``
    # only the elements of ``src`` that differ (an input the graph only read then costs no
    # write when it goes back to the caller); without it, ``copy``.
    #
    # Optional, for shape buckets (docs/shapes.md, "Sizing memory for serving"):
    # ``unowned(array, keep)``, an alias of ``array``'s memory that does not own it and keeps
    # ``keep`` alive; the caller then drops ``array``, so its memory goes back to the pool for
    # the next capture. ``keep`` is what the capture's front end says holds that memory mapped
    # (:class:`cugraphrt.adapter.CapturedBucket`'s ``memory``). Without it, every bucket's
    # outputs keep memory of their own.

    def same_layout(self, value: Any, static: Any) -> bool:
        """For ``value`` at ``static``'s address: whether it is ``static`` laid out alike
        (strides), so that no copy is needed."""

    def copy(self, dst: Any, src: Any) -> object:
        """Copy ``src`` into ``dst`` on the current stream (what it returns is ignored)."""

    def fill(self, rows: Any, value: float) -> None:
        """Fill ``rows`` with ``value`` on the current stream."""

    def empty(self, like: Any, shape: tuple[int, ...]) -> Any:
        """A new array of ``shape`` with ``like``'s dtype and device."""

    def clone(self, array: Any) -> Any:
        """A copy of ``array`` in new memory."""

    def is_contiguous(self, array: Any) -> bool:
        """Whether ``array`` is C-contiguous."""

    def describe(self, value: Any) -> str:
        """``value`` for an error message (``"shape (4, 8) float32 on device 0"``)."""

    # -- outputs -----------------------------------------------------------------------------

    def hand_out(self, static: Any) -> tuple[Any, Any]:
        """A fresh alias of a static output and a weak handle to what holds its memory."""

    def expire(self, held: Any, message: str, arguments: Any) -> None:
        """React to a live output a replay is about to overwrite: mark it, or raise."""

    def message(self, what: str, fix: str) -> str:
        """The error text for an overwritten output."""

    # -- streams -----------------------------------------------------------------------------

    def current_stream(self, device: int) -> int:
        """The raw handle of the framework's current stream on ``device``."""

    def use_stream(self, ptr: int, device: int) -> AbstractContextManager[Any]:
        """Make the stream ``ptr`` of ``device`` the framework's current stream."""

    # -- capture -----------------------------------------------------------------------------

    def capture(self, cuda_graph: Any, pool: Any = None) -> AbstractContextManager[Any]:
        """Capture the block's work (the framework's, and CuPy's on the same stream) into
        ``cuda_graph``, allocating from ``pool``."""

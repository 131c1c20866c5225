"""Which replay overwrites which graph's memory, and the outputs handed out until then.

A graphed callable returns its static outputs: ``y1 = f(x1); y2 = f(x2)`` leaves ``y1``
equal to ``y2``, because the second replay rewrote the memory ``y1`` reads. Two things are
needed to catch that, and both live here, framework-free:

* **Which replay can overwrite which buffer** (:class:`OverwriteOrder`, one per memory pool).
  Memory a capture allocated stays the graph's as long as its tensors live, so later captures
  into the pool never get it; earlier captures may have used it as scratch. Hence a replay of
  the graph captured ``seq``-th can overwrite the outputs of the graphs captured at or after
  ``seq`` in the same pool. Gradient buffers (``cugraphrt_torch``'s copy-on-overwrite guard)
  and handed-out outputs are settled by the same rule, from the same per-pool list.
* **What each call handed out** (:class:`OutputCheck`). Each call returns fresh objects over
  the static outputs (new torch storages, new CuPy memory objects: an alias of one call is
  told apart from the next call's), and notes weak handles to them. Before a replay that can
  overwrite them, the ones still alive are *expired* by the framework's :class:`OutputOps`:
  torch marks them so that reading them raises; CuPy, which has no such hook, refuses the
  replay instead (``docs/reliability.md``, "Reading an overwritten output").

The replay path pays one comparison when nothing is pending, and otherwise one pass over the
pending entries of the pool (one per graph with outputs alive, usually one): no allocation,
no logging. A message is formatted only for an output that is still alive.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from cugraphrt import _tree
from cugraphrt.errors import OptionsError

__all__ = ["ENV", "OutputCheck", "OutputOps", "OverwriteOrder", "order_for",
           "resolve_check_outputs"]

#: The environment variable that sets the default of the torch adapter's ``check_outputs``.
ENV = "CUGRAPHRT_CHECK_OUTPUTS"


class OverwriteOrder:
    """Per memory pool: capture-order numbers, and what each replay must settle first.

    ``pending`` holds ``(seq, holder, a, b)`` entries: something graph ``seq`` handed out,
    which ``holder.settle(a, b)`` deals with before a replay that may overwrite it.
    """

    __slots__ = ("pending", "max_seq", "exempt", "_next", "__weakref__")

    def __init__(self) -> None:
        self.pending: list[tuple[int, Any, Any, Any]] = []
        self.max_seq = -1  # highest seq in pending; -1 when empty (the replay fast path)
        self.exempt: Sequence[Any] = ()  # the arguments of the call being settled for
        self._next = 0

    def next_seq(self) -> int:
        """The capture-order number of the next graph captured into the pool."""
        seq = self._next
        self._next += 1
        return seq

    def record(self, seq: int, holder: Any, a: Any, b: Any) -> None:
        """Note what a replay of the graph ``seq`` handed out."""
        self.pending.append((seq, holder, a, b))
        if seq > self.max_seq:
            self.max_seq = seq

    def settle(self, seq: int) -> None:
        """Before a replay of graph ``seq``: settle every entry it may overwrite.

        Callers test ``order.max_seq >= seq`` first, so the common replay pays one compare.
        Filters in place (no new list); an error raised by one holder (CuPy's checked mode
        refusing the replay) is raised once every entry is settled.
        """
        pending = self.pending
        kept = 0
        top = -1
        error: BaseException | None = None
        for entry in pending:
            if entry[0] >= seq:
                try:
                    entry[1].settle(entry[2], entry[3])
                except BaseException as exc:  # noqa: BLE001 - raised below, after the others
                    if error is None:
                        error = exc
            else:
                pending[kept] = entry  # kept <= the iterator's index: safe in place
                kept += 1
                if entry[0] > top:
                    top = entry[0]
        del pending[kept:]
        self.max_seq = top
        if error is not None:
            raise error

    def settle_call(self, seq: int, arguments: Sequence[Any]) -> None:
        """:meth:`settle` for a call whose own ``arguments`` a holder leaves alone: reading
        them before the replay is fine, as in ``x = f(x)`` (CuPy's checked mode)."""
        self.exempt = arguments
        try:
            self.settle(seq)
        finally:
            self.exempt = ()


_orders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def order_for(pool: Any) -> OverwriteOrder:
    """The :class:`OverwriteOrder` of a memory pool (graphs sharing a pool share one)."""
    order = _orders.get(pool)
    if order is None:
        order = _orders[pool] = OverwriteOrder()
    return order


class OutputOps(Protocol):
    """How one framework hands out outputs and expires them (torch tensors, CuPy arrays)."""

    @property
    def array_type(self) -> type:
        """The framework's array class (which leaves of a nest are outputs to alias)."""

    def hand_out(self, static: Any) -> tuple[Any, Any]:
        """``(alias, handle)``: a fresh object over ``static``'s memory, told apart from every
        other call's, and a weak reference to what holds that memory for it and its views
        (called, it returns that holder, or None once nothing references it)."""

    def expire(self, held: Any, message: str, arguments: Sequence[Any]) -> None:
        """React to a live output (``held``: what its handle returned) that a replay is about
        to overwrite: mark it, or raise."""

    def message(self, what: str, fix: str) -> str:
        """The error text for output ``what`` ("output 0 of call #3 of ...")."""


class OutputCheck:
    """The outputs one graphed callable hands out, call by call, until a replay overwrites them.

    Parameters
    ----------
    label : str
        The callable, for messages: ``"graph_module(Net)"``.
    fix : str
        What to do instead, for messages: ``".clone() ... or pass copy_outputs=True"``.
    order : OverwriteOrder
        The order of the pool the callable's graphs live in.
    ops : OutputOps
        The framework's side.
    names : sequence of str, optional
        Per output, its place in what the callable returns (``"output['logits']"``, the
        paths of :func:`cugraphrt._tree.flatten`); ``"output <index>"`` without.
    """

    __slots__ = ("label", "fix", "order", "calls", "names", "_ops", "_hand_out")

    def __init__(self, label: str, fix: str, order: OverwriteOrder, ops: OutputOps,
                 names: Sequence[str] | None = None) -> None:
        self.label = label
        self.fix = fix
        self.order = order
        self.calls = 0
        self.names = names
        self._ops = ops
        self._hand_out = ops.hand_out

    # -- the call path ---------------------------------------------------------------------

    def before_replay(self, seq: int, arguments: Sequence[Any] = ()) -> None:
        """Expire what a replay of graph ``seq`` may overwrite, but the call's own
        ``arguments`` (see :meth:`OverwriteOrder.settle_call`)."""
        order = self.order
        if order.max_seq >= seq:
            order.settle_call(seq, arguments)

    def hand_out_one(self, seq: int, static: Any) -> Any:
        """After a replay of graph ``seq``: a fresh alias of its one output, noted."""
        alias, handle = self._hand_out(static)
        calls = self.calls = self.calls + 1
        # OverwriteOrder.record, inlined: this runs on every call.
        order = self.order
        order.pending.append((seq, self, handle, calls))
        if seq > order.max_seq:
            order.max_seq = seq
        return alias

    def hand_out(self, seq: int, statics: Sequence[Any], which: Sequence[int]) -> list:
        """After a replay of graph ``seq``: ``statics`` with fresh aliases at ``which``
        (the others, such as constants or outputs that view an input, are passed through)."""
        hand_out = self._hand_out
        out = list(statics)
        handles: list[Any] = [None] * len(out)
        for index in which:
            out[index], handles[index] = hand_out(statics[index])
        self.calls += 1
        self.order.record(seq, self, handles, self.calls)
        return out

    def hand_out_tree(self, seq: int, outputs: Any) -> Any:
        """:meth:`hand_out` for a nest of outputs: every array leaf aliased."""
        leaves, spec, self.names = _tree.flatten(outputs, "output")
        array_type = self._ops.array_type
        which = [i for i, leaf in enumerate(leaves) if isinstance(leaf, array_type)]
        return _tree.unflatten(spec, self.hand_out(seq, leaves, which))

    # -- called by the order ---------------------------------------------------------------

    def settle(self, handles: Any, call: int) -> None:
        """Expire the outputs of call ``call`` that are still alive (``handles``: one handle,
        or a list with None where nothing was handed out)."""
        if type(handles) is not list:
            held = handles()
            if held is not None:
                self._ops.expire(held, self.message(0, call), self.order.exempt)
            return
        for index, handle in enumerate(handles):
            if handle is not None:
                held = handle()
                if held is not None:
                    self._ops.expire(held, self.message(index, call), self.order.exempt)

    def message(self, index: int, call: int) -> str:
        """The text an expired output carries."""
        name = self.names[index] if self.names is not None else f"output {index}"
        return self._ops.message(f"{name} of call #{call} of {self.label}", self.fix)


def resolve_check_outputs(value: bool | None, *, default: bool = True) -> bool:
    """``check_outputs`` as given, or from ``CUGRAPHRT_CHECK_OUTPUTS`` when None.

    Raises
    ------
    OptionsError
        For a value of the variable that is not a boolean word.
    """
    if value is not None:
        return value
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return default
    from pydantic import TypeAdapter, ValidationError

    try:  # pydantic's lax booleans: 1/0, true/false, on/off, yes/no
        return TypeAdapter(bool).validate_python(raw, strict=False)
    except ValidationError:
        raise OptionsError(ENV, raw, "1 or 0 (also true/false, on/off, yes/no), or unset "
                                     "for the default") from None

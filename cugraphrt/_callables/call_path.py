"""The call path of every graphed callable: copy in, settle, replay, hand out.

Whatever the framework and whatever made it (:func:`cugraphrt.make_graphed`, shape buckets,
``cugraphrt_torch``'s ``graph_module``, ``make_graphed_callables`` and its compile backend),
a call of a graphed callable runs the same four steps, here and nowhere else:

1. **copy in**: the call's arrays go into the graph's static inputs (``load``), skipped for
   an argument that already is its static input; a mismatch raises :class:`Mismatch`, which
   the front end turns into an error or an eager run;
2. **settle**: before a replay that may overwrite memory of the pool, everything handed out
   of it that the replay would overwrite is dealt with (``cugraphrt._memory.overwrites``);
   after the copies, because an argument may be an earlier output (``x = f(x)``);
3. **replay** the graph (``replay``: a bound launch, chosen when the callable is made);
4. **hand out** what the call returns (``hand_out``): the static outputs, copies of them,
   or checked aliases (:class:`HandOut`).

The front ends differ only in what they pass for each step. The steps receive nothing but
the call's leaves, so a path holds no reference to the callable that owns it (docs/concepts.md,
"Lifetimes"). ``load`` returns a token that ``hand_out`` receives: the bucket's call size, or
None. No step allocates on its own beyond what it hands out, validates beyond one
comparison per argument, or logs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cugraphrt import _tree
from cugraphrt._memory.overwrites import OutputCheck, OverwriteOrder

__all__ = ["CallPath", "CopyIn", "HandOut", "Mismatch", "check_constants", "split_leaves"]


class Mismatch(Exception):
    """Raised by a ``load`` step: argument ``index`` (at ``path``) does not match its static
    input ``static`` (got ``value``). Front ends turn it into their error or an eager run."""

    def __init__(self, index: int, path: str, static: Any, value: Any) -> None:
        super().__init__(path)
        self.index = index
        self.path = path
        self.static = static
        self.value = value


class CallPath:
    """The four steps of one graph's calls (see the module docstring).

    Parameters
    ----------
    load : callable
        ``load(leaves) -> token``: copies the call's arrays in; raises :class:`Mismatch`.
    order : OverwriteOrder
        The order of the graph's pool.
    seq : int
        The graph's capture order in its pool.
    replay : callable
        Launches the graph (no argument).
    hand_out : callable
        ``hand_out(token) -> result``.
    """

    __slots__ = ("load", "order", "seq", "replay", "hand_out")

    def __init__(self, load: Callable[[Any], Any], order: OverwriteOrder, seq: int,
                 replay: Callable[[], object], hand_out: Callable[[Any], Any]) -> None:
        self.load = load
        self.order = order
        self.seq = seq
        self.replay = replay
        self.hand_out = hand_out

    def __call__(self, leaves: Sequence[Any]) -> Any:
        token = self.load(leaves)
        order = self.order  # after the copies: an argument may be an earlier output
        if order.max_seq >= self.seq:
            order.settle_call(self.seq, leaves)
        self.replay()
        return self.hand_out(token)


def split_leaves(framework: Any, leaves: Sequence[Any], paths: Sequence[str]
                 ) -> tuple[list[tuple[int, Any, str]], tuple[tuple[int, Any, str], ...]]:
    """The leaves a load step copies in or rebinds (the framework's arrays) and those it
    compares only (constants), each as ``(index, leaf, path)``: what :class:`CopyIn` and
    :class:`cugraphrt._callables.rebind.RebindIn` both start from."""
    array_type = framework.array_type
    arrays: list[tuple[int, Any, str]] = []
    constants: list[tuple[int, Any, str]] = []
    for index, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
        (arrays if isinstance(leaf, array_type) else constants).append((index, leaf, path))
    return arrays, tuple(constants)


def check_constants(constants: Sequence[tuple[int, Any, str]], leaves: Sequence[Any]) -> None:
    """Raise :class:`Mismatch` for the first constant leaf a call passes unequal (the graph
    was captured with the constant's value)."""
    for index, expected, path in constants:
        if leaves[index] != expected:
            raise Mismatch(index, path, expected, leaves[index])


class CopyIn:
    """The usual ``load`` step: each array leaf copied into its static input.

    Per argument it pays one ``signature`` (shape, dtype, device), one ``address`` and, for
    a new array, one ``copy``: both lookups are C-level callables in CuPy's and torch's
    frameworks (``operator.attrgetter``, a method descriptor), so no Python frame runs per
    argument but the copy's.

    Parameters
    ----------
    framework : cugraphrt.adapter.Framework
        Supplies ``array_type``, ``signature``, ``address``, ``same_layout``, ``copy`` and
        ``clone``.
    leaves : sequence
        The static inputs as captured, one per argument leaf; leaves that are not arrays of
        the framework are constants and must be passed equal.
    paths : sequence of str
        Each leaf's place (``"args[1]"``), for messages.
    """

    __slots__ = ("_arrays", "_constants", "_signature", "_address", "_same_layout", "_copy",
                 "_clone")

    def __init__(self, framework: Any, leaves: Sequence[Any], paths: Sequence[str]) -> None:
        signature, address = framework.signature, framework.address
        arrays, self._constants = split_leaves(framework, leaves, paths)
        self._arrays = tuple((i, leaf, address(leaf), signature(leaf), path)
                             for i, leaf, path in arrays)
        self._signature = signature
        self._address = address
        self._same_layout = framework.same_layout
        self._copy = framework.copy
        self._clone = framework.clone

    def __call__(self, leaves: Sequence[Any]) -> None:
        signature, address = self._signature, self._address
        for index, static, at, expected, path in self._arrays:
            value = leaves[index]
            if value is static:
                continue
            try:
                if signature(value) != expected:
                    raise Mismatch(index, path, static, value)
                moved = address(value) != at
            except (AttributeError, TypeError):  # not an array of the framework
                raise Mismatch(index, path, static, value) from None
            if moved:
                self._copy(static, value)
            elif not self._same_layout(value, static):  # the static buffer, laid out anew
                self._copy(static, self._clone(value))
        if self._constants:
            check_constants(self._constants, leaves)


class HandOut:
    """The usual ``hand_out`` step: the static outputs, copies, or checked aliases.

    Parameters
    ----------
    outputs : Any
        What the captured function returned: one array, or a nest of them (tuples, lists,
        dicts) with other values passed through.
    framework : cugraphrt.adapter.Framework
        Supplies ``array_type`` and ``clone``.
    copy : bool
        Return clones (``copy_outputs=True``).
    check : OutputCheck, optional
        Hand out fresh aliases, expired before a replay overwrites them (``check_outputs``).
    seq : int
        The graph's capture order in its pool (for ``check``).
    which : sequence of int, optional
        The leaves to clone or alias (default: every array leaf); the others are passed
        through as they are (outputs that view an input, for example).
    as_list : bool, default False
        Return a new list of the leaves every call (what a compiled FX graph returns).
    """

    __slots__ = ("outputs", "_leaves", "_spec", "_which", "_clone", "_check", "_seq", "_one",
                 "_mode")

    def __init__(self, outputs: Any, framework: Any, *, copy: bool,
                 check: OutputCheck | None = None, seq: int = 0,
                 which: Sequence[int] | None = None, as_list: bool = False) -> None:
        array_type = framework.array_type
        self.outputs = outputs
        self._one = isinstance(outputs, array_type)
        if as_list:
            self._leaves, self._spec, paths = list(outputs), None, [
                f"output {i}" for i in range(len(outputs))]
        else:
            self._leaves, self._spec, paths = _tree.flatten(outputs, "output")
        self._which = tuple(i for i, leaf in enumerate(self._leaves)
                            if isinstance(leaf, array_type)) if which is None else tuple(which)
        self._clone = framework.clone
        self._seq = seq
        self._check = check if (check is not None and not copy and self._which) else None
        if self._check is not None:
            self._check.names = paths
        self._mode = "copy" if copy else "check" if self._check is not None else (
            "list" if as_list else "static")

    def __call__(self, token: Any = None) -> Any:
        mode = self._mode
        if mode == "static":
            return self.outputs
        if mode == "check":
            check = self._check
            assert check is not None
            if self._one:
                return check.hand_out_one(self._seq, self.outputs)
            return self._result(check.hand_out(self._seq, self._leaves, self._which))
        if mode == "list":
            return list(self._leaves)
        if self._one:
            return self._clone(self.outputs)
        leaves = list(self._leaves)
        clone = self._clone
        for index in self._which:
            leaves[index] = clone(leaves[index])
        return self._result(leaves)

    def _result(self, leaves: list) -> Any:
        return leaves if self._spec is None else _tree.unflatten(self._spec, leaves)

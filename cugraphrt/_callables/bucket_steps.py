"""The load and hand-out steps of one shape bucket's call path.

:class:`cugraphrt._callables.buckets.Bucketed` makes one :class:`BucketSteps` per captured
bucket: a call of size ``n`` is copied into the bucket's static buffers (the rows past ``n``
padded) and its outputs are handed out cut to ``n`` rows; with ``inputs="rebind"`` a call of
the bucket's own size is rebound instead (:mod:`cugraphrt._callables.rebind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cugraphrt import _tree
from cugraphrt._callables.bucket_family import BucketFamily
from cugraphrt._callables.bucket_plan import rows
from cugraphrt._callables.call_path import CallPath, HandOut
from cugraphrt._callables.rebind import (
    RebindIn,
    outside_pool,
    plan_for,
    rebind_step,
    with_write_back,
)
from cugraphrt._memory.overwrites import OverwriteOrder

__all__ = ["BucketSteps"]


class BucketSteps:
    """The load and hand-out steps of one bucket's call path.

    They copy a call of size ``n`` into the bucket's static buffers (padding the rows past
    ``n``) and hand out the outputs cut to ``n`` rows. They read the family's
    :class:`~cugraphrt._callables.bucket_family.BucketFamily`, never the :class:`Bucketed`
    (which holds them: see its docstring).
    """

    __slots__ = ("_size", "_use", "_hand_outs", "_slots", "_statics", "_ops", "_pad_fn",
                 "_pad_value", "_clock", "_probe", "_outputs", "_output_dims", "_copy", "_check",
                 "_seq", "_replay", "_rebind", "_home", "_slot_back", "_static_back",
                 "_copied", "copied", "writes", "_pool", "_address")

    def __init__(self, family: BucketFamily, bucket: Any, entry: Any) -> None:
        # The bucket holds the path that holds these steps: they hold its parts and the
        # family's (a value object), never the Bucketed that holds the bucket.
        self._size = bucket.size
        self._use = bucket.use
        self._hand_outs = bucket.outputs_by_n
        # Read on every call: kept as attributes of these steps.
        self._slots = family.slots
        self._statics = family.statics
        self._ops = family.ops
        self._pad_fn = family.pad_fn
        self._pad_value = family.pad_value
        self._clock = family.clock
        self._probe = family.probe
        self._outputs = entry.outputs
        self._output_dims = family.output_dims
        self._copy = family.copy_outputs
        self._check = family.check
        self._seq = entry.seq
        self._replay = entry.replay
        # inputs="rebind": a call of the bucket's own size points the graph at its arrays;
        # a smaller one is copied and padded into the bucket's buffers (``_home``), and the
        # graph pointed back at them.
        self._rebind: RebindIn | None = None
        self._home: list = []
        # inputs="rebind" keeps its meaning where a call is copied in: the slots and static
        # arguments the graph writes go back to the caller's arrays after the replay.
        self._slot_back: tuple = ()
        self._static_back: tuple = ()
        self._copied: list = []
        self.copied: list = self._copied
        if family.inputs == "rebind" and entry.graph is not None:
            home = family.bucket_leaves(bucket.size)
            paths = [f"args[{i}]" for i in range(len(home))]
            plan = plan_for(family.ops, home, paths, entry.graph,
                            _tree.flatten(entry.outputs, "output")[0], written=entry.written)
            step = rebind_step(family.ops, home, paths, entry.graph, plan,
                               f"{family.name}, bucket {bucket.size}", strict=family.strict)
            if isinstance(step, RebindIn):
                self._rebind, self._home = step, home
            arrays = [i for i, leaf in enumerate(home) if isinstance(leaf, family.ops.array_type)]
            writes = {i for i, w in zip(arrays, plan.written, strict=True) if w}
            self._slot_back = tuple(slot for slot in self._slots if slot.index in writes)
            self._static_back = tuple((index, static) for index, static, *_ in self._statics
                                      if index in writes)
        self.writes = bool(self._slot_back or self._static_back)
        self._pool = family.pool
        self._address: Any = family.ops.address if self.writes else None

    def path(self, order: OverwriteOrder) -> CallPath:
        """The bucket's call path, over these steps."""
        return CallPath(self.load, order, self._seq,
                        with_write_back(self._ops, self, self._replay), self.hand_out)

    def load(self, leaves: Sequence[Any]) -> int:
        probe = self._probe
        n = leaves[probe.index].shape[probe.dim]
        size = self._size
        rebind = self._rebind
        if rebind is not None:
            if n == size:
                rebind(leaves)
                self.copied = rebind.copied
                self._count(n)
                return n
            rebind(self._home)  # no-op while the graph points at its own buffers
        copy = self._ops.copy
        for slot in self._slots:
            copy(slot.copy_views[n], leaves[slot.index])
            dirty = slot.dirty[n]
            rows = dirty[0]
            if n < size:
                if self._pad_fn is not None:
                    self._pad_fn(slot.pad_views[n], slot.path)
                elif rows > n:
                    self._ops.fill(slot.pad_views[n], self._pad_value)
            dirty[0] = n if rows <= size else rows
        for index, static, _, _, _ in self._statics:
            value = leaves[index]
            if value is not static:
                copy(static, value)
        if self.writes:
            self._note_copies(leaves, n)
        self._count(n)
        return n

    def _note_copies(self, leaves: Sequence[Any], n: int) -> None:
        """What the replay must copy back: the written slots' first ``n`` rows, the written
        static arguments (``inputs="rebind"``; see the module docstring)."""
        copied = self.copied = self._copied
        copied.clear()
        pool, address = self._pool, self._address
        for slot in self._slot_back:
            value = leaves[slot.index]
            if outside_pool(pool, address(value)):  # not an earlier output (x = f(x))
                copied.append((slot.copy_views[n], value))
        for index, static in self._static_back:
            value = leaves[index]
            if value is not static and outside_pool(pool, address(value)):
                copied.append((static, value))

    def _count(self, n: int) -> None:
        use = self._use
        use.last_used = self._clock.tick()
        use.calls += 1
        use.padded_rows += self._size - n

    def hand_out(self, n: int) -> Any:
        hand_out = self._hand_outs.get(n)
        if hand_out is None:
            hand_out = self._hand_outs[n] = HandOut(
                self._views(self._size, n), self._ops, copy=self._copy, check=self._check,
                seq=self._seq)
        return hand_out()

    def _views(self, size: int, n: int) -> Any:
        """The outputs as a call of size ``n`` sees them: dynamic outputs cut to ``n`` rows."""
        leaves, spec, _ = _tree.flatten(self._outputs)
        if self._output_dims is not None:
            return _tree.unflatten(spec, [
                rows(leaf, at, 0, n) if at is not None and n != size else leaf
                for leaf, at in zip(leaves, self._output_dims, strict=True)])
        array_type = self._ops.array_type
        dim = self._probe.dim
        cut = []
        for leaf in leaves:
            if (n != size and isinstance(leaf, array_type) and len(leaf.shape) > dim
                    and leaf.shape[dim] == size):
                leaf = rows(leaf, dim, 0, n)
            cut.append(leaf)
        return _tree.unflatten(spec, cut)



"""What every bucket of one shape-bucket family shares.

:class:`cugraphrt._callables.buckets.Bucketed` builds one :class:`BucketFamily` from its
sample arguments and options, and each bucket's steps
(:class:`cugraphrt._callables.bucket_steps.BucketSteps`) hold it: the steps read the family,
never the ``Bucketed`` that holds them (which would keep every bucket's graph alive through
a cycle; docs/concepts.md, "Lifetimes").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cugraphrt._callables.bucket_plan import Slot
    from cugraphrt._callables.bucket_table import Clock
    from cugraphrt._callables.framework import Framework
    from cugraphrt._memory.overwrites import OutputCheck
    from cugraphrt._memory.pool import MemPool

__all__ = ["BucketFamily"]


class BucketFamily:
    """The arguments, options and shared state of one bucket family.

    Attributes
    ----------
    name : str
        The callable's name, for messages.
    ops : Framework
        The front end's array operations.
    pool : MemPool
        The pool every bucket's graph is captured into.
    slots : list of Slot
        The dynamic arguments: their static buffers and per-size views.
    statics : list of tuple
        ``(index, static, shape, dtype, path)`` for each array argument without a dynamic
        dimension (copied in whole when a call passes another array).
    constants : list of tuple
        ``(index, value, path)`` for each argument that is not an array.
    probe : Slot
        The slot whose size decides a call's bucket.
    num_leaves : int
        The arguments' leaves, flattened.
    pad_fn, pad_value
        How the rows past a call's size are filled (:func:`bucket_plan.check_pad`).
    clock : Clock
        The family's use clock (least-recently-used eviction under a memory budget).
    output_dims : tuple or None
        Per output leaf, the dimension that carries the dynamic size.
    copy_outputs, strict : bool
    check : OutputCheck or None
        The overwritten-output check of the pool.
    inputs : {"copy", "rebind"}
    """

    __slots__ = ("name", "ops", "pool", "slots", "statics", "constants", "num_leaves",
                 "pad_fn", "pad_value", "clock", "output_dims", "copy_outputs", "strict",
                 "check", "inputs")

    def __init__(self, *, name: str, ops: Framework, pool: MemPool, num_leaves: int,
                 pad_fn: Callable[[Any, str], None] | None, pad_value: Any, clock: Clock,
                 output_dims: tuple[int | None, ...] | None, copy_outputs: bool,
                 strict: bool, check: OutputCheck | None, inputs: str) -> None:
        self.name = name
        self.ops = ops
        self.pool = pool
        # Filled by the Bucketed as it reads its sample arguments.
        self.slots: list[Slot] = []
        self.statics: list[tuple] = []
        self.constants: list[tuple] = []
        self.num_leaves = num_leaves
        self.pad_fn = pad_fn
        self.pad_value = pad_value
        self.clock = clock
        self.output_dims = output_dims
        self.copy_outputs = copy_outputs
        self.strict = strict
        self.check = check
        self.inputs = inputs

    @property
    def probe(self) -> Slot:
        return self.slots[0]

    def pad(self, rows: Any, path: str) -> None:
        """Fill ``rows`` (the rows of a static buffer past a call's size)."""
        if self.pad_fn is not None:
            self.pad_fn(rows, path)
        else:
            self.ops.fill(rows, self.pad_value)

    def bucket_leaves(self, size: int) -> list:
        """The arguments' leaves as bucket ``size`` is captured with: the slots' buffers of
        that size, the static arrays, the constants."""
        leaves: list[Any] = [None] * self.num_leaves
        for slot in self.slots:
            leaves[slot.index] = slot.per_bucket[size]
        for index, static, *_ in self.statics:
            leaves[index] = static
        for index, value, _ in self.constants:
            leaves[index] = value
        return leaves

"""Shape buckets: one graphed callable that serves every size of a dynamic dimension.

A CUDA graph replays fixed shapes. To serve a batch dimension that varies from call to call,
a :class:`Bucketed` callable keeps one graph per *bucket* (a size of the dynamic dimension)
and runs a call of size ``n`` on the graph of the smallest bucket ``>= n``: the inputs are
copied into that bucket's static buffers, the rows past ``n`` are filled with a pad value, and
outputs that carry the dynamic dimension come back as views of their first ``n`` rows. The
front ends (:func:`cugraphrt.make_graphed` for CuPy functions, ``cugraphrt_torch.graph_module``
for torch modules) differ only in their :class:`~cugraphrt.adapter.Framework` and in how they
capture one bucket.

Memory. Every bucket's graph is captured into one pool, largest first by
:meth:`Bucketed.capture_all`, so the smaller buckets reuse the largest one's temporaries, and
the static input buffers of all buckets are views of one buffer sized for the largest bucket.
The graphs of one pool may replay in any order here, because nothing a graph leaves behind is
read by another: the only memory that outlives a replay is the graph's outputs, and those are
documented to be valid until the next call (of any bucket). ``memory_budget`` bounds the
pool's *measured* reserved bytes by releasing least-recently-used buckets' graphs.

Warm-ups. Only the family's first capture runs the front end's warm-ups (``num_warmup_iters``
eager runs: library handles, workspaces, lazy state); a later bucket is captured at once, and
warmed up and captured again only if that capture fails (a library that must run a new size
eagerly first, such as cuDNN's autotuning). Measured on an H100, a 35-size family of a Llama
decode step: with 3 warm-ups for every size the family's capture took as long as vLLM-style
torch per-size capture (0.92x); the warm-ups of later sizes repeated what the first did.

Outputs. A family with a pool of its own shares its outputs' memory too, as vLLM does with
weak references: right after each capture the outputs become aliases that do not own their
memory (the framework's ``unowned``), kept mapped by what the capture says holds it
(``CapturedBucket.memory``), so the next, smaller capture may place its temporaries or its
outputs there. Otherwise every bucket's outputs stay reserved: on an H100, a 35-size family
of a 4-layer fp16 transformer stack reserved 204 MiB against 110 MiB for its largest bucket
alone, the difference being the smaller buckets' outputs. So a call may overwrite the outputs
of every bucket, and the overwritten-output check treats the family as one graph (one capture
number for all). A family given a ``pool`` keeps each bucket's outputs: the pool's later
graphs must not get that memory. :meth:`Bucketed.predict_reserved_bytes` tells what the
family will reserve from its largest bucket's capture (docs/shapes.md).

Everything here is host-side bookkeeping; the call path does no allocation once a bucket and
a size have been seen (views are cached per size), and no validation beyond one shape, dtype
and device comparison per argument.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from cugraphrt import _tree
from cugraphrt._callables.bucket_family import BucketFamily
from cugraphrt._callables.bucket_plan import (
    Slot,
    bucket_sizes,
    check_budget,
    check_pad,
    leaf_dims,
    make_slot,
    resolve_buckets,
    sample_size,
)
from cugraphrt._callables.bucket_steps import BucketSteps
from cugraphrt._callables.bucket_table import BucketRecord, CapturedBucket, Clock, takes_warm
from cugraphrt._callables.framework import Framework
from cugraphrt._callables.rebind import check_inputs_mode
from cugraphrt._memory.overwrites import OutputCheck, order_for
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import OptionsError, PoolOutOfMemoryError, ReplayError
from cugraphrt.options import BucketStat, BucketStats, PoolStats

__all__ = ["Bucketed", "CapturedBucket", "resolve_buckets"]


class Bucketed:
    """A callable that replays the graph of the smallest bucket that fits each call.

    Built by the front ends; see :func:`cugraphrt.make_graphed` for the parameters.
    ``capture(args, pool, warm)`` captures one bucket's graph into ``pool``, after the front
    end's warm-ups when ``warm`` is true. The callbacks a front
    end passes (``capture``, ``eager``, ``pad``, ``check``, ``trim``) must not reference the
    front end object itself: it holds this one, and a cycle would keep every bucket's graph
    alive until a garbage collection (docs/concepts.md, "Lifetimes").
    """

    def __init__(self, *, ops: Framework, sample_args: tuple, buckets: Any,
                 dynamic_dim: int | Sequence[int | None], pad: Any, memory_budget: int | None,
                 strict: bool, pool: MemPool | None, copy_outputs: bool,
                 capture: Callable[[tuple, MemPool, bool], CapturedBucket],
                 eager: Callable[..., Any],
                 name: str, trim: Callable[[], object] | None = None,
                 output_dims: Sequence[int | None] | None = None,
                 check: Callable[[MemPool], OutputCheck | None] | None = None,
                 inputs: str = "copy", share_outputs: bool | None = None) -> None:
        # share_outputs: whether the buckets share their outputs' memory (module docstring);
        # None: when the family has a pool of its own.
        # output_dims: per output leaf, the dimension that carries the dynamic size (None:
        # never cut), for front ends that know it; otherwise leaves whose dynamic_dim equals
        # the bucket size are cut. check: makes the overwritten-output check of the pool.
        self._ops = ops
        self._capture_fn = capture
        # capture(args, pool) from an adapter written before ``warm`` existed: it warms up
        # every capture itself, and is called so.
        self._takes_warm = takes_warm(capture)
        self._trim = trim
        self._eager = eager
        self._budget = check_budget(memory_budget)
        pad_value, pad_fn = check_pad(pad)
        # Outputs share memory only in a pool of the family's own (see the module docstring).
        shares = pool is None if share_outputs is None else bool(share_outputs)
        self._shares_outputs = shares and hasattr(ops, "unowned")
        self.pool = pool if pool is not None else MemPool()
        # One capture number for the whole family when outputs are shared: any bucket's replay
        # may overwrite any bucket's outputs. Taken now, below every bucket's own.
        self._family_seq = order_for(self.pool).next_seq() if self._shares_outputs else None
        self._predicted: int | None = None
        self._warmed = False  # whether a capture of the family ran its warm-ups
        leaves, self._spec, paths = _tree.flatten(sample_args, "args")
        self._flat = self._spec.is_flat_tuple
        self._num_leaves = len(leaves)
        dims = leaf_dims(sample_args, dynamic_dim, ops.array_type)
        size = sample_size(leaves, dims, paths, dynamic_dim)
        self.buckets: tuple[int, ...] = resolve_buckets(buckets, size)
        self._max = self.buckets[-1]
        self._table = [BucketRecord(size) for size in self.buckets]
        # n -> its bucket, for every n the buckets serve (index 0 unused: size 0 is eager)
        by_size = {bucket.size: bucket for bucket in self._table}
        self._bucket_of: list[BucketRecord | None] = [by_size.get(size)
                                                 for size in bucket_sizes(self.buckets)]
        # What every bucket shares, and its steps read (bucket_family). output_dims: per
        # output leaf, the dimension that carries the dynamic size (None: never cut), for
        # front ends that know it; otherwise leaves whose dynamic_dim equals the bucket size
        # are cut. check: makes the overwritten-output check of the pool. inputs="rebind":
        # calls of a bucket's own size rebind.
        self._family = family = BucketFamily(
            name=name, ops=ops, pool=self.pool, num_leaves=len(leaves), pad_fn=pad_fn,
            pad_value=pad_value, clock=Clock(),
            output_dims=None if output_dims is None else tuple(output_dims),
            copy_outputs=bool(copy_outputs), strict=bool(strict),
            check=check(self.pool) if check is not None else None,
            inputs=check_inputs_mode(inputs))
        for index, (leaf, dim, path) in enumerate(zip(leaves, dims, paths, strict=True)):
            if dim is not None:
                family.slots.append(make_slot(ops, index, leaf, dim, path, size, self.buckets,
                                              family.pad))
            elif isinstance(leaf, ops.array_type):
                family.statics.append((index, leaf, leaf.shape, leaf.dtype, path))
            else:
                family.constants.append((index, leaf, path))
        self._probe = family.probe  # read on every call
        self._eager_calls = 0
        self._fallbacks: dict[str, int] = {}
        self._warned: set[str] = set()

    # -- the call path ---------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        if self._flat and len(args) == self._num_leaves:
            leaves: Sequence[Any] = args
        else:
            leaves, spec, _ = _tree.flatten(args, "args")
            if spec != self._spec:
                return self.fallback(args, "structure", (
                    f"the arguments do not match the sample's structure (expected "
                    f"{self._spec.describe()}, got {spec.describe()})"))
        probe = self._probe
        try:
            n = leaves[probe.index].shape[probe.dim]
        except (AttributeError, IndexError, TypeError):
            return self.fallback(args, f"type {probe.path}",
                                 self._type_reason(probe.path, leaves[probe.index]))
        if not 0 < n <= self._max:
            if n == 0:
                return self.fallback(args, "empty", f"{probe.path} has size 0 in dimension "
                                     f"{probe.dim} (got an empty batch)")
            return self.fallback(args, "above", (
                f"size {n} of dimension {probe.dim} is above the largest bucket "
                f"{self._max} (got {probe.path} of shape {tuple(leaves[probe.index].shape)})"))
        bucket = self._bucket_of[n]
        assert bucket is not None
        array_type = self._ops.array_type
        for slot in self._family.slots:
            value = leaves[slot.index]
            if (not isinstance(value, array_type) or value.shape != slot.shapes[n]
                    or value.dtype != slot.dtype):
                return self._mismatch(args, slot, value, n)
        for index, static, shape, dtype, path in self._family.statics:
            value = leaves[index]
            if value is static:
                continue
            if (not isinstance(value, array_type) or value.shape != shape
                    or value.dtype != dtype):
                return self.fallback(args, f"static {path}", (
                    f"argument {path} is not dynamic and changed (expected "
                    f"{self._ops.describe(static)}, got {self._ops.describe(value)})"))
        for index, expected, path in self._family.constants:
            if leaves[index] != expected:
                return self.fallback(args, f"constant {path}", (
                    f"argument {path} differs from the sample (expected {expected!r}, got "
                    f"{leaves[index]!r}); non-array arguments are baked into the graphs"))
        path = bucket.path
        if path is None:
            if self._capture(bucket) is None:
                return self.fallback(args, f"budget {bucket.size}", (
                    f"bucket {bucket.size} alone needs more pool memory than memory_budget="
                    f"{self._budget} bytes (got {bucket.alone_bytes} bytes reserved with its "
                    f"graph alone)"))
            path = bucket.path
            assert path is not None
        return path(leaves)

    # -- capture, eviction -----------------------------------------------------------------

    def _capture(self, bucket: BucketRecord, retry: bool = True) -> CapturedBucket | None:
        if bucket.over_budget:
            return None
        pool = self.pool
        before = pool.stats().reserved_bytes
        start = perf_counter()
        args = _tree.unflatten(self._spec, self._family.bucket_leaves(bucket.size))
        entry = self._capture_warm(args, pool, bucket)
        if self._shares_outputs and entry.memory is not None:
            self._share_outputs(entry)
        bucket.capture_seconds += perf_counter() - start
        bucket.captures += 1
        bucket.exec_bytes = entry.exec_bytes
        bucket.shared_bytes = before
        bucket.entry = entry
        bucket.outputs_by_n = {}
        # No local may hold the steps: they hold the outputs, which a release below must free.
        bucket.path = BucketSteps(self._family, bucket, entry).path(order_for(pool))
        bucket.use.last_used = self._family.clock.tick()
        bucket.growth_bytes = max(0, pool.stats().reserved_bytes - before)
        if self._budget is not None and not self._fit_budget(keep=bucket):
            # Every other bucket is gone and this one still does not fit. Memory a framework
            # caches for the pool (torch's) returns only once none of the pool's graphs
            # lives: release this one too, and capture it again on its own.
            bucket.alone_bytes = self._reserved_bytes()
            self._evict(bucket)
            del entry  # nothing may keep the released graph alive while the pool is measured
            if retry:
                self._reserved_bytes()
                return self._capture(bucket, retry=False)
            self._reserved_bytes()
            bucket.over_budget = True
            return None
        return entry

    def _capture_warm(self, args: tuple, pool: MemPool, bucket: BucketRecord) -> CapturedBucket:
        """Capture with warm-ups only where they are needed (the module docstring, "Warm-ups").

        The family's first capture runs the front end's warm-ups; a later one captures at
        once, and only if that fails is it warmed up and captured again.
        """
        if not self._takes_warm:
            return self._capture_fn(args, pool)  # type: ignore[call-arg]
        if not self._warmed:
            entry = self._capture_fn(args, pool, True)
            self._warmed = True
            return entry
        try:
            return self._capture_fn(args, pool, False)
        except PoolOutOfMemoryError:
            raise  # a warm-up would not make room
        except Exception:  # noqa: BLE001 - a first run at this size may be what was missing
            bucket.cold_failures += 1
            return self._capture_fn(args, pool, True)

    def _share_outputs(self, entry: CapturedBucket) -> None:
        """Let the next capture reuse the memory of ``entry``'s outputs (module docstring):
        the outputs become aliases that do not own it, the originals are dropped here."""
        leaves, spec, _ = _tree.flatten(entry.outputs, "output")
        array_type = self._ops.array_type
        unowned = self._ops.unowned  # type: ignore[attr-defined]
        entry.outputs = _tree.unflatten(spec, [
            unowned(leaf, entry.memory) if isinstance(leaf, array_type) else leaf
            for leaf in leaves])
        del leaves
        assert self._family_seq is not None
        entry.seq = self._family_seq

    def predict_reserved_bytes(self) -> int:
        """The pool bytes the family will reserve with every bucket captured, before they are.

        Captures the largest bucket (unless it is captured) and returns the pool's reserved
        bytes then: the smaller buckets, captured after it, reuse its memory (module
        docstring), so the family reserves this much, within a few percent (measured in the
        tests and by ``cugraphrt bench --only many_shapes``). Call it before
        :meth:`capture_all` and before sizing a cache from the memory left (docs/shapes.md).
        With a family given a ``pool``, the outputs of every bucket add to it.
        """
        largest = self._table[-1]
        if largest.entry is None and self._capture(largest) is None:
            raise ReplayError(
                f"the largest bucket {largest.size} alone needs more pool memory than "
                f"memory_budget={self._budget} bytes (got {largest.alone_bytes} bytes "
                f"reserved with its graph alone)")
        self._predicted = self.pool.stats().reserved_bytes
        return self._predicted

    def _fit_budget(self, keep: BucketRecord) -> bool:
        """Release least-recently-used graphs until the pool's reserved bytes fit the budget.

        Measured, not estimated: after each release the pool gives back the segments no live
        graph uses and its stats are read again. Returns whether ``keep`` fits.
        """
        budget = self._budget
        assert budget is not None
        while self._reserved_bytes() > budget:
            victims = [b for b in self._table if b.entry is not None and b is not keep]
            if not victims:
                return False
            self._evict(min(victims, key=lambda b: b.use.last_used))
        return True

    def _reserved_bytes(self) -> int:
        if self._trim is not None:
            self._trim()  # the front end's cache over the pool lets go of what it can
        self.pool.empty_cache()
        return self.pool.stats().reserved_bytes

    def _evict(self, bucket: BucketRecord) -> None:
        entry, bucket.entry = bucket.entry, None
        bucket.path = None
        bucket.outputs_by_n = {}
        if entry is not None:
            bucket.evictions += 1
            entry.release()

    def capture_all(self, progress: bool | None = None) -> None:
        """Capture every bucket not captured yet, largest first.

        Largest first lets each smaller bucket reuse the memory the larger ones freed, so the
        pool ends up about the size of the largest bucket's needs.

        Parameters
        ----------
        progress : bool, optional
            Show a progress bar on stderr (tqdm). By default only when stderr is a terminal.
        """
        pending = [b for b in reversed(self._table) if b.entry is None and not b.over_budget]
        show = sys.stderr.isatty() if progress is None else bool(progress)
        from tqdm.auto import tqdm

        with tqdm(total=len(pending), desc=f"capturing {self._family.name}", unit="graph",
                  disable=not show, file=sys.stderr, leave=False) as bar:
            for bucket in pending:
                bar.set_postfix_str(f"bucket {bucket.size}")
                self._capture(bucket)
                bar.update(1)

    def release(self, size: int | None = None) -> None:
        """Release the graph of bucket ``size`` (every bucket's if None); it is captured
        again on its next use.

        Raises
        ------
        OptionsError
            If ``size`` is not one of the buckets.
        """
        if size is None:
            targets = self._table
        else:
            targets = [b for b in self._table if b.size == size]
            if not targets:
                raise OptionsError("size", size, f"one of the buckets {list(self.buckets)}")
        for bucket in targets:
            self._evict(bucket)
            bucket.over_budget = False
        self.pool.empty_cache()

    # -- falling back ----------------------------------------------------------------------

    def _mismatch(self, args: tuple, slot: Slot, value: Any, n: int) -> Any:
        if not isinstance(value, self._ops.array_type):
            return self.fallback(args, f"type {slot.path}", self._type_reason(slot.path, value))
        if value.dtype != slot.dtype:
            return self.fallback(args, f"dtype {slot.path}", (
                f"argument {slot.path} has dtype {value.dtype} (expected {slot.dtype})"))
        shape = tuple(value.shape)
        expected = slot.shapes[n]
        assert expected is not None
        if len(shape) == len(expected) and shape[slot.dim] != n:
            return self.fallback(args, "sizes", (
                f"the dynamic arguments disagree in size (got {self._probe.path} with {n} rows "
                f"and {slot.path} with {shape[slot.dim]})"))
        return self.fallback(args, f"shape {slot.path}", (
            f"argument {slot.path} has shape {shape} (expected {expected[:slot.dim]} + "
            f"(any size,) + {expected[slot.dim + 1:]}: only dimension {slot.dim} may vary)"))

    def _type_reason(self, path: str, value: Any) -> str:
        return (f"argument {path} is not a {self._ops.array_type.__name__} (got "
                f"{self._ops.describe(value)})")

    def fallback(self, args: tuple, key: str, message: str) -> Any:
        """Serve a call no bucket serves: the one fallback path of the family.

        With ``strict`` it raises :class:`ReplayError` with ``message``; otherwise it counts
        the call under the first word of ``key`` (``stats().fallbacks``), warns once per
        ``key`` and runs the eager function on ``args``. A front end that refuses a call for
        a reason of its own (the torch adapter: a changed ``training`` flag) calls this.
        """
        kind = key.split(" ", 1)[0]
        if self._family.strict:
            raise ReplayError(f"{message}; pass arguments the buckets serve, or add a bucket "
                              f"(strict=True)")
        self._fallbacks[kind] = self._fallbacks.get(kind, 0) + 1
        self._eager_calls += 1
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{self._family.name}: {message}; running eagerly (this warning is shown "
                          f"once per reason)", UserWarning, stacklevel=3)
        return self._eager(*args)

    # -- introspection ---------------------------------------------------------------------

    def stats(self) -> BucketStats:
        """Per-bucket counters, eager fallbacks by reason, and the shared pool's stats."""
        pool: PoolStats = self.pool.stats()
        return BucketStats(
            buckets=tuple(BucketStat(
                size=b.size, captured=b.entry is not None, calls=b.use.calls, captures=b.captures,
                evictions=b.evictions, padded_rows=b.use.padded_rows,
                capture_seconds=b.capture_seconds, reserved_growth_bytes=b.growth_bytes,
                shared_bytes=b.shared_bytes, exec_bytes=b.exec_bytes,
                warm_retries=b.cold_failures,
            ) for b in self._table),
            eager_calls=self._eager_calls,
            fallbacks=dict(self._fallbacks),
            memory_budget=self._budget,
            pool=pool,
            predicted_reserved_bytes=self._predicted,
            shares_outputs=self._shares_outputs,
            exec_bytes=sum(b.exec_bytes or 0 for b in self._table if b.entry is not None),
        )

    def __repr__(self) -> str:
        captured = sum(b.entry is not None for b in self._table)
        return (f"<{type(self).__name__} of {self._family.name}: buckets {list(self.buckets)}, "
                f"{captured} captured, pool {self.pool.id}>")


"""The shape-bucket machinery on NumPy arrays and a fake-backed pool (no GPU needed).

``Bucketed`` only needs an ArrayOps and a capture function. Here the "graph" of a bucket is
the function itself, replayed on the bucket's static buffers and written into static outputs
that were allocated at capture time, so every property of the call path (which bucket runs,
what the static buffers hold, padding, output views, fallbacks, eviction under a budget) is
checked against NumPy on the unpadded input.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cugraphrt import BucketStats, MemPool, OptionsError, ReplayError
from cugraphrt._callables.buckets import Bucketed, CapturedBucket, resolve_buckets
from cugraphrt.adapter import checked_sizes, doubling, stepping

from .fakes import FakeBackingAllocator

STREAM = 0x77


class NumpyOps:
    array_type = np.ndarray

    @staticmethod
    def describe(value):
        if isinstance(value, np.ndarray):
            return f"shape {value.shape} {value.dtype}"
        return f"{type(value).__name__} {value!r}"

    @staticmethod
    def empty(like, shape):
        return np.full(shape, np.nan, dtype=like.dtype)  # garbage that would show if read

    @staticmethod
    def is_contiguous(array):
        return array.flags.c_contiguous

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def fill(rows, value):
        rows.fill(value)

    @staticmethod
    def clone(array):
        return array.copy()


class Recorder:
    """A capture function: each bucket's "graph" replays ``fn`` on its static arguments.

    Each capture takes ``scratch_bytes`` from the pool like a real capture's temporaries (freed
    before the capture ends) and keeps ``out_bytes`` alive as its outputs' memory.
    """

    def __init__(self, fn, pool, scratch_bytes=0, out_bytes=512):
        self.fn, self.pool = fn, pool
        self.scratch_bytes, self.out_bytes = scratch_bytes, out_bytes
        self.captured: list[int] = []  # bucket sizes, in capture order
        self.seen: list[tuple] = []  # the static arguments each replay read

    def __call__(self, args, pool, warm=True):
        assert pool is self.pool  # the bucketed callable captures into its own pool
        size = args[0].shape[0]
        self.captured.append(size)
        token = object()
        pool._begin_capture(token)
        scratch = pool._allocate(self.scratch_bytes, STREAM, token) if self.scratch_bytes else None
        out_bytes = self.out_bytes(size) if callable(self.out_bytes) else self.out_bytes
        memory = pool._allocate(out_bytes, STREAM, token)
        del scratch
        seq = pool._add_graph()
        pool._end_capture(token, True)
        result = self.fn(*args)
        outputs = tuple(np.empty_like(r) for r in result) if isinstance(result, tuple) \
            else np.empty_like(result)

        def replay():
            self.seen.append(tuple(a.copy() for a in args if isinstance(a, np.ndarray)))
            fresh = self.fn(*args)
            if isinstance(outputs, tuple):
                for o, f in zip(outputs, fresh, strict=True):
                    np.copyto(o, f)
            else:
                np.copyto(outputs, fresh)

        holder = [memory, seq]

        def release():
            if holder:
                holder.clear()
                pool._remove_graph(seq)

        return CapturedBucket(replay, outputs, release)


def rowwise(x, w):
    return np.tanh(x @ w), (x * 2).sum(axis=1)


def make(fn=rowwise, sample=None, scratch_bytes=0, out_bytes=512, **options):
    rng = np.random.default_rng(0)
    if sample is None:
        sample = (rng.standard_normal((8, 4)), rng.standard_normal((4, 3)))
    pool = MemPool(backing=FakeBackingAllocator())
    recorder = Recorder(fn, pool, scratch_bytes=scratch_bytes, out_bytes=out_bytes)
    options.setdefault("buckets", "pow2")
    options.setdefault("dynamic_dim", (0, None))
    bucketed = Bucketed(ops=NumpyOps(), sample_args=sample, pad=options.pop("pad", 0),
                        memory_budget=options.pop("memory_budget", None),
                        strict=options.pop("strict", False), pool=pool,
                        copy_outputs=options.pop("copy_outputs", False), capture=recorder,
                        eager=fn, name=fn.__name__, **options)
    return bucketed, recorder, sample


def test_resolve_buckets():
    assert resolve_buckets("pow2", 8) == (1, 2, 4, 8)
    assert resolve_buckets("pow2", 12) == (1, 2, 4, 8, 12)
    assert resolve_buckets("pow2", 1) == (1,)
    assert resolve_buckets([3, 5, 40], 8) == (3, 5, 40)
    for bad in ([], [4, 2], [2, 2], [0, 4], [1.5], "pow3", 8):
        with pytest.raises(OptionsError, match="buckets"):
            resolve_buckets(bad, 8)


def test_one_rule_for_lists_of_sizes():
    # What resolve_buckets and the torch Generator check a list with (cugraphrt.adapter).
    assert checked_sizes("cache_buckets", [16, 24, 64]) == (16, 24, 64)
    with pytest.raises(OptionsError, match="strictly increasing") as info:
        checked_sizes("batch_buckets", (4, 2, 1))
    assert info.value.field == "batch_buckets"
    # "pow2" is doubling from 1: every power of two up to the sample size, then the size.
    for n in range(1, 70):
        assert resolve_buckets("pow2", n) == doubling(1, n)
        expected = [1 << k for k in range(n.bit_length()) if 1 << k < n] + [n]
        assert list(doubling(1, n)) == expected
    assert doubling(16, 300) == (16, 32, 64, 128, 256, 300)
    assert stepping(64, 272) == (64, 128, 192, 256, 272)
    assert stepping(64, 64) == (64,)


def test_every_size_equals_numpy_on_the_unpadded_input():
    bucketed, recorder, (_, w) = make()
    rng = np.random.default_rng(1)
    for n in [3, 8, 1, 5, 2, 7, 4, 6, 8, 1]:
        x = rng.standard_normal((n, 4))
        y, s = bucketed(x, w)
        ey, es = rowwise(x, w)
        assert y.shape == (n, 3) and s.shape == (n,)
        np.testing.assert_allclose(y, ey, rtol=0, atol=0)
        np.testing.assert_allclose(s, es, rtol=0, atol=0)
    assert sorted(recorder.captured) == [1, 2, 4, 8]  # lazily, one capture per bucket
    stats = bucketed.stats()
    assert [b.calls for b in stats.buckets] == [2, 1, 2, 5]
    assert [b.padded_rows for b in stats.buckets] == [0, 0, 1, 0 + 3 + 1 + 2 + 0]
    assert stats.eager_calls == 0 and stats.pool.live_graphs == 4


def test_pad_rows_hold_the_pad_value_whenever_a_bucket_replays():
    bucketed, recorder, (_, w) = make(pad=0.5)
    rng = np.random.default_rng(2)
    for n in [8, 5, 7, 3, 6, 5]:
        bucketed(rng.standard_normal((n, 4)), w)
        x_read = recorder.seen[-1][0]
        bucket = x_read.shape[0]
        assert not np.isnan(x_read).any()
        assert (x_read[n:bucket] == 0.5).all(), f"stale rows leaked into bucket {bucket}"


def test_pad_callable_fills_rows_in_place_and_gets_the_path():
    calls = []

    def pad(rows, path):
        calls.append((path, rows.shape))
        rows[...] = -1.0

    bucketed, recorder, (_, w) = make(pad=pad)
    x = np.ones((3, 4))
    bucketed(x, w)
    assert calls[-1] == ("args[0]", (1, 4))
    assert (recorder.seen[-1][0][3:] == -1).all()


def test_outputs_are_views_valid_until_the_next_call():
    bucketed, _, (_, w) = make()
    y, _ = bucketed(np.ones((3, 4)), w)
    again, _ = bucketed(np.ones((3, 4)), w)
    assert again is y, "views are cached per size: no allocation on the call path"
    assert np.shares_memory(y, bucketed._table[2].entry.outputs[0])


def test_output_dims_cut_exactly_the_outputs_named_and_in_their_own_dimension():
    # An output of 4 rows (a bucket size) that does not carry the batch, and one that
    # carries it in dimension 1: the default would cut the first and miss the second.
    def fn(x, w):
        return (x @ w).T.copy(), w @ np.ones((3, 3))

    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3))
    bucketed, _, _ = make(fn=fn, sample=(rng.standard_normal((8, 4)), w),
                          output_dims=(1, None))
    x = rng.standard_normal((3, 4))
    by_batch, fixed = bucketed(x, w)
    expected_by_batch, expected_fixed = fn(x, w)
    assert by_batch.shape == (3, 3) and fixed.shape == (4, 3)
    np.testing.assert_allclose(by_batch, expected_by_batch)
    np.testing.assert_allclose(fixed, expected_fixed)


def test_copy_outputs_returns_fresh_arrays():
    bucketed, _, (_, w) = make(copy_outputs=True)
    y1, _ = bucketed(np.ones((3, 4)), w)
    y2, _ = bucketed(np.zeros((3, 4)), w)
    assert not np.shares_memory(y1, y2) and (y1 != y2).any()


@pytest.mark.parametrize("case, reason, match", [
    ((np.ones((9, 4)),), "above", "above the largest bucket 8"),
    ((np.ones((3, 4), dtype=np.float32),), "dtype", "dtype float32"),
    ((np.ones((3, 5)),), "shape", r"only dimension 0 may vary"),
    ((np.ones((0, 4)),), "empty", "empty batch"),
    (([1.0, 2.0],), "type", "is not a ndarray"),
])
def test_outside_the_buckets_runs_eagerly_once_warned_or_raises_when_strict(case, reason, match):
    bucketed, _, (_, w) = make(fn=lambda x, w: x.sum(axis=-1) if isinstance(x, np.ndarray)
                               else sum(x))
    with pytest.warns(UserWarning, match=match):
        first = bucketed(case[0], w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        second = bucketed(case[0], w)
    expected = np.asarray(case[0]).sum(axis=-1)
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(second, expected)
    stats = bucketed.stats()
    assert stats.fallbacks == {reason: 2} and stats.eager_calls == 2
    strict, _, _ = make(fn=lambda x, w: x, strict=True)
    with pytest.raises(ReplayError, match=match):
        strict(case[0], w)


def test_dynamic_arguments_must_agree_in_size():
    def total(a, b):
        return a.sum(axis=0) + b.sum(axis=0)

    sample = (np.zeros((4, 2)), np.zeros((4, 2)))
    bucketed, _, _ = make(fn=total, sample=sample, dynamic_dim=0)
    a, b = np.ones((3, 2)), np.full((2, 2), 5.0)
    with pytest.warns(UserWarning, match=r"disagree in size \(got args\[0\] with 3 rows and "
                      r"args\[1\] with 2\)"):
        out = bucketed(a, b)
    np.testing.assert_array_equal(out, total(a, b))
    with pytest.raises(OptionsError, match="same size in the dynamic dimension"):
        make(fn=total, sample=(np.zeros((4, 2)), np.zeros((3, 2))), dynamic_dim=0)


def test_a_non_dynamic_argument_is_copied_into_its_static_buffer():
    bucketed, _, (_, w) = make()
    w2 = w * 3
    x = np.ones((2, 4))
    y, _ = bucketed(x, w2)
    np.testing.assert_allclose(y, np.tanh(x @ w2))
    assert (bucketed._family.statics[0][1] == w2).all()


def test_dynamic_dim_one_gives_strided_buckets_their_own_contiguous_buffers():
    def scale(x):
        assert x.flags.c_contiguous
        return x * 2

    sample = (np.arange(24.0).reshape(3, 8),)
    bucketed, recorder, _ = make(fn=scale, sample=sample, dynamic_dim=1)
    rng = np.random.default_rng(3)
    for n in [5, 8, 3, 5]:
        x = rng.standard_normal((3, n))
        out = bucketed(x)
        np.testing.assert_array_equal(out, x * 2)
        read = recorder.seen[-1][0]
        assert (read[:, n:] == 0).all()


def test_capture_all_goes_largest_first_and_reports_progress_off_the_tty():
    bucketed, recorder, _ = make(sample=(np.zeros((12, 4)), np.zeros((4, 3))))
    bucketed.capture_all(progress=False)
    assert recorder.captured == [12, 8, 4, 2, 1]
    bucketed.capture_all()
    assert recorder.captured == [12, 8, 4, 2, 1], "captured buckets are not captured again"


def test_memory_budget_evicts_least_recently_used_and_recaptures_on_demand():
    # Bucket b keeps b * 2 MiB alive as its outputs: each graph holds a segment of its own.
    mib = 1 << 20
    budget = 20 * mib
    bucketed, recorder, (_, w) = make(out_bytes=lambda size: size * 2 * mib,
                                      memory_budget=budget)
    rng = np.random.default_rng(4)
    for n, captured_after in [(8, {8}), (4, {4}), (2, {4, 2}), (1, {4, 2, 1}), (7, {1, 8}),
                              (3, {4}), (3, {4})]:
        x = rng.standard_normal((n, 4))
        y, _ = bucketed(x, w)
        np.testing.assert_allclose(y, np.tanh(x @ w), rtol=0, atol=0)
        stats = bucketed.stats()
        assert {b.size for b in stats.buckets if b.captured} == captured_after
        assert stats.pool.reserved_bytes <= budget, "over budget between calls"
    assert recorder.captured == [8, 4, 2, 1, 8, 4]
    evictions = {b.size: b.evictions for b in bucketed.stats().buckets}
    assert evictions == {1: 1, 2: 1, 4: 1, 8: 2}
    assert bucketed.stats().eager_calls == 0


def test_a_bucket_alone_over_the_budget_runs_eagerly_with_the_reason():
    mib = 1 << 20
    bucketed, recorder, (_, w) = make(out_bytes=lambda size: size * 2 * mib,
                                      memory_budget=5 * mib)
    x = np.ones((2, 4))
    bucketed(x, w)  # bucket 2: 4 MiB fits
    with pytest.warns(UserWarning, match=r"bucket 4 alone needs more pool memory than "
                      r"memory_budget=5242880 bytes"):
        y, _ = bucketed(np.ones((3, 4)), w)
    np.testing.assert_allclose(y, np.tanh(np.ones((3, 4)) @ w))
    bucketed(np.ones((3, 4)), w)
    # captured once more on its own (as torch needs), then never again
    assert recorder.captured == [2, 4, 4], "an over-budget bucket is captured again and again"
    stats = bucketed.stats()
    assert stats.fallbacks == {"budget": 2}
    assert stats.pool.reserved_bytes <= 5 * mib


def test_release_and_stats_table():
    bucketed, recorder, (_, w) = make()
    bucketed(np.ones((3, 4)), w)
    bucketed.release(4)
    assert not bucketed.stats().buckets[2].captured
    bucketed(np.ones((3, 4)), w)
    assert recorder.captured == [4, 4]
    stats = bucketed.stats()
    assert isinstance(stats, BucketStats)
    assert stats.buckets[2].captures == 2 and stats.buckets[2].evictions == 1
    text = str(stats)
    assert "bucket" in text.splitlines()[0] and "eager calls: 0 (none)" in text
    with pytest.raises(OptionsError, match="one of the buckets"):
        bucketed.release(3)


@pytest.mark.parametrize("options, field", [
    ({"memory_budget": 0}, "memory_budget"),
    ({"memory_budget": 1.5}, "memory_budget"),
    ({"pad": "zero"}, "pad"),
    ({"dynamic_dim": -1}, "dynamic_dim"),
    ({"dynamic_dim": (0,)}, "dynamic_dim"),
    ({"dynamic_dim": 5}, "dynamic_dim"),
])
def test_bad_options(options, field):
    with pytest.raises(OptionsError, match=field):
        make(**options)


class SharingOps(NumpyOps):
    """NumpyOps that can alias an output without owning it (``unowned``), and note it."""

    def __init__(self):
        self.kept = []

    def unowned(self, array, keep):
        self.kept.append(keep)
        return array.view()


class KeepingRecorder(Recorder):
    """A Recorder whose captures say what keeps their outputs' memory."""

    def __call__(self, args, pool, warm=True):
        entry = super().__call__(args, pool, warm)
        entry.memory = ("memory of bucket", args[0].shape[0])
        return entry


def make_sharing(share_outputs=True, **options):
    rng = np.random.default_rng(0)
    sample = (rng.standard_normal((8, 4)), rng.standard_normal((4, 3)))
    pool = MemPool(backing=FakeBackingAllocator())
    recorder = KeepingRecorder(rowwise, pool, scratch_bytes=4 << 20, out_bytes=2 << 20)
    ops = SharingOps()
    bucketed = Bucketed(ops=ops, sample_args=sample, buckets="pow2", dynamic_dim=(0, None),
                        pad=0, memory_budget=options.pop("memory_budget", None), strict=False,
                        pool=pool, copy_outputs=False, capture=recorder, eager=rowwise,
                        name="rowwise", share_outputs=share_outputs, **options)
    return bucketed, recorder, ops, sample


def test_shared_outputs_are_unowned_aliases_and_one_capture_number():
    bucketed, recorder, ops, sample = make_sharing()
    bucketed.capture_all(progress=False)
    assert recorder.captured == [8, 4, 2, 1]
    # Every output leaf went through unowned, kept by what its capture named.
    assert ops.kept == [("memory of bucket", s) for s in (8, 8, 4, 4, 2, 2, 1, 1)]
    seqs = {b.entry.seq for b in bucketed._table}
    assert seqs == {bucketed._family_seq}  # any bucket's replay settles every bucket's outputs
    assert bucketed.stats().shares_outputs
    for n in (8, 3, 1, 6):
        x = np.random.default_rng(n).standard_normal((n, 4))
        got = bucketed(x, sample[1])
        want = rowwise(x, sample[1])
        np.testing.assert_allclose(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1])


def test_a_given_pool_keeps_outputs_per_bucket():
    bucketed, recorder, ops, _ = make_sharing(share_outputs=None)  # a pool was given
    bucketed.capture_all(progress=False)
    assert ops.kept == [] and not bucketed.stats().shares_outputs
    assert bucketed._family_seq is None  # each bucket keeps the capture number it got


def test_predict_captures_the_largest_only_and_reads_the_pool():
    bucketed, recorder, _, _ = make_sharing()
    predicted = bucketed.predict_reserved_bytes()
    assert recorder.captured == [8]
    assert predicted == bucketed.pool.stats().reserved_bytes > 0
    bucketed.capture_all(progress=False)
    stats = bucketed.stats()
    assert stats.predicted_reserved_bytes == predicted
    assert recorder.captured == [8, 4, 2, 1]
    by_size = {b.size: b for b in stats.buckets}
    assert by_size[8].shared_bytes == 0 and by_size[8].reserved_growth_bytes == predicted
    assert all(by_size[s].shared_bytes >= predicted for s in (4, 2, 1))
    text = str(stats)
    assert "private" in text and "shared" in text
    assert f"predicted reservation {predicted / (1 << 20):.2f} MiB" in text


def test_predict_raises_when_the_largest_alone_exceeds_the_budget():
    bucketed, recorder, _, _ = make_sharing(memory_budget=1 << 20)
    with pytest.raises(ReplayError, match="largest bucket 8 alone needs more pool memory"):
        bucketed.predict_reserved_bytes()


def test_only_the_first_capture_warms_up_and_a_failed_cold_one_is_retried_warm():
    bucketed, recorder, _, sample = make_sharing()
    warms = []
    inner = recorder.__call__

    def capture(args, pool, warm):
        warms.append((args[0].shape[0], warm))
        if args[0].shape[0] == 2 and not warm:
            raise RuntimeError("this size must run eagerly once first")
        return inner(args, pool, warm)

    bucketed._capture_fn = capture
    bucketed.capture_all(progress=False)
    assert warms == [(8, True), (4, False), (2, False), (2, True), (1, False)]
    retries = {b.size: b.warm_retries for b in bucketed.stats().buckets}
    assert retries == {1: 0, 2: 1, 4: 0, 8: 0}
    x = np.random.default_rng(3).standard_normal((2, 4))
    np.testing.assert_allclose(bucketed(x, sample[1])[0], rowwise(x, sample[1])[0])


def test_a_cold_capture_out_of_pool_memory_is_not_retried():
    from cugraphrt.errors import PoolOutOfMemoryError

    bucketed, recorder, _, _ = make_sharing()
    inner = recorder.__call__
    calls = []

    def capture(args, pool, warm):
        calls.append(warm)
        if not warm:
            raise PoolOutOfMemoryError(1 << 20, 0, 0, 1 << 30)
        return inner(args, pool, warm)

    bucketed._capture_fn = capture
    bucketed.predict_reserved_bytes()
    with pytest.raises(PoolOutOfMemoryError):
        bucketed.capture_all(progress=False)
    assert calls == [True, False]


def test_a_two_argument_capture_is_called_without_warm():
    # An adapter written before ``warm`` existed: capture(args, pool), warming up itself.
    bucketed, recorder, _, sample = make_sharing()
    inner = recorder.__call__
    seen = []

    def capture(args, pool):
        seen.append(args[0].shape[0])
        return inner(args, pool)

    bucketed._capture_fn = capture
    bucketed._takes_warm = False  # as the constructor finds for such a callback
    bucketed.capture_all(progress=False)
    assert seen == [8, 4, 2, 1]
    x = np.random.default_rng(5).standard_normal((3, 4))
    np.testing.assert_allclose(bucketed(x, sample[1])[0], rowwise(x, sample[1])[0])


def test_the_constructor_reads_whether_capture_takes_warm():
    from cugraphrt._callables.bucket_table import takes_warm as _takes_three

    assert _takes_three(lambda args, pool, warm: None)
    assert _takes_three(lambda args, pool, warm=True: None)
    assert _takes_three(lambda *a: None)
    assert not _takes_three(lambda args, pool: None)

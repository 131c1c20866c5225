"""make_graphed with shape buckets: one CuPy callable for every batch size."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import BucketedFunction, ReplayError, make_graphed

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def mlp(x, w1, w2):
    return cupy.tanh(x @ w1) @ w2, (x * x).sum(axis=1)


def test_every_size_of_every_bucket_equals_eager_on_the_unpadded_input(randn):
    w1, w2 = randn((64, 128)), randn((128, 16))
    fn = make_graphed(mlp, (randn((16, 64)), w1, w2), buckets="pow2", dynamic_dim=(0, None, None))
    assert isinstance(fn, BucketedFunction) and fn.buckets == (1, 2, 4, 8, 16)
    sizes = list(range(1, 17)) + list(range(16, 0, -1)) + [3, 16, 1, 9]
    for n in sizes:
        x = randn((n, 64))
        y, s = fn(x, w1, w2)
        ey, es = mlp(x, w1, w2)
        assert y.shape == (n, 16) and s.shape == (n,)
        cupy.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-4)
        cupy.testing.assert_allclose(s, es, rtol=1e-5, atol=1e-5)
    stats = fn.stats()
    assert [b.captures for b in stats.buckets] == [1] * 5
    assert sum(b.calls for b in stats.buckets) == len(sizes) and stats.eager_calls == 0
    # One pool for every bucket: its graphs are all alive in it.
    assert stats.pool.live_graphs == 5 and fn.pool.stats().pool_id == stats.pool.pool_id


def test_pad_rows_never_leak_and_hold_the_pad_value(randn):
    statics = {}

    def spy(x):
        statics[x.shape[0]] = x  # the bucket's static buffer (captured calls see it)
        return x * 3

    fn = make_graphed(spy, (randn((8, 5)),), buckets=[2, 8], pad=-7.0, num_warmup_iters=0)
    for n in (8, 3, 7, 2, 5, 1):
        x = randn((n, 5))
        out = fn(x)
        cupy.testing.assert_array_equal(out, x * 3)
        static = statics[2 if n <= 2 else 8]
        cupy.testing.assert_array_equal(static[:n], x)
        assert bool((static[n:] == -7.0).all()), f"rows past {n} are not padded"


def test_a_pad_value_makes_a_reduction_over_rows_correct(randn):
    # The minimum over the batch is not row-independent: pad with +inf and it is exact.
    fn = make_graphed(lambda x: x.min(axis=0), (randn((16, 32)),), buckets="pow2",
                      pad=float("inf"))
    for n in (3, 16, 5, 1, 12):
        x = randn((n, 32))
        cupy.testing.assert_array_equal(fn(x), x.min(axis=0))


def test_a_pad_callable_writes_a_mask_so_a_masked_mean_is_exact(randn):
    def masked_mean(x, mask):
        return (x * mask[:, None]).sum(axis=0) / mask.sum()

    def pad(rows, path):
        rows[...] = 0 if path == "args[1]" else 1e6  # huge rows, masked out

    sample = (randn((8, 4)), cupy.ones(8, dtype=cupy.float32))
    fn = make_graphed(masked_mean, sample, buckets=[8], pad=pad)
    for n in (8, 3, 6):
        x, mask = randn((n, 4)), cupy.ones(n, dtype=cupy.float32)
        cupy.testing.assert_allclose(fn(x, mask), x.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_buckets_share_one_pool_and_reserve_about_the_largest_alone(randn):
    w1, w2 = randn((256, 1024)), randn((1024, 256))
    sample = (randn((64, 256)), w1, w2)
    alone = make_graphed(mlp, sample, buckets=[64], dynamic_dim=(0, None, None))
    alone.capture_all(progress=False)
    largest = alone.pool.stats().reserved_bytes
    every = make_graphed(mlp, sample, buckets="pow2", dynamic_dim=(0, None, None))
    every.capture_all(progress=False)
    stats = every.stats()
    assert stats.pool.live_graphs == 7
    assert stats.pool.reserved_bytes <= 1.3 * largest, (stats.pool.reserved_bytes, largest)
    print(f"reserved: all 7 buckets {stats.pool.reserved_bytes / MIB:.1f} MiB, "
          f"largest alone {largest / MIB:.1f} MiB")


def wide(x, w):
    # An output of n * 256 KiB: every bucket's graph keeps a large segment of its own.
    return (x[:, :, None] * w[None]).reshape(x.shape[0], -1)


def test_memory_budget_evicts_and_recaptures_correctly(randn):
    w = randn((64, 1024))
    sample = (randn((32, 64)), w)
    # Given pools: each bucket keeps its outputs (a family with a pool of its own shares them,
    # and all three buckets would fit: test_shared_outputs_... below).
    full = make_graphed(wide, sample, buckets=[8, 16, 32], dynamic_dim=(0, None),
                        pool=cugraphrt.graph_pool_handle())
    full.capture_all(progress=False)
    all_bytes = full.pool.stats().reserved_bytes
    del full
    budget = all_bytes * 2 // 3
    fn = make_graphed(wide, sample, buckets=[8, 16, 32], dynamic_dim=(0, None),
                      memory_budget=budget, pool=cugraphrt.graph_pool_handle())
    for n in (30, 12, 5, 31, 7, 16, 2, 20):
        x = randn((n, 64))
        cupy.testing.assert_array_equal(fn(x, w), wide(x, w))
        assert fn.pool.stats().reserved_bytes <= budget
    stats = fn.stats()
    assert sum(b.evictions for b in stats.buckets) >= 2
    assert sum(b.captures for b in stats.buckets) >= 5, "evicted buckets were captured again"
    assert stats.eager_calls == 0


def test_outside_the_buckets_falls_back_with_the_reason_or_raises_when_strict(randn):
    fn = make_graphed(lambda x: x + 1, (randn((4, 3)),), buckets="pow2")
    for value, match in ((randn((5, 3)), "above the largest bucket 4"),
                         (randn((2, 6)), "only dimension 0 may vary"),
                         (randn((2, 3), dtype=np.float64), "dtype float64")):
        with pytest.warns(UserWarning, match=match):
            cupy.testing.assert_array_equal(fn(value), value + 1)
    assert fn.stats().fallbacks == {"above": 1, "shape": 1, "dtype": 1}
    strict = make_graphed(lambda x: x + 1, (randn((4, 3)),), buckets="pow2", strict=True)
    with pytest.raises(ReplayError, match="above the largest bucket 4"):
        strict(randn((5, 3)))


def test_progress_bar_and_stats_table(randn, capsys):
    fn = make_graphed(lambda x: x * 2, (randn((8, 3)),), buckets="pow2")
    fn.capture_all(progress=True)
    assert "capturing" in capsys.readouterr().err
    fn(randn((3, 3)))
    text = str(fn.stats())
    assert text.splitlines()[0].split()[:2] == ["bucket", "captured"]
    assert "eager calls: 0 (none)" in text and f"pool {fn.pool.id}" in text


def test_pool_checks_do_not_flag_bucket_graphs_replayed_in_any_order(randn):
    cugraphrt.set_pool_checks(True)
    fn = make_graphed(lambda x: x - 1, (randn((8, 3)),), buckets="pow2")
    for n in (8, 1, 4, 2, 8, 3):
        x = randn((n, 3))
        cupy.testing.assert_array_equal(fn(x), x - 1)


def test_shared_outputs_predicted_reservation_and_lifetimes(randn):
    # A CuPy family with a pool of its own shares its outputs' memory: the pool reserves what
    # the largest bucket does, predicted before the other buckets are captured.
    w = randn((64, 1024))
    sample = (randn((32, 64)), w)
    alone = make_graphed(wide, sample, buckets=[32], dynamic_dim=(0, None))
    alone.capture_all(progress=False)
    largest = alone.pool.stats().reserved_bytes
    del alone
    fn = make_graphed(wide, sample, buckets=[8, 16, 24, 32], dynamic_dim=(0, None))
    predicted = fn.predict_reserved_bytes()
    fn.capture_all(progress=False)
    stats = fn.stats()
    assert stats.shares_outputs and stats.predicted_reserved_bytes == predicted
    assert abs(stats.pool.reserved_bytes / predicted - 1) <= 0.05
    assert stats.pool.reserved_bytes <= 1.05 * largest
    for n in (30, 12, 5, 31, 7, 16, 2, 20, 32):
        x = randn((n, 64))
        cupy.testing.assert_array_equal(fn(x, w), wide(x, w))
    x = randn((24, 64))
    held = fn(x, w)
    free_with_family = cupy.cuda.runtime.memGetInfo()[0]
    pool = fn.pool
    del fn
    cupy.get_default_memory_pool().free_all_blocks()
    cugraphrt.empty_cache()
    cupy.testing.assert_array_equal(held, wide(x, w))  # readable after the family is gone
    assert pool.stats().live_graphs == 0 and pool.stats().reserved_bytes > 0
    del held
    cugraphrt.empty_cache()
    assert pool.stats().reserved_bytes == 0, "the held segment went back with the output"
    assert cupy.cuda.runtime.memGetInfo()[0] > free_with_family


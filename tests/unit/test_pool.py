"""MemPool lifetime, rollback and stats on a fake backing allocator (no GPU needed).

CuPy's MemoryPointer and UnownedMemory work without a device, so these tests follow real
arrays' memory: a block goes back when its last pointer dies.
"""

from __future__ import annotations

import gc
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cugraphrt
from cugraphrt import CaptureError, MemPool, OptionsError, PoolOrderError, PoolOutOfMemoryError
from cugraphrt._blocks import SMALL_SEGMENT_BYTES
from cugraphrt._replay_order import ReplayOrder

from .fakes import FakeBackingAllocator

STREAM = 0x1234


def capture(pool, sizes, keep=(), succeed=True):
    """Simulate a capture: allocate ``sizes``, keep the pointers at indices ``keep``."""
    token = object()
    pool._begin_capture(token)
    pointers = [pool._allocate(n, STREAM, token) for n in sizes]
    kept = [pointers[i] for i in keep]
    del pointers
    seq = pool._add_graph() if succeed else None
    pool._end_capture(token, succeed)
    return seq, kept


def test_private_pool_keeps_memory_while_graph_lives_then_returns_it():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    seq, kept = capture(pool, [1000, 5 << 20, 2000], keep=[0])
    stats = pool.stats()
    assert stats.live_graphs == 1 and stats.live_arrays == 1
    assert stats.reserved_bytes == SMALL_SEGMENT_BYTES + (6 << 20)
    assert stats.active_bytes == 1024
    assert stats.peak_active_bytes == 1024 + (5 << 20) + 2048
    reserved = stats.reserved_bytes
    del kept
    gc.collect()
    assert pool.stats().reserved_bytes == reserved, "memory left while the graph holds it"
    pool._remove_graph(seq)
    assert pool.stats().reserved_bytes == 0 and backing.live == {}


def test_outputs_outlive_their_graph_and_return_memory_when_they_die():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    seq, kept = capture(pool, [4096, 8192], keep=[1])
    pool._remove_graph(seq)
    assert pool.stats().segments == 1, "an output's segment went back while it was alive"
    assert kept[0].ptr in range(min(backing.live), min(backing.live) + SMALL_SEGMENT_BYTES)
    del kept
    assert backing.live == {}


def test_shared_pool_keeps_cache_until_empty_cache():
    backing = FakeBackingAllocator()
    pool = cugraphrt.MemPool(backing=backing)
    seq, _ = capture(pool, [1 << 20])
    pool._remove_graph(seq)
    assert pool.stats().reserved_bytes == SMALL_SEGMENT_BYTES
    assert pool.empty_cache() == SMALL_SEGMENT_BYTES
    assert backing.live == {}


def test_empty_cache_refuses_while_a_graph_holds_the_pool():
    pool = MemPool(backing=FakeBackingAllocator())
    seq, _ = capture(pool, [1 << 20])
    assert pool.empty_cache() == 0
    assert pool.stats().reserved_bytes == SMALL_SEGMENT_BYTES
    pool._remove_graph(seq)


def test_sharing_reuses_freed_temporaries_of_earlier_graphs():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    capture(pool, [8 << 20, 1 << 20], keep=[1])  # a large temporary and a kept output
    first_reserved = pool.stats().reserved_bytes
    capture(pool, [8 << 20], keep=[])
    assert pool.stats().reserved_bytes == first_reserved, "second graph did not reuse"


def test_failed_capture_rolls_back_to_baseline():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    capture(pool, [4096], keep=[0])
    baseline = pool.stats()
    _, alive = capture(pool, [3 << 20, 100, 7 << 20], keep=[1], succeed=False)
    after = pool.stats()
    # The still-referenced array keeps its segment until it dies; everything else is back.
    alive_segment = alive[0].mem._owner.block.segment
    assert after.reserved_bytes <= baseline.reserved_bytes + alive_segment.size
    assert after.segments <= baseline.segments + 1
    assert after.live_arrays == baseline.live_arrays + 1
    assert after.peak_active_bytes == baseline.peak_active_bytes
    del alive
    assert pool.stats() == baseline


def test_failed_capture_array_in_a_new_segment_returns_it_when_dropped():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    baseline = pool.stats()
    _, alive = capture(pool, [5 << 20], keep=[0], succeed=False)
    assert pool.stats().reserved_bytes == 6 << 20
    del alive
    # The array really was active until it died, so only the high-water mark remembers it.
    after = pool.stats().model_copy(update={"peak_active_bytes": 0})
    assert after == baseline and backing.live == {}


def test_out_of_memory_reports_sizes():
    backing = FakeBackingAllocator(capacity=8 << 20)
    pool = MemPool(backing=backing)
    token = object()
    pool._begin_capture(token)
    first = pool._allocate(4 << 20, STREAM, token)
    with pytest.raises(PoolOutOfMemoryError) as info:
        pool._allocate(6 << 20, STREAM, token)
    error = info.value
    assert isinstance(error, MemoryError)
    assert error.requested_bytes == 6 << 20
    assert error.reserved_bytes == 4 << 20
    assert (error.device_free_bytes, error.device_total_bytes) == (4 << 20, 8 << 20)
    assert "6.00 MiB" in str(error) and "rolled back" in str(error)
    del first
    pool._end_capture(token, False)
    assert pool.stats().reserved_bytes == 0


def test_concurrent_captures_into_one_pool_are_refused():
    pool = MemPool(backing=FakeBackingAllocator())
    pool._begin_capture(object())
    with pytest.raises(CaptureError, match="concurrent capture"):
        pool._begin_capture(object())


def test_release_during_pool_operation_is_deferred_not_lost():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    seq, kept = capture(pool, [4096], keep=[0])
    block = kept[0].mem._owner.block
    with pool._lock:  # as if a garbage collection ran inside a pool operation
        kept[0].mem._owner.pool = None  # detach the lease, release by hand below
        pool._release_block(block)
        assert pool._pending_frees, "release should wait for the lock holder"
    assert pool.stats().live_arrays == 0
    pool._remove_graph(seq)
    assert backing.live == {}


def test_bad_backing_allocator_is_rejected():
    class Old:
        interface_version = 0
        device_id = 0

    with pytest.raises(OptionsError, match="interface_version"):
        MemPool(backing=Old())


def test_memory_summary_lists_pools():
    pool = MemPool(backing=FakeBackingAllocator())
    seq, kept = capture(pool, [1 << 20], keep=[0])
    table = cugraphrt.memory_summary()
    assert f"\n{'':>0}" in table and "shared" in table
    row = [line for line in table.splitlines() if line.strip().startswith(str(pool.id))]
    assert row and "2.00 MiB" in row[0]
    pool._remove_graph(seq)


def test_empty_cache_covers_all_idle_pools():
    pools = [MemPool(backing=FakeBackingAllocator()) for _ in range(3)]
    for pool in pools:
        seq, _ = capture(pool, [1 << 20])
        pool._remove_graph(seq)
    assert cugraphrt.empty_cache() >= 3 * SMALL_SEGMENT_BYTES
    assert all(p.stats().reserved_bytes == 0 for p in pools)


def test_pool_memory_goes_back_when_the_pool_dies():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    seq, _ = capture(pool, [1 << 20])
    pool._remove_graph(seq)
    del pool
    gc.collect()
    assert backing.live == {}


class TestReplayOrder:
    def order(self, n):
        order = ReplayOrder()
        seqs = [order.add() for _ in range(n)]
        return order, seqs

    def test_capture_order_rounds_and_repeats_pass(self):
        order, (a, b, c) = self.order(3)
        for seq in (a, b, c, a, a, b, b, c, a):
            order.check(1, seq, STREAM)
            order.last, order.last_stream = seq, STREAM

    @pytest.mark.parametrize("first,second", [(2, 1), (0, 2), (1, 3), (3, 2)])
    def test_out_of_order_is_refused(self, first, second):
        order, seqs = self.order(4)
        order.last, order.last_stream = seqs[first], STREAM
        with pytest.raises(PoolOrderError, match="out-of-order"):
            order.check(7, seqs[second], STREAM)

    def test_single_graph_is_never_checked(self):
        order, (a,) = self.order(1)
        order.last = a
        order.check(1, a, STREAM)

    def test_removed_graph_leaves_the_order(self):
        order, (a, b, c) = self.order(3)
        order.remove(b)
        order.last, order.last_stream = a, STREAM
        order.check(1, c, STREAM)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "drop", "capture_ok", "capture_fail",
                                           "reset", "empty"]),
                          st.integers(1, 4 << 20)), max_size=40),
       st.booleans())
def test_pool_accounts_add_up_after_any_sequence(ops, private):
    backing = FakeBackingAllocator(capacity=256 << 20)
    pool = MemPool(backing=backing, _private=private)
    arrays, graphs = [], []
    for op, n in ops:
        if op == "alloc" or op.startswith("capture"):
            ok = op != "capture_fail"
            try:
                seq, kept = capture(pool, [n, n // 2 + 1], keep=[0], succeed=ok)
            except PoolOutOfMemoryError:
                continue
            arrays.extend(kept)
            del kept
            if ok:
                graphs.append(seq)
        elif op == "drop" and arrays:
            arrays.pop(n % len(arrays))
        elif op == "reset" and graphs:
            pool._remove_graph(graphs.pop(n % len(graphs)))
        elif op == "empty":
            released = pool.empty_cache()
            assert released == 0 or not graphs
        stats = pool.stats()
        pool._arena.check_invariants()
        assert stats.reserved_bytes == backing.used
        assert stats.live_arrays == len(arrays)
        assert stats.live_graphs == len(graphs)
        assert stats.active_bytes == sum(p.mem.size for p in arrays)
        spans = sorted((p.ptr, p.ptr + p.mem.size) for p in arrays)
        assert all(e <= s for (_, e), (s, _) in pairwise(spans)), "live blocks overlap"
        if private and not graphs:
            # an idle private pool holds exactly the segments its live arrays need
            assert stats.segments == len({p.mem._owner.block.segment.ptr for p in arrays})
    arrays.clear()
    for seq in graphs:
        pool._remove_graph(seq)
    pool.empty_cache()
    assert backing.live == {}

"""MemPool lifetime, rollback and stats on a fake backing allocator (no GPU needed).

CuPy's MemoryPointer and UnownedMemory work without a device, so these tests follow real
arrays' memory: a block goes back when its last pointer dies.
"""

from __future__ import annotations

import gc
from itertools import pairwise

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cugraphrt
from cugraphrt import CaptureError, MemPool, OptionsError, PoolOrderError, PoolOutOfMemoryError
from cugraphrt._memory.backing import BackingOutOfMemoryError
from cugraphrt._memory.blocks import SMALL_SEGMENT_BYTES
from cugraphrt._memory.replay_order import ReplayOrder

from .fakes import FakeBackingAllocator, assert_out_of_memory_was_due

STREAM = 0x1234
WORKSPACE = ("test-workspace", 0)


def capture(pool, sizes, keep=(), succeed=True, shared=None, touched=None, backing=None):
    """Simulate a capture: allocate ``sizes``, keep the pointers at indices ``keep``.

    ``shared=n`` also asks for the pool's shared block ``WORKSPACE`` of ``n`` bytes;
    ``touched`` (a list) receives the address of every block the capture was handed. An
    allocation that runs out of memory ends the capture as failed (as a real capture is
    rolled back when it raises) after checking, with ``backing``, that the model of the
    pool and the device predicted it.
    """
    token = object()
    pool._begin_capture(token)
    pointers = []
    try:
        for n in sizes:
            pointers.append(pool._allocate(n, STREAM, token))
    except PoolOutOfMemoryError as error:
        if backing is not None:
            assert_out_of_memory_was_due(error, pool, backing, STREAM)
        pointers.clear()
        pool._end_capture(token, False)
        raise
    if touched is not None:
        touched.extend(p.ptr for p in pointers)
    if shared is not None:
        ptr = pool._shared_block(WORKSPACE, shared, STREAM, token)
        if touched is not None:
            touched.append(ptr)
    kept = [pointers[i] for i in keep]
    del pointers
    seq = pool._add_graph() if succeed else None
    pool._end_capture(token, succeed)
    return seq, kept


def segment_of(backing, ptr):
    """The backing allocation holding ``ptr`` (found from the fake's own records)."""
    hits = [base for base, size in backing.live.items() if base <= ptr < base + size]
    assert len(hits) == 1, f"0x{ptr:x} lies in {len(hits)} live segments"
    return hits[0]


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


def test_empty_cache_keeps_the_segments_of_a_live_graph():
    pool = MemPool(backing=FakeBackingAllocator())
    seq, _ = capture(pool, [1 << 20])  # freed at capture end: free, but the graph uses it
    assert pool.empty_cache() == 0
    assert pool.stats().reserved_bytes == SMALL_SEGMENT_BYTES
    pool._remove_graph(seq)
    assert pool.empty_cache() == SMALL_SEGMENT_BYTES


def test_empty_cache_refuses_while_a_capture_is_underway():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    seq, _ = capture(pool, [3 << 20])
    pool._remove_graph(seq)
    token = object()
    pool._begin_capture(token)
    assert pool.empty_cache() == 0 and pool.stats().reserved_bytes == 4 << 20
    pool._end_capture(token, False)
    assert pool.empty_cache() == 4 << 20 and backing.live == {}


def two_graphs_sharing_one_segment(backing):
    """g1 uses segment A; g2 reuses A and adds segment B. Returns pool, seqs, A and B."""
    pool = MemPool(backing=backing)
    touched1, touched2 = [], []
    g1, _ = capture(pool, [3 << 20], touched=touched1)
    g2, _ = capture(pool, [3 << 20, 10 << 20], touched=touched2)
    a = segment_of(backing, touched1[0])
    assert segment_of(backing, touched2[0]) == a, "g2 did not reuse g1's temporary"
    b = segment_of(backing, touched2[1])
    assert set(backing.live) == {a, b}
    return pool, g1, g2, a, b


def test_evicting_one_of_two_graphs_frees_exactly_the_segments_only_it_used():
    backing = FakeBackingAllocator()
    pool, g1, g2, a, b = two_graphs_sharing_one_segment(backing)
    assert pool.empty_cache() == 0, "both segments are used by live graphs"
    pool._remove_graph(g2)
    assert set(backing.live) == {a, b}, "a shared pool keeps its cache until empty_cache"
    assert pool.empty_cache() == 10 << 20
    assert set(backing.live) == {a}, "the segment g1 still uses went back"
    assert pool.stats().live_graphs == 1
    pool._remove_graph(g1)
    assert pool.empty_cache() == 4 << 20 and backing.live == {}


def test_a_segment_used_by_two_graphs_stays_until_both_are_gone():
    backing = FakeBackingAllocator()
    pool, g1, g2, a, b = two_graphs_sharing_one_segment(backing)
    pool._remove_graph(g1)
    assert pool.empty_cache() == 0, "segment A is free but g2 replays into it"
    assert set(backing.live) == {a, b}
    pool._remove_graph(g2)
    assert pool.empty_cache() == 14 << 20 and backing.live == {}


def test_an_evicted_graphs_output_keeps_its_segment_until_it_dies():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    g1, kept = capture(pool, [4096], keep=[0])
    g2, _ = capture(pool, [3 << 20])
    pool._remove_graph(g1)
    assert pool.empty_cache() == 0, "a live output's segment, and g2's, must stay"
    del kept
    assert pool.empty_cache() == SMALL_SEGMENT_BYTES
    assert pool.stats().segments == 1
    pool._remove_graph(g2)


def test_a_rolled_back_segment_reused_by_a_live_graph_stays_while_it_lives():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    _, leftover = capture(pool, [100], keep=[0], succeed=False)  # keeps its marked segment
    touched = []
    seq, _ = capture(pool, [4096], touched=touched)
    segment = segment_of(backing, touched[0])
    assert segment == segment_of(backing, leftover[0].ptr), "the graph did not reuse it"
    del leftover  # fully free now, marked to go back, but the graph replays into it
    assert segment in backing.live
    pool._remove_graph(seq)  # a shared pool gives a rolled-back segment back once free
    assert backing.live == {}


def test_late_allocations_of_a_capture_join_its_graph():
    # Finish hooks may allocate after the graph was counted (between _add_graph and
    # _end_capture): their segments must be pinned too.
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    token = object()
    pool._begin_capture(token)
    seq = pool._add_graph()
    late = pool._allocate(3 << 20, STREAM, token)
    pool._end_capture(token, True)
    del late
    assert pool.empty_cache() == 0 and pool.stats().reserved_bytes == 4 << 20
    pool._remove_graph(seq)
    assert pool.empty_cache() == 4 << 20


class TestSharedBlocks:
    def test_two_captures_get_one_block_which_goes_back_with_the_last_graph(self):
        backing = FakeBackingAllocator()
        pool = MemPool(backing=backing)
        baseline = pool.stats()
        touched1, touched2 = [], []
        g1, _ = capture(pool, [4096], shared=1 << 16, touched=touched1)
        g2, _ = capture(pool, [8192], shared=1 << 16, touched=touched2)
        assert touched1[-1] == touched2[-1], "the second capture got another block"
        stats = pool.stats()
        assert stats.active_bytes == 1 << 16 and stats.live_arrays == 0
        pool._remove_graph(g1)
        assert pool.stats().active_bytes == 1 << 16, "freed while g2 still uses it"
        pool._remove_graph(g2)
        assert pool.stats().active_bytes == 0
        pool.empty_cache()
        assert pool.stats().model_copy(update={"peak_active_bytes": 0}) == baseline
        assert backing.live == {}

    def test_keys_get_distinct_blocks(self):
        pool = MemPool(backing=FakeBackingAllocator())
        token = object()
        pool._begin_capture(token)
        first = pool._shared_block(("k", 0), 4096, STREAM, token)
        again = pool._shared_block(("k", 0), 4096, STREAM, token)
        other = pool._shared_block(("k", 1), 4096, STREAM + 1, token)
        assert first == again and other != first
        assert abs(other - first) >= 4096, "the two blocks overlap"
        pool._end_capture(token, False)
        assert pool.stats().active_bytes == 0

    def test_private_pool_gives_everything_back(self):
        backing = FakeBackingAllocator()
        pool = MemPool(backing=backing, _private=True)
        seq, _ = capture(pool, [4096], shared=3 << 20)
        assert pool.stats().reserved_bytes == SMALL_SEGMENT_BYTES + (4 << 20)
        pool._remove_graph(seq)
        assert backing.live == {} and pool.stats().active_bytes == 0

    def test_a_failed_capture_drops_the_block_it_made_and_keeps_one_in_use(self):
        backing = FakeBackingAllocator()
        pool = MemPool(backing=backing)
        touched = []
        capture(pool, [100], shared=4096, succeed=False, touched=touched)
        assert pool.stats().active_bytes == 0, "a failed capture's block stayed"
        g1, _ = capture(pool, [100], shared=4096, touched=touched)
        capture(pool, [100], shared=4096, succeed=False, touched=touched)
        assert touched[-1] == touched[3], "the failed capture got a new block"
        assert pool.stats().active_bytes == 4096, "g1's block went with the failed capture"
        pool._remove_graph(g1)
        assert pool.stats().active_bytes == 0

    def test_a_larger_request_replaces_the_block_and_pins_stay(self):
        backing = FakeBackingAllocator()
        pool = MemPool(backing=backing)
        touched1, touched2 = [], []
        g1, _ = capture(pool, [], shared=3 << 20, touched=touched1)
        g2, _ = capture(pool, [], shared=9 << 20, touched=touched2)
        old, new = segment_of(backing, touched1[0]), segment_of(backing, touched2[0])
        assert old != new
        assert pool.stats().active_bytes == 9 << 20, "the smaller block was not freed"
        assert pool.empty_cache() == 0, "g1 still replays with the old block"
        pool._remove_graph(g1)
        assert pool.empty_cache() == 4 << 20 and set(backing.live) == {new}
        pool._remove_graph(g2)

    def test_outside_a_capture_is_refused(self):
        pool = MemPool(backing=FakeBackingAllocator())
        with pytest.raises(CaptureError, match="outside a capture"):
            pool._shared_block(WORKSPACE, 4096, STREAM, None)
        pool._begin_capture(object())
        with pytest.raises(CaptureError, match="got key"):
            pool._shared_block(WORKSPACE, 4096, STREAM, object())

    def test_out_of_memory_reports_sizes_and_keeps_the_held_block(self):
        pool = MemPool(backing=FakeBackingAllocator(capacity=8 << 20))
        touched = []
        seq, _ = capture(pool, [], shared=3 << 20, touched=touched)
        token = object()
        pool._begin_capture(token)
        with pytest.raises(PoolOutOfMemoryError) as info:
            pool._shared_block(WORKSPACE, 7 << 20, STREAM, token)
        assert info.value.requested_bytes == 7 << 20
        assert pool._shared_block(WORKSPACE, 1 << 20, STREAM, token) == touched[0]
        pool._end_capture(token, False)
        pool._remove_graph(seq)
        assert pool.stats().active_bytes == 0


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
    alive_segment = alive[0].mem.segment
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
    assert_out_of_memory_was_due(error, pool, backing, STREAM)
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
    lease = kept[0].mem
    with pool._lock:  # as if a garbage collection ran inside a pool operation
        lease.pool = None  # detach the lease, release by hand below
        pool._release(lease.ptr, lease.size, lease.segment)
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


WS_BYTES = 256 << 10  # the model's shared block: small, so it shares segments with arrays


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "drop", "capture_ok", "capture_fail",
                                           "capture_ws", "capture_ws_fail", "reset",
                                           "empty"]),
                          st.integers(1, 4 << 20)), max_size=40),
       st.booleans())
# g1 uses a small segment, g2 two large ones: with g1 evicted, its segment goes back.
@example([("capture_ok", 3), ("capture_ok", 3 << 20), ("reset", 2), ("empty", 1)], False)
def test_pool_accounts_add_up_after_any_sequence(ops, private):
    backing = FakeBackingAllocator(capacity=256 << 20)
    pool = MemPool(backing=backing, _private=private)
    arrays = []
    graphs: dict = {}  # seq -> backing segments its capture was handed blocks in
    workspace = None  # the model of the shared block: its address while the pool holds it
    for op, n in ops:
        if op == "alloc" or op.startswith("capture"):
            ok = not op.endswith("fail")
            shared = WS_BYTES if "ws" in op else None
            touched: list = []
            try:
                # every third capture keeps no output: its graph's memory is all temporary
                seq, kept = capture(pool, [n, n // 2 + 1], keep=[0] if n % 3 else [],
                                    succeed=ok, shared=shared, touched=touched,
                                    backing=backing)
            except PoolOutOfMemoryError:  # predicted by the model: capture() checked it
                continue
            if shared is not None:
                if workspace is not None:
                    assert touched[-1] == workspace, "a capture got a second shared block"
                elif ok:
                    workspace = touched[-1]
            arrays.extend(kept)
            del kept
            if ok:
                graphs[seq] = {segment_of(backing, ptr) for ptr in touched}
        elif op == "drop" and arrays:
            arrays.pop(n % len(arrays))
        elif op == "reset" and graphs:
            seq = list(graphs)[n % len(graphs)]
            del graphs[seq]
            pool._remove_graph(seq)
            if not graphs:
                workspace = None
        elif op == "empty":
            pool.empty_cache()
            # exactly the segments a live graph uses or a live block occupies stay
            needed = set().union(*graphs.values()) if graphs else set()
            needed |= {segment_of(backing, p.ptr) for p in arrays}
            if workspace is not None:
                needed.add(segment_of(backing, workspace))
            assert set(backing.live) == needed, "empty_cache kept or freed the wrong segments"
        stats = pool.stats()
        pool._arena.check_invariants()
        assert stats.reserved_bytes == backing.used
        assert stats.live_arrays == len(arrays)
        assert stats.live_graphs == len(graphs)
        held = WS_BYTES if workspace is not None else 0
        assert stats.active_bytes == sum(p.mem.size for p in arrays) + held
        spans = sorted((p.ptr, p.ptr + p.mem.size) for p in arrays)
        if workspace is not None:
            spans = sorted(spans + [(workspace, workspace + WS_BYTES)])
        assert all(e <= s for (_, e), (s, _) in pairwise(spans)), "live blocks overlap"
        for used in graphs.values():
            assert used <= set(backing.live), "a segment a live graph uses went back"
        if private and not graphs:
            # an idle private pool holds exactly the segments its live arrays need
            assert stats.segments == len({p.mem.segment.ptr for p in arrays})
    arrays.clear()
    for seq in list(graphs):
        pool._remove_graph(seq)
    pool.empty_cache()
    assert backing.live == {}


def test_the_out_of_memory_check_catches_an_error_the_model_does_not_predict():
    # A backing allocator that refuses while it has room: the pool's error is then not
    # explained by the device, and the check the model tests rely on must say so.
    class Refusing(FakeBackingAllocator):
        def malloc(self, nbytes: int) -> int:
            raise BackingOutOfMemoryError(nbytes)

    backing = Refusing(capacity=64 << 20)
    pool = MemPool(backing=backing)
    with pytest.raises(PoolOutOfMemoryError) as info:
        capture(pool, [1 << 20])
    with pytest.raises(AssertionError, match="free for a segment"):
        assert_out_of_memory_was_due(info.value, pool, backing, STREAM)
    # And one while a free block of the pool could have served the request.
    backing = FakeBackingAllocator(capacity=8 << 20)
    pool = MemPool(backing=backing)
    capture(pool, [6 << 20])  # its 6 MiB temporary stays cached, free, after the capture
    free, total = backing.mem_info()
    claimed = PoolOutOfMemoryError(4 << 20, pool.stats().reserved_bytes, free, total)
    with pytest.raises(AssertionError, match="could have served"):
        assert_out_of_memory_was_due(claimed, pool, backing, STREAM)


def test_a_hold_keeps_a_freed_output_block_on_the_device_until_it_dies():
    # Shape buckets' shared outputs: the output's block goes back to the pool for the next
    # capture, and a hold keeps its segment on the device for an alias still reading it.
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    seq, kept = capture(pool, [4 << 20], keep=[0])
    output = kept[0]
    hold = pool._hold(output.mem)
    base = segment_of(backing, output.ptr)
    del kept, output
    gc.collect()
    assert pool.stats().live_arrays == 0, "the block went back to the pool"
    # A later capture may take it: the same address, while the hold keeps the segment.
    seq2, again = capture(pool, [4 << 20], keep=[0])
    assert segment_of(backing, again[0].ptr) == base
    del again
    pool._remove_graph(seq)
    pool._remove_graph(seq2)
    assert base in backing.live, "a held segment went back with its graphs"
    del hold
    assert backing.live == {}


def test_a_hold_dying_while_the_pool_lock_is_taken_unpins_at_the_next_operation():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    seq, kept = capture(pool, [4 << 20], keep=[0])
    hold = pool._hold(kept[0].mem)
    del kept
    pool._remove_graph(seq)
    assert backing.live, "held"
    with pool._lock:  # as a garbage collection inside one of the pool's own operations
        del hold
        assert backing.live and pool._pending_unpins
    seq, _ = capture(pool, [1024])  # the next operation unpins under the lock
    assert not pool._pending_unpins
    pool._remove_graph(seq)
    assert backing.live == {}

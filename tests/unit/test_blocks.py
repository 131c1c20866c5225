"""BlockArena bookkeeping against a fake backing allocator."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cugraphrt._memory.backing import BackingOutOfMemoryError
from cugraphrt._memory.blocks import (
    ALIGNMENT,
    SMALL_SEGMENT_BYTES,
    BlockArena,
    round_up,
    segment_size_for,
)

from .fakes import FakeBackingAllocator


def test_segment_sizes():
    assert segment_size_for(1) == SMALL_SEGMENT_BYTES
    assert segment_size_for(1 << 20) == SMALL_SEGMENT_BYTES
    assert segment_size_for((1 << 20) + 1) == 2 << 20
    assert segment_size_for(5 << 20) == 6 << 20
    assert round_up(1, 512) == 512 and round_up(1024, 512) == 1024


def test_small_allocations_share_a_segment_and_are_aligned():
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    blocks = [arena.allocate(n) for n in (1, 100, 513, 4096)]
    assert backing.mallocs == 1
    assert [b.size for b in blocks] == [512, 512, 1024, 4096]
    assert all(b.ptr % ALIGNMENT == 0 for b in blocks)
    ends = sorted((b.ptr, b.ptr + b.size) for b in blocks)
    assert all(e1 <= s2 for (_, e1), (s2, _) in pairwise(ends)), "blocks overlap"
    assert arena.active_bytes == 512 + 512 + 1024 + 4096
    assert arena.reserved_bytes == SMALL_SEGMENT_BYTES
    arena.check_invariants()


def test_free_coalesces_and_segment_goes_back():
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    a, b, c = arena.allocate(1000), arena.allocate(2000), arena.allocate(3000)
    for block in (b, a, c):
        arena.free(block)
        arena.check_invariants()
    segment = next(iter(arena.segments.values()))
    assert arena.is_free(segment)
    assert list(arena.blocks()) == [(segment.ptr, segment.size, True, None)]
    assert arena.release_free_segments() == SMALL_SEGMENT_BYTES
    assert backing.live == {} and arena.reserved_bytes == 0
    arena.check_invariants()


def test_best_fit_reuses_the_smallest_block_that_fits():
    arena = BlockArena(FakeBackingAllocator())
    keep = [arena.allocate(512)]
    small = arena.allocate(1024)
    keep.append(arena.allocate(512))
    big = arena.allocate(8192)
    keep.append(arena.allocate(512))
    arena.free(small)
    arena.free(big)
    again = arena.allocate(1000)
    assert again.ptr == small.ptr
    arena.check_invariants()


def test_tagged_blocks_are_reused_only_on_their_stream_until_settled():
    arena = BlockArena(FakeBackingAllocator())
    pin = arena.allocate(512, tag=1)
    block = arena.allocate(4096, tag=1)
    ptr = block.ptr
    arena.free(block, tag=1)
    other = arena.allocate(4096, tag=2)
    assert other.ptr != ptr, "a block freed on stream 1 went to stream 2"
    same = arena.allocate(4096, tag=1)
    assert same.ptr == ptr
    arena.free(same, tag=1)
    arena.settle()
    anyone = arena.allocate(4096, tag=2)
    assert anyone.ptr == ptr
    for b in (pin, other, anyone):
        arena.free(b)
    arena.check_invariants()


def test_small_requests_never_carve_large_blocks():
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    temp = arena.allocate(32 << 20)
    arena.free(temp)
    small = arena.allocate(4096)  # must not split the free 32 MiB block
    assert small.segment is not temp.segment and small.segment.small
    again = arena.allocate(32 << 20)
    assert again.ptr == temp.ptr, "a later large request could not reuse the large block"
    arena.check_invariants()


class AdjacentBackingAllocator(FakeBackingAllocator):
    """Segments back to back, as cudaMalloc may hand them out."""

    def malloc(self, nbytes: int) -> int:
        ptr = super().malloc(nbytes)
        self.next_ptr -= 1 << 20  # no gap: the next segment starts where this one ends
        return ptr


def test_free_blocks_never_merge_across_adjacent_segments():
    backing = AdjacentBackingAllocator()
    arena = BlockArena(backing)
    first = arena.allocate(SMALL_SEGMENT_BYTES)  # fills a large segment exactly
    second = arena.allocate(SMALL_SEGMENT_BYTES)
    assert second.ptr == first.ptr + SMALL_SEGMENT_BYTES, "the fake must place them adjacent"
    arena.free(first)
    arena.free(second)
    arena.settle()
    arena.check_invariants()
    assert all(arena.is_free(s) for s in arena.segments.values())
    # A merged block would span both segments and serve a request neither can hold.
    assert arena.allocate(2 * SMALL_SEGMENT_BYTES).segment not in (first.segment,
                                                                     second.segment)
    assert arena.release_free_segments() == 2 * SMALL_SEGMENT_BYTES
    arena.check_invariants()


def test_giving_back_a_block_not_handed_out_is_refused():
    arena = BlockArena(FakeBackingAllocator())
    ptr, size, segment = arena.take(1000)
    arena.give(ptr, size, segment)
    with pytest.raises(ValueError, match="double free"):
        arena.give(ptr, size, segment)
    ptr, size, segment = arena.take(1000)
    with pytest.raises(ValueError, match="double free"):
        arena.give(ptr, size + ALIGNMENT, segment)  # not the block handed out there
    arena.check_invariants()  # the refused gives changed nothing
    arena.give(ptr, size, segment)
    arena.check_invariants()


def test_double_free_is_refused():
    arena = BlockArena(FakeBackingAllocator())
    block = arena.allocate(100)
    arena.free(block)
    with pytest.raises(ValueError, match="double free"):
        arena.free(block)


def test_out_of_memory_leaves_arena_untouched():
    backing = FakeBackingAllocator(capacity=4 << 20)
    arena = BlockArena(backing)
    kept = arena.allocate(3 << 20)
    before = (arena.reserved_bytes, arena.active_bytes, len(arena.segments))
    with pytest.raises(BackingOutOfMemoryError):
        arena.allocate(3 << 20)
    assert (arena.reserved_bytes, arena.active_bytes, len(arena.segments)) == before
    arena.free(kept)
    arena.check_invariants()


def test_marked_segments_are_released_selectively():
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    old = arena.allocate(3 << 20, owner="before")
    new = arena.allocate(5 << 20, owner="failed")
    arena.free(old)
    arena.free(new)
    arena.forget_owner("before")
    arena.mark_owned_segments("failed")
    assert arena.release_free_segments(only_marked=True) == 6 << 20
    assert arena.reserved_bytes == 4 << 20
    arena.check_invariants()


def test_pinned_segments_stay_until_every_pin_is_dropped():
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    a, b = arena.allocate(3 << 20), arena.allocate(5 << 20)
    seg_a, seg_b = a.segment, b.segment
    arena.free(a)
    arena.free(b)
    arena.pin("g1", [seg_a])
    arena.pin("g2", [seg_a, seg_b])
    assert (seg_a.pins, seg_b.pins) == (2, 1)
    arena.check_invariants()
    assert arena.release_free_segments() == 0, "a pinned free segment went back"
    arena.unpin("g2")
    assert arena.release_free_segments() == 6 << 20  # only seg_b: seg_a is still pinned
    assert set(backing.live) == {seg_a.ptr}
    arena.unpin("g1")
    arena.unpin("g1")  # unknown keys are ignored
    assert arena.release_free_segments() == 4 << 20 and backing.live == {}
    arena.check_invariants()


def test_pinning_a_key_again_adds_only_new_segments():
    arena = BlockArena(FakeBackingAllocator())
    a, b = arena.allocate(100), arena.allocate(3 << 20)
    arena.pin("g", [a.segment])
    arena.pin("g", [a.segment, b.segment])  # late allocations of the same capture
    assert (a.segment.pins, b.segment.pins) == (1, 1)
    arena.check_invariants()
    arena.unpin("g")
    assert (a.segment.pins, b.segment.pins) == (0, 0)


def test_marked_segment_a_live_graph_uses_is_kept_until_unpinned():
    # A rolled-back capture's segment is marked to go back once free; if a later capture
    # allocated from it, that capture's graph still replays into it.
    backing = FakeBackingAllocator()
    arena = BlockArena(backing)
    leftover = arena.allocate(100, owner="failed")
    arena.mark_owned_segments("failed")
    reused = arena.allocate(4096, owner="ok")
    assert reused.segment is leftover.segment
    arena.pin("graph", [reused.segment])
    arena.free(reused)
    arena.free(leftover)
    assert arena.release_free_segments(only_marked=True) == 0
    arena.unpin("graph")
    assert arena.release_free_segments(only_marked=True) == SMALL_SEGMENT_BYTES
    assert backing.live == {} and arena.marked_segments == 0
    arena.check_invariants()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 3 << 20), st.sampled_from([None, 1, 2])),
        st.tuples(st.just("free"), st.integers(0, 50), st.sampled_from([None, 1, 2])),
        st.tuples(st.just("settle"), st.just(0), st.just(None)),
        st.tuples(st.just("release"), st.just(0), st.just(None)),
        st.tuples(st.just("pin"), st.integers(0, 50), st.sampled_from(["g1", "g2", "g3"])),
        st.tuples(st.just("unpin"), st.just(0), st.sampled_from(["g1", "g2", "g3"])),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_hold_after_any_sequence(sequence):
    backing = FakeBackingAllocator(capacity=64 << 20)
    arena = BlockArena(backing)
    live = []
    pinned: dict = {}  # key -> segment pointers, the model of the arena's pins
    tagged = False  # a stream-tagged free since the last settle (may leave blocks unmerged)
    peak = 0
    for op, arg, tag in sequence:
        if op == "alloc":
            try:
                live.append(arena.allocate(arg, tag=tag))
            except BackingOutOfMemoryError:
                pass
        elif op == "free" and live:
            arena.free(live.pop(arg % len(live)), tag=tag)
            tagged = tagged or tag is not None
        elif op == "settle":
            arena.settle()
            tagged = False
        elif op == "release":
            kept = {ptr for ptrs in pinned.values() for ptr in ptrs}
            kept |= {b.segment.ptr for b in live}
            arena.release_free_segments()
            assert kept <= set(backing.live), "a pinned or used segment went back"
            if not tagged:  # every free segment is one merged block: all of them go back
                assert set(backing.live) == kept, "a free, unpinned segment stayed"
        elif op == "pin" and live:
            segment = live[arg % len(live)].segment
            arena.pin(tag, [segment])
            pinned.setdefault(tag, set()).add(segment.ptr)
        elif op == "unpin":
            arena.unpin(tag)
            pinned.pop(tag, None)
        arena.check_invariants()
        # No two live blocks overlap, and every live block lies inside a live segment.
        spans = sorted((b.ptr, b.ptr + b.size) for b in live)
        assert all(e <= s for (_, e), (s, _) in pairwise(spans))
        for block in live:
            assert backing.live.get(block.segment.ptr) == block.segment.size
        for ptrs in pinned.values():
            assert ptrs <= set(backing.live), "a pinned segment went back"
        peak = max(peak, arena.active_bytes)
        assert arena.peak_active_bytes == peak
        assert arena.active_bytes == sum(b.size for b in live)
        assert arena.reserved_bytes == backing.used

"""Block bookkeeping of a graph memory pool, independent of CUDA.

A :class:`BlockArena` carves blocks out of segments obtained from a backing allocator
(``cudaMalloc`` in production, a fake in the unit tests). It splits and coalesces blocks,
keeps the free ones in size-sorted lists and counts bytes. It knows nothing about graphs; the
pool decides when segments may go back, and *pins* the segments a live graph uses
(:meth:`BlockArena.pin`): a pinned segment never goes back, even once fully free.

Small and large. Requests up to 1 MiB are carved only from 2 MiB "small" segments, larger ones
only from "large" segments (as in PyTorch's caching allocator): otherwise small outputs that
stay alive get carved out of a large freed temporary, and the next graph sharing the pool
cannot reuse that temporary's room.

Stream tags. During a capture, a block freed on stream ``s`` may only be reused by later
allocations on ``s`` in the same capture: the captured graph orders work on one stream, but
not across streams. Each free block carries the stream it was freed on (its *tag*); untagged
blocks (``None``) may go to any stream. :meth:`BlockArena.settle` drops all tags when a
capture ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator
from typing import Any

__all__ = ["ALIGNMENT", "Block", "Segment", "BlockArena", "segment_size_for"]

#: Every block starts and ends on this boundary (CuPy's pool uses the same).
ALIGNMENT = 512
#: Requests up to this size share small segments.
SMALL_REQUEST_BYTES = 1 << 20
#: Size of a small segment.
SMALL_SEGMENT_BYTES = 2 << 20
#: Large segments are rounded up to a multiple of this.
LARGE_SEGMENT_ROUND_BYTES = 2 << 20


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is at least ``n``."""
    return (n + multiple - 1) // multiple * multiple


def segment_size_for(nbytes: int) -> int:
    """Bytes to ask the backing allocator for when a request of ``nbytes`` finds no block."""
    if nbytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    return round_up(nbytes, LARGE_SEGMENT_ROUND_BYTES)


class Segment:
    """One allocation from the backing allocator."""

    __slots__ = ("ptr", "size", "small", "owner", "release_when_free", "head", "pins")

    def __init__(self, ptr: int, size: int, small: bool, owner: Hashable | None) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small  # serves requests up to SMALL_REQUEST_BYTES only
        self.owner = owner  # token of the capture that made the pool grow
        self.release_when_free = False
        self.head: Block | None = None
        self.pins = 0  # live pins (graphs whose capture allocated from this segment)


class Block:
    """A contiguous range of a segment, either handed out or free."""

    __slots__ = ("ptr", "size", "segment", "prev", "next", "is_free", "tag", "owner")

    def __init__(self, ptr: int, size: int, segment: Segment) -> None:
        self.ptr = ptr
        self.size = size
        self.segment = segment
        self.prev: Block | None = None
        self.next: Block | None = None
        self.is_free = True
        self.tag: Hashable | None = None
        self.owner: Hashable | None = None

    def __repr__(self) -> str:
        state = "free" if self.is_free else "active"
        return f"<Block 0x{self.ptr:x} {self.size} B {state} tag={self.tag!r}>"


class BlockArena:
    """Splits segments into blocks and keeps the accounts.

    Parameters
    ----------
    backing : BackingAllocator
        Supplies and takes back segments (``malloc(nbytes) -> ptr``, ``free(ptr, nbytes)``).
    """

    def __init__(self, backing) -> None:
        self.backing = backing
        self.segments: dict[int, Segment] = {}
        # (tag, small) -> sorted list of (size, ptr); ptr -> free Block
        self._free_lists: dict[tuple[Hashable | None, bool], list[tuple[int, int]]] = {}
        self._free_blocks: dict[int, Block] = {}
        self.reserved_bytes = 0
        self.active_bytes = 0
        self.peak_active_bytes = 0
        self.active_blocks = 0
        self.marked_segments = 0  # segments a rolled-back capture left, to go back once free
        self._pins: dict[Hashable, frozenset[Segment]] = {}

    # -- allocation ------------------------------------------------------------------------

    def allocate(self, nbytes: int, tag: Hashable | None = None,
                 owner: Hashable | None = None) -> Block:
        """Hand out a block of at least ``nbytes`` usable on stream ``tag``.

        Grows the arena by one segment when no free block fits; the backing allocator's
        out-of-memory error propagates unchanged, with the arena untouched.
        """
        # This runs for every array created during a capture: the best-fit search and the
        # split are inlined to keep it to a handful of list and dict operations.
        size = (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT if nbytes > 0 else ALIGNMENT
        small = size <= SMALL_REQUEST_BYTES
        lists = self._free_lists
        best: tuple[int, int] | None = None
        best_entries: Any = None  # set together with best
        best_index: Any = None
        best_key: Any = None
        key: tuple[Hashable | None, bool] = (None, small)
        entries = lists.get(key)
        if entries:
            i = bisect.bisect_left(entries, (size, 0))
            if i < len(entries):
                best, best_entries, best_index, best_key = entries[i], entries, i, key
        if tag is not None:
            key = (tag, small)
            entries = lists.get(key)
            if entries:
                i = bisect.bisect_left(entries, (size, 0))
                if i < len(entries) and (best is None or entries[i] < best):
                    best, best_entries, best_index, best_key = entries[i], entries, i, key
        if best is None:
            block = self._grow(size, small, owner)
        else:
            del best_entries[best_index]
            if not best_entries:
                del lists[best_key]
            block = self._free_blocks.pop(best[1])
        remainder = block.size - size
        if remainder >= ALIGNMENT:
            rest = Block(block.ptr + size, remainder, block.segment)
            rest.tag = block.tag  # the remainder keeps the stream it was freed on
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            entries = lists.get((rest.tag, small))
            if entries is None:
                entries = lists[(rest.tag, small)] = []
            bisect.insort(entries, (remainder, rest.ptr))
            self._free_blocks[rest.ptr] = rest
        block.is_free = False
        block.tag = None
        block.owner = owner
        self.active_bytes += block.size
        self.active_blocks += 1
        if self.active_bytes > self.peak_active_bytes:
            self.peak_active_bytes = self.active_bytes
        return block

    def _grow(self, size: int, small: bool, owner: Hashable | None) -> Block:
        seg_size = segment_size_for(size)
        ptr = self.backing.malloc(seg_size)
        segment = Segment(ptr, seg_size, small, owner)
        block = Block(ptr, seg_size, segment)
        segment.head = block
        self.segments[ptr] = segment
        self.reserved_bytes += seg_size
        return block

    # -- free ------------------------------------------------------------------------------

    def free(self, block: Block, tag: Hashable | None = None) -> None:
        """Take a block back; it becomes reusable on stream ``tag`` (any stream if None)."""
        if block.is_free:
            raise ValueError(f"double free of {block!r}")
        self.active_bytes -= block.size
        self.active_blocks -= 1
        block.is_free = True
        block.tag = tag
        block.owner = None
        block = self._coalesce(block)
        self._list(block)

    def _coalesce(self, block: Block) -> Block:
        nxt = block.next
        if nxt is not None and nxt.is_free and nxt.tag == block.tag:
            self._unlist(nxt)
            self._absorb(block, nxt)
        prev = block.prev
        if prev is not None and prev.is_free and prev.tag == block.tag:
            self._unlist(prev)
            self._absorb(prev, block)
            block = prev
        return block

    @staticmethod
    def _absorb(low: Block, high: Block) -> None:
        # The lower block survives, so a segment's head never changes.
        low.size += high.size
        low.next = high.next
        if high.next is not None:
            high.next.prev = low

    def settle(self) -> None:
        """Drop every stream tag and merge neighbouring free blocks (a capture ended)."""
        if not any(tag is not None for tag, _ in self._free_lists):
            return
        self._free_lists = {}
        self._free_blocks = {}
        for segment in self.segments.values():
            block = segment.head
            while block is not None:
                if block.is_free:
                    block.tag = None
                    while block.next is not None and block.next.is_free:
                        self._absorb(block, block.next)
                    self._list(block)
                block = block.next

    # -- giving memory back ----------------------------------------------------------------

    def release_free_segments(self, only_marked: bool = False) -> int:
        """Return fully free, unpinned segments to the backing allocator.

        Parameters
        ----------
        only_marked : bool
            Release only segments marked ``release_when_free`` (a rolled-back capture's).

        Returns
        -------
        int
            Bytes released.
        """
        released = 0
        if only_marked and not self.marked_segments:
            return 0  # the common case, on every free: nothing to scan
        for segment in list(self.segments.values()):
            if (only_marked and not segment.release_when_free) or segment.pins:
                continue
            head = segment.head
            if head is None or not head.is_free or head.size != segment.size:
                continue
            self._unlist(head)
            if segment.release_when_free:
                self.marked_segments -= 1
            del self.segments[segment.ptr]
            self.reserved_bytes -= segment.size
            released += segment.size
            segment.head = None
            self.backing.free(segment.ptr, segment.size)
        return released

    def mark_owned_segments(self, owner: Hashable) -> None:
        """Mark the segments a capture made the arena grow by, so they go back once free."""
        for segment in self.segments.values():
            if segment.owner == owner and not segment.release_when_free:
                segment.release_when_free = True
                self.marked_segments += 1

    def pin(self, key: Hashable, segments) -> None:
        """Keep ``segments`` from going back until :meth:`unpin` of ``key``.

        A segment may carry several pins (one per live graph that allocated from it); adding
        segments to an existing key pins only the ones it did not hold yet.
        """
        held = self._pins.get(key, frozenset())
        new = frozenset(segments) - held
        for segment in new:
            segment.pins += 1
        self._pins[key] = held | new

    def unpin(self, key: Hashable) -> None:
        """Drop the pins of ``key`` (unknown keys are ignored); releases nothing by itself."""
        for segment in self._pins.pop(key, ()):
            segment.pins -= 1

    def forget_owner(self, owner: Hashable) -> None:
        """A capture succeeded: its segments now belong to the pool like any other."""
        for segment in self.segments.values():
            if segment.owner == owner:
                segment.owner = None

    # -- lists -----------------------------------------------------------------------------

    def _list(self, block: Block) -> None:
        entries = self._free_lists.setdefault((block.tag, block.segment.small), [])
        bisect.insort(entries, (block.size, block.ptr))
        self._free_blocks[block.ptr] = block

    def _unlist(self, block: Block) -> None:
        key = (block.tag, block.segment.small)
        entries = self._free_lists[key]
        del entries[bisect.bisect_left(entries, (block.size, block.ptr))]
        del self._free_blocks[block.ptr]
        if not entries:
            del self._free_lists[key]

    # -- introspection ---------------------------------------------------------------------

    def blocks(self) -> Iterator[Block]:
        """Every block, segment by segment, in address order."""
        for segment in sorted(self.segments.values(), key=lambda s: s.ptr):
            block = segment.head
            while block is not None:
                yield block
                block = block.next

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounts are inconsistent (used by the tests)."""
        active = free = count = 0
        for segment in self.segments.values():
            block, end = segment.head, segment.ptr
            assert block is not None and block.ptr == segment.ptr, "segment head misplaced"
            while block is not None:
                assert block.ptr == end, f"gap or overlap at {block!r}"
                assert block.size > 0 and block.size % ALIGNMENT == 0, f"bad size {block!r}"
                assert block.segment is segment, "block in the wrong segment"
                if block.next is not None:
                    assert block.next.prev is block, "broken links"
                if block.is_free:
                    free += block.size
                    assert self._free_blocks.get(block.ptr) is block, f"unlisted {block!r}"
                else:
                    active += block.size
                    count += 1
                end += block.size
                block = block.next
            assert end == segment.ptr + segment.size, "blocks do not cover the segment"
        listed = sum(len(v) for v in self._free_lists.values())
        assert listed == len(self._free_blocks), "free lists and free index disagree"
        assert active == self.active_bytes, f"active {active} != {self.active_bytes}"
        assert count == self.active_blocks, "active block count wrong"
        assert active + free == self.reserved_bytes, "reserved bytes do not add up"
        assert self.reserved_bytes == sum(s.size for s in self.segments.values())
        assert self.peak_active_bytes >= self.active_bytes
        assert self.marked_segments == sum(s.release_when_free for s in self.segments.values())
        for segment in self.segments.values():
            holders = sum(segment in pinned for pinned in self._pins.values())
            assert segment.pins == holders, f"segment 0x{segment.ptr:x} pin count wrong"
        for pinned in self._pins.values():
            assert all(self.segments.get(s.ptr) is s for s in pinned), "pinned segment gone"

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

Representation. Every array created during a capture takes a block and gives it back, in
Python, so the hot pair :meth:`BlockArena.take` / :meth:`BlockArena.give` works on plain ints
and creates no object per block: a free block is one entry in two dicts (start -> (end, tag,
segment), end -> start; the neighbours a freed block merges with are found by address) and
one int ``size << 64 | start`` in the sorted list of its tag, so a best-fit search is one
bisect over ints and ties go to the lower address. Blocks handed out are a dict of start ->
size. :meth:`BlockArena.allocate` / :meth:`BlockArena.free` wrap the pair in :class:`Block`
objects for callers outside the hot path.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterator

__all__ = ["ALIGNMENT", "Block", "Segment", "BlockArena", "segment_size_for"]

#: Every block starts and ends on this boundary (CuPy's pool uses the same).
ALIGNMENT = 512
#: Requests up to this size share small segments.
SMALL_REQUEST_BYTES = 1 << 20
#: Size of a small segment.
SMALL_SEGMENT_BYTES = 2 << 20
#: Large segments are rounded up to a multiple of this.
LARGE_SEGMENT_ROUND_BYTES = 2 << 20

# A free block's key in its sorted list: its size above, its start address below.
_SHIFT = 64
_LOW = (1 << _SHIFT) - 1

Tag = Hashable | None


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

    __slots__ = ("ptr", "size", "small", "owner", "release_when_free", "pins")

    def __init__(self, ptr: int, size: int, small: bool, owner: Hashable | None) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small  # serves requests up to SMALL_REQUEST_BYTES only
        self.owner = owner  # token of the capture that made the pool grow
        self.release_when_free = False
        self.pins = 0  # live pins (graphs whose capture allocated from this segment)

    def __repr__(self) -> str:
        return f"<Segment 0x{self.ptr:x} {self.size} B pins={self.pins}>"


class Block:
    """A block handed out by :meth:`BlockArena.allocate`."""

    __slots__ = ("ptr", "size", "segment", "is_free")

    def __init__(self, ptr: int, size: int, segment: Segment) -> None:
        self.ptr = ptr
        self.size = size
        self.segment = segment
        self.is_free = False

    def __repr__(self) -> str:
        state = "free" if self.is_free else "active"
        return f"<Block 0x{self.ptr:x} {self.size} B {state}>"


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
        self._free_at: dict[int, tuple[int, Tag, Segment]] = {}  # start -> (end, tag, segment)
        self._free_until: dict[int, int] = {}  # end -> start
        # tag -> sorted keys of the free blocks with that tag, of small and of large segments
        self._small: dict[Tag, list[int]] = {}
        self._large: dict[Tag, list[int]] = {}
        self._active: dict[int, int] = {}  # start -> size of each block handed out
        self.reserved_bytes = 0
        self.active_bytes = 0
        self.peak_active_bytes = 0
        self.marked_segments = 0  # segments a rolled-back capture left, to go back once free
        self._spans: tuple | None = None  # (starts, ends) of the segments, until they change
        self._pins: dict[Hashable, frozenset[Segment]] = {}

    @property
    def active_blocks(self) -> int:
        """Blocks handed out."""
        return len(self._active)

    # -- the hot pair ----------------------------------------------------------------------

    def take(self, nbytes: int, tag: Tag = None,
             owner: Hashable | None = None) -> tuple[int, int, Segment]:
        """Hand out a block of at least ``nbytes`` usable on stream ``tag``.

        Returns ``(ptr, size, segment)``. Grows the arena by one segment (made by ``owner``)
        when no free block fits; the backing allocator's out-of-memory error propagates
        unchanged, with the arena untouched.
        """
        size = (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT if nbytes > 0 else ALIGNMENT
        lists = self._small if size <= SMALL_REQUEST_BYTES else self._large
        wanted = size << _SHIFT
        best = 0  # keys are never 0: sizes are at least ALIGNMENT
        entries = lists.get(None)
        if entries:
            i = bisect_left(entries, wanted)
            if i < len(entries):
                best, best_entries, best_index, best_tag = entries[i], entries, i, None
        if tag is not None:
            entries = lists.get(tag)
            if entries:
                i = bisect_left(entries, wanted)
                if i < len(entries) and (not best or entries[i] < best):
                    best, best_entries, best_index, best_tag = entries[i], entries, i, tag
        if best:
            if len(best_entries) > 1:
                del best_entries[best_index]
            else:
                del lists[best_tag]
            start = best & _LOW
            end, free_tag, segment = self._free_at.pop(start)
            del self._free_until[end]
        else:
            segment = self._grow(size, size <= SMALL_REQUEST_BYTES, owner)
            start, end, free_tag = segment.ptr, segment.ptr + segment.size, None
        rest = start + size
        if rest < end:  # the remainder stays free, with the tag it had
            self._free_at[rest] = (end, free_tag, segment)
            self._free_until[end] = rest
            entries = lists.get(free_tag)
            if entries is None:
                lists[free_tag] = [(end - rest) << _SHIFT | rest]
            else:
                insort(entries, (end - rest) << _SHIFT | rest)
        self._active[start] = size
        self.active_bytes += size
        if self.active_bytes > self.peak_active_bytes:
            self.peak_active_bytes = self.active_bytes
        return start, size, segment

    def give(self, ptr: int, size: int, segment: Segment, tag: Tag = None) -> None:
        """Take back a block from :meth:`take`; it becomes reusable on stream ``tag`` (any
        stream if None) and merges with free neighbours of the same tag.

        Raises
        ------
        ValueError
            For a block that is not handed out (a double free).
        """
        held = self._active.pop(ptr, None)
        if held != size:
            if held is not None:
                self._active[ptr] = held  # handed out with another size: leave it be
            raise ValueError(f"double free of the block at 0x{ptr:x} ({size} B, got "
                             f"{'no block' if held is None else f'a {held} B block'} there)")
        self.active_bytes -= size
        lists = self._small if segment.small else self._large
        free_at, free_until = self._free_at, self._free_until
        start, end = ptr, ptr + size
        after = free_at.get(end)
        if after is not None and after[2] is segment and after[1] == tag:
            del free_at[end]
            del free_until[after[0]]
            _unlist(lists, tag, (after[0] - end) << _SHIFT | end)
            end = after[0]
        before = free_until.get(start)
        if before is not None:
            _, before_tag, before_segment = free_at[before]
            if before_segment is segment and before_tag == tag:
                del free_until[start]
                _unlist(lists, tag, (start - before) << _SHIFT | before)
                start = before
        free_at[start] = (end, tag, segment)
        free_until[end] = start
        entries = lists.get(tag)
        if entries is None:
            lists[tag] = [(end - start) << _SHIFT | start]
        else:
            insort(entries, (end - start) << _SHIFT | start)

    def _grow(self, size: int, small: bool, owner: Hashable | None) -> Segment:
        seg_size = segment_size_for(size)
        ptr = self.backing.malloc(seg_size)
        segment = Segment(ptr, seg_size, small, owner)
        self.segments[ptr] = segment
        self.reserved_bytes += seg_size
        self._spans = None
        return segment

    def spans(self) -> tuple:
        """``(starts, ends, low, high)``: the segments' sorted start and end addresses (lists)
        and the lowest start and highest end; the same tuple object until a segment comes
        or goes (callers compare it by identity)."""
        if self._spans is None:
            ordered = sorted((s.ptr, s.ptr + s.size) for s in list(self.segments.values()))
            starts, ends = [a for a, _ in ordered], [b for _, b in ordered]
            self._spans = (starts, ends, starts[0] if starts else 0, max(ends, default=0))
        return self._spans

    # -- blocks as objects (outside the hot path) ------------------------------------------

    def allocate(self, nbytes: int, tag: Tag = None, owner: Hashable | None = None) -> Block:
        """:meth:`take` as a :class:`Block`."""
        return Block(*self.take(nbytes, tag, owner))

    def free(self, block: Block, tag: Tag = None) -> None:
        """:meth:`give` of a :class:`Block`; a second free of it raises ValueError."""
        if block.is_free:
            raise ValueError(f"double free of {block!r}")
        self.give(block.ptr, block.size, block.segment, tag)
        block.is_free = True

    # -- ends of captures ------------------------------------------------------------------

    def settle(self) -> None:
        """Drop every stream tag and merge neighbouring free blocks (a capture ended)."""
        if all(tag is None for lists in (self._small, self._large) for tag in lists):
            return
        merged: list[tuple[int, int, Segment]] = []
        for start in sorted(self._free_at):
            end, _, segment = self._free_at[start]
            if merged and merged[-1][1] == start and merged[-1][2] is segment:
                merged[-1] = (merged[-1][0], end, segment)
            else:
                merged.append((start, end, segment))
        self._free_at, self._free_until = {}, {}
        self._small, self._large = {}, {}
        for start, end, segment in merged:
            self._list(start, end, None, segment)

    def _list(self, start: int, end: int, tag: Tag, segment: Segment) -> None:
        self._free_at[start] = (end, tag, segment)
        self._free_until[end] = start
        lists = self._small if segment.small else self._large
        insort(lists.setdefault(tag, []), (end - start) << _SHIFT | start)

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
            whole = self._free_at.get(segment.ptr)
            if whole is None or whole[0] != segment.ptr + segment.size:
                continue
            del self._free_at[segment.ptr]
            del self._free_until[whole[0]]
            _unlist(self._small if segment.small else self._large, whole[1],
                    segment.size << _SHIFT | segment.ptr)
            if segment.release_when_free:
                self.marked_segments -= 1
            del self.segments[segment.ptr]
            self._spans = None
            self.reserved_bytes -= segment.size
            released += segment.size
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

    # -- introspection ---------------------------------------------------------------------

    def is_free(self, segment: Segment) -> bool:
        """Whether the whole segment is one free block."""
        whole = self._free_at.get(segment.ptr)
        return whole is not None and whole[0] == segment.ptr + segment.size

    def blocks(self) -> Iterator[tuple[int, int, bool, Tag]]:
        """Every block as ``(ptr, size, is_free, tag)``, in address order."""
        spans = [(s, e - s, True, tag) for s, (e, tag, _) in self._free_at.items()]
        spans += [(s, size, False, None) for s, size in self._active.items()]
        return iter(sorted(spans))

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounts are inconsistent (used by the tests)."""
        spans = list(self.blocks())
        for segment in sorted(self.segments.values(), key=lambda s: s.ptr):
            end, previous = segment.ptr, None
            inside = [b for b in spans if segment.ptr <= b[0] < segment.ptr + segment.size]
            for ptr, size, is_free, tag in inside:
                assert ptr == end, f"gap or overlap at 0x{ptr:x}"
                assert size > 0 and size % ALIGNMENT == 0, f"bad size {size} at 0x{ptr:x}"
                if is_free:
                    assert self._free_at[ptr][2] is segment, "free block in the wrong segment"
                    assert previous is None or not previous[2] or previous[3] != tag, (
                        f"free neighbours of one tag left unmerged at 0x{ptr:x}")
                previous = (ptr, size, is_free, tag)
                end += size
            assert end == segment.ptr + segment.size, "blocks do not cover the segment"
        assert sum(b[1] for b in spans) == self.reserved_bytes, "blocks outside the segments"
        assert all(self._free_until.get(e) == s for s, (e, _, _) in self._free_at.items())
        assert len(self._free_until) == len(self._free_at), "end index and start index differ"
        listed = []
        for lists, small in ((self._small, True), (self._large, False)):
            for tag, entries in lists.items():
                assert entries and entries == sorted(entries), "free list empty or unsorted"
                for key in entries:
                    end, free_tag, segment = self._free_at[key & _LOW]
                    assert (free_tag, segment.small) == (tag, small), "block in the wrong list"
                    assert (key >> _SHIFT) == end - (key & _LOW), "listed size is stale"
                listed += entries
        assert len(listed) == len(self._free_at), "free lists and free index disagree"
        active = sum(self._active.values())
        assert active == self.active_bytes, f"active {active} != {self.active_bytes}"
        assert self.reserved_bytes == sum(s.size for s in self.segments.values())
        assert self.peak_active_bytes >= self.active_bytes
        assert self.marked_segments == sum(s.release_when_free for s in self.segments.values())
        for segment in self.segments.values():
            holders = sum(segment in pinned for pinned in self._pins.values())
            assert segment.pins == holders, f"segment 0x{segment.ptr:x} pin count wrong"
        for pinned in self._pins.values():
            assert all(self.segments.get(s.ptr) is s for s in pinned), "pinned segment gone"


def _unlist(lists: dict[Tag, list[int]], tag: Tag, key: int) -> None:
    entries = lists[tag]
    if len(entries) > 1:
        del entries[bisect_left(entries, key)]
    else:
        del lists[tag]

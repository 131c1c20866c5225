"""A fake backing allocator: hands out addresses from a counter, checks every free."""

from __future__ import annotations

from cugraphrt._memory.backing import BACKING_INTERFACE_VERSION, BackingOutOfMemoryError


class FakeBackingAllocator:
    """Version-1 backing allocator over an imaginary device of ``capacity`` bytes."""

    interface_version = BACKING_INTERFACE_VERSION

    def __init__(self, capacity: int = 1 << 30, device_id: int = 0) -> None:
        self.capacity = capacity
        self.device_id = device_id
        self.live: dict[int, int] = {}
        self.next_ptr = 1 << 40
        self.mallocs = 0
        self.frees = 0

    @property
    def used(self) -> int:
        return sum(self.live.values())

    def malloc(self, nbytes: int) -> int:
        if self.used + nbytes > self.capacity:
            raise BackingOutOfMemoryError(nbytes)
        ptr = self.next_ptr
        # Leave a gap so that segments are never adjacent: blocks must not merge across them.
        self.next_ptr += nbytes + (1 << 20)
        self.live[ptr] = nbytes
        self.mallocs += 1
        return ptr

    def free(self, ptr: int, nbytes: int) -> None:
        assert self.live.get(ptr) == nbytes, f"free of unknown segment 0x{ptr:x}/{nbytes}"
        del self.live[ptr]
        self.frees += 1

    def mem_info(self) -> tuple[int, int]:
        return self.capacity - self.used, self.capacity


def assert_out_of_memory_was_due(error, pool, backing, stream) -> None:
    """Check a :class:`PoolOutOfMemoryError` against the model of the pool: no free block of
    the pool could serve the request on ``stream``, and the fake device had less free memory
    than the segment the request needed. The error's figures are the pool's and the device's.
    """
    from cugraphrt._memory.blocks import ALIGNMENT, SMALL_REQUEST_BYTES, round_up, segment_size_for

    size = round_up(max(error.requested_bytes, 1), ALIGNMENT)
    small = size <= SMALL_REQUEST_BYTES
    usable = [end - start for start, (end, tag, segment) in pool._arena._free_at.items()
              if segment.small == small and tag in (None, stream)]
    assert all(free < size for free in usable), (
        f"a free block of {max(usable)} bytes could have served {size}: not out of memory")
    free, total = backing.mem_info()
    assert free < segment_size_for(size), (
        f"the device had {free} bytes free for a segment of {segment_size_for(size)}: not out "
        f"of memory")
    assert (error.device_free_bytes, error.device_total_bytes) == (free, total)
    assert error.reserved_bytes == pool.stats().reserved_bytes

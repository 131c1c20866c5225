"""Memory measurements of the reliability suite."""

from __future__ import annotations

import os

MiB = 1 << 20


def device_used_bytes() -> int:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    free, total = cupy.cuda.runtime.memGetInfo()
    return total - free


def host_rss_bytes() -> int:
    """Resident host memory, after glibc returns its free arena pages to the system.

    Without the trim, memory that Python and the libraries already freed can stay resident
    in malloc's arenas and read as growth; a real leak stays resident either way.
    """
    _trim()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")



#: The memory growth the suite allows: 4 MiB per 1,000 cycles (and 4 MiB for shorter runs,
#: below which allocator caching and page granularity dominate).
GROWTH_PER_1000_CYCLES = 4 * MiB


def growth_limit(cycles: int) -> int:
    return int(GROWTH_PER_1000_CYCLES * max(1.0, cycles / 1000))


def _trim() -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass

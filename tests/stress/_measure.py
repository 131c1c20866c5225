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
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")



#: The memory growth the suite allows: 4 MiB per 1,000 cycles (and 4 MiB for shorter runs,
#: below which allocator caching and page granularity dominate).
GROWTH_PER_1000_CYCLES = 4 * MiB


def growth_limit(cycles: int) -> int:
    return int(GROWTH_PER_1000_CYCLES * max(1.0, cycles / 1000))

"""Holds on a pool's segments, for memory no array owns.

A shape-bucket family lets the next capture reuse the memory of a bucket's outputs: the
outputs become aliases that do not own their blocks, which go back to the pool
(:mod:`cugraphrt._callables.buckets`, "Outputs"). The segment under such an alias must stay on
the device while the alias lives, even once every graph is gone: a :class:`SegmentHold` pins
it, as a live graph pins the segments its capture used, and lets go when it dies.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["SegmentHold"]

_ids = itertools.count(1)


class SegmentHold:
    """Pins segments of ``pool`` under a key of its own until it dies (``MemPool._hold``)."""

    __slots__ = ("pool", "key")

    def __init__(self, pool: Any) -> None:
        self.pool = pool  # the pool outlives its holds
        self.key = ("hold", next(_ids))

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool._unhold(self.key)

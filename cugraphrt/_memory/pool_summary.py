"""Pool statistics summed per device, and a table of every live pool.

Sits above :mod:`cugraphrt._memory.pool` (it walks the live pools) and
:mod:`cugraphrt._cuda.devices`
(it resolves device indices), so neither of those imports the other's concerns.
"""

from __future__ import annotations

from cugraphrt._cuda.devices import resolve_device
from cugraphrt._memory.pool import _all_pools
from cugraphrt.errors import _fmt_bytes
from cugraphrt.options import DeviceStats

__all__ = ["device_stats", "memory_summary"]


# The PoolStats fields DeviceStats sums: every field of it but the device and the pool count.
_SUMMED = tuple(name for name in DeviceStats.model_fields if name not in ("device_id", "pools"))


def device_stats(device: int | None = None) -> list[DeviceStats]:
    """The live graph memory pools summed per device, one entry per device that has any.

    Parameters
    ----------
    device : int, optional
        Only this device (a list of at most one entry).

    Returns
    -------
    list of DeviceStats
        Sorted by device index.
    """
    wanted = None if device is None else resolve_device(device)
    totals: dict[int, dict[str, int]] = {}
    for pool in list(_all_pools):
        s = pool.stats()
        if wanted is not None and s.device_id != wanted:
            continue
        t = totals.setdefault(s.device_id, dict.fromkeys(_SUMMED, 0) | {"pools": 0})
        t["pools"] += 1
        for key in _SUMMED:
            t[key] += getattr(s, key)
    return [DeviceStats(device_id=d, **t) for d, t in sorted(totals.items())]


def memory_summary(device: int | None = None) -> str:
    """A table of every live graph memory pool, one row per pool.

    Parameters
    ----------
    device : int, optional
        Only the pools of this device (:func:`cugraphrt.device_stats` sums them).

    Returns
    -------
    str
        The table (also suitable for printing).
    """
    header = ("pool", "device", "kind", "reserved", "active", "peak", "segments", "graphs",
              "arrays")
    rows = [header]
    for pool in sorted(list(_all_pools), key=lambda p: p.id):
        if device is not None and pool.device_id != device:
            continue
        s = pool.stats()
        rows.append((
            str(s.pool_id), str(s.device_id), "private" if pool._private else "shared",
            _fmt_bytes(s.reserved_bytes), _fmt_bytes(s.active_bytes),
            _fmt_bytes(s.peak_active_bytes), str(s.segments), str(s.live_graphs),
            str(s.live_arrays),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if len(rows) == 1:
        lines.append("(no graph memory pools)")
    return "\n".join(lines)

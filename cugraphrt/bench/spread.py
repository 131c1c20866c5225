"""The spread of a ratio of medians: a paired bootstrap interval over the repeats.

A row's ratio is ``median(subject) / median(reference)``. Its spread is the 95% percentile
interval of that ratio over :data:`RESAMPLES` bootstrap resamples of the repeats. The systems
of a row are measured round by round (A, B, A, B, ...), so the i-th samples of two systems
were taken side by side: a resample draws whole rounds (the same indices for both), and a
drift both systems saw (clock ramps, another process) cancels instead of widening the
interval. Sample lists of different lengths (measured apart) are resampled independently.
The seed is fixed: the same samples give the same interval, so the table rebuilt from a JSON
report shows the same spreads.

A target is *decided inside the spread* when its threshold lies within the interval: the
verdict then says which side the median fell on, not which side the system is on, and the
table marks it ``PASS~`` or ``MISS~``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RESAMPLES", "LEVEL", "ratio_interval", "inside", "format_interval"]

#: Bootstrap resamples per ratio.
RESAMPLES = 2000
#: Coverage of the interval.
LEVEL = 0.95
_SEED = 24


def ratio_interval(subject: Sequence[float],
                   reference: Sequence[float]) -> tuple[float, float] | None:
    """The :data:`LEVEL` bootstrap interval of ``median(subject) / median(reference)``.

    Parameters
    ----------
    subject, reference : sequence of float
        The samples of the two systems, round by round when they were interleaved (equal
        lengths are resampled as pairs).

    Returns
    -------
    (low, high) or None
        None with fewer than 2 samples on either side (a single measurement has no spread),
        or when no resample has a positive reference median.
    """
    s = np.asarray(subject, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if s.size < 2 or r.size < 2:
        return None
    rng = np.random.default_rng(_SEED)
    rounds = rng.integers(0, s.size, (RESAMPLES, s.size))
    s_medians = np.median(s[rounds], axis=1)
    if r.size != s.size:
        rounds = rng.integers(0, r.size, (RESAMPLES, r.size))
    r_medians = np.median(r[rounds], axis=1)
    usable = r_medians > 0
    if not usable.any():
        return None
    ratios = s_medians[usable] / r_medians[usable]
    tail = 50.0 * (1.0 - LEVEL)
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return float(low), float(high)


def inside(threshold: float, interval: tuple[float, float] | None) -> bool:
    """Whether ``threshold`` lies within ``interval`` (the verdict is decided inside the
    spread); False without an interval."""
    return interval is not None and interval[0] <= threshold <= interval[1]


def format_interval(interval: tuple[float, float] | None, digits: int = 2) -> str:
    """``[low, high]`` to ``digits`` decimals, or an empty string without an interval."""
    if interval is None:
        return ""
    return f"[{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"

"""Prints the table of docs/performance.md, "Reading a result near its target": why a row's
ratio is the median of per-round ratios, not the quotient of medians.

The samples are 15 interleaved rounds of ResNet-50 builds on an H100 (2026-11-25), kept in
tests/unit/test_bench_spread.py, which checks the same properties. No GPU is needed::

    python docs/experiments/regime_change.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cugraphrt.bench import spread
from cugraphrt.bench.timing import summarize
from tests.unit.test_bench_spread import RESNET_OURS, RESNET_TORCH


def main() -> None:
    print("| samples used | quotient of medians | median of per-round ratios |")
    print("| --- | --- | --- |")
    for dropped, label in enumerate(("all 15 rounds", "the first round dropped",
                                     "the first two rounds dropped")):
        ours, torch = RESNET_OURS[dropped:], RESNET_TORCH[dropped:]
        quotient = np.median(ours) / np.median(torch)
        per_round = spread.ratio(summarize(ours), summarize(torch))
        print(f"| {label} | {quotient:.3f}x | {per_round:.3f}x |")
    paired = spread.ratio_interval(RESNET_OURS, RESNET_TORCH)
    apart = spread.ratio_interval(RESNET_OURS, RESNET_TORCH[:-1])  # resampled apart
    print(f"\n95% interval of the per-round ratio: {spread.format_interval(paired)}; of the "
          f"quotient of medians (the lists resampled apart): {spread.format_interval(apart)}")


if __name__ == "__main__":
    main()

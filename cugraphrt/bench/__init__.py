"""``cugraphrt bench``: workloads measured against CuPy, PyTorch and torch.compile.

Run ``cugraphrt bench --quick`` (or ``python -m cugraphrt bench``); see
``docs/performance.md`` for the workloads, the targets and how each is measured.
"""

from __future__ import annotations

from .records import BenchRecord, BenchReport, CellNote, RowInfo, TargetResult, WorkloadError
from .runner import main

__all__ = ["main", "BenchRecord", "BenchReport", "CellNote", "RowInfo", "TargetResult",
           "WorkloadError"]

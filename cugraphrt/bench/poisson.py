"""The 2-D Poisson problem the CuPy solver workloads share (``real_cg``, ``cg_tolerance``).

One 5-point Laplacian kernel on a square grid with zero (Dirichlet) boundaries, so that the
fixed-iteration and the run-to-tolerance conjugate-gradient workloads solve the same system
with the same kernel.
"""

from __future__ import annotations

import cupy

__all__ = ["LAPLACIAN", "laplacian"]

#: ``LAPLACIAN(p, n, out)``: ``out`` = the 5-point Laplacian of the flat ``n`` x ``n`` grid ``p``.
LAPLACIAN = cupy.ElementwiseKernel(
    "raw T p, int32 n", "T out",
    """
    const int row = i / n, col = i % n;
    T value = 4 * p[i];
    if (row > 0) value -= p[i - n];
    if (row < n - 1) value -= p[i + n];
    if (col > 0) value -= p[i - 1];
    if (col < n - 1) value -= p[i + 1];
    out = value;
    """,
    "cgrt_bench_laplacian")


def laplacian(p: cupy.ndarray) -> cupy.ndarray:
    """The 5-point Laplacian of a square grid ``p`` with zero (Dirichlet) boundaries."""
    out = cupy.empty_like(p)
    LAPLACIAN(p, p.shape[0], out)
    return out

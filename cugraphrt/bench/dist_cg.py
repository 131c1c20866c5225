"""A distributed conjugate-gradient solve, whole, in one graph launch per rank.

The matrix is split by rows over the ranks; each rank keeps its block of every vector. One
iteration is the Chronopoulos-Gear form of CG, which needs both of its dot products at the
same point, so the ranks exchange them in **one all-reduce per iteration** (and one
all-gather of the residual, for the next matrix-vector product). Every scalar stays on the
device; the loop runs until the residual is small, inside :func:`cugraphrt.while_loop`, so a
solve is one launch per rank whatever its iteration count, with both collectives inside the
loop's body (see docs/distributed.md). The same :meth:`DistributedCG.step` also runs eagerly
and as a graph of one iteration replayed by a host loop: the three give the same iterates.

Used by ``cugraphrt bench --distributed`` (row ``dist_cg``), tests/distributed/loops.py and
examples/distributed_cg.py.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

import cugraphrt

__all__ = ["DistributedCG", "system"]

# p = r + beta p; s = w + beta s; x += alpha p; r -= alpha s: the vector updates of one
# iteration in one kernel (alpha and beta are device scalars).
_UPDATE = cupy.ElementwiseKernel(
    "raw T alpha, raw T beta, T w", "T p, T s, T x, T r",
    """
    p = r + beta[0] * p;
    s = w + beta[0] * s;
    x += alpha[0] * p;
    r -= alpha[0] * s;
    """,
    "cgrt_dist_cg_update")

# From the all-reduced dots (r.r, w.r): the new gamma, beta and alpha, on one thread.
# start=1: the first iteration (beta = 0, alpha = gamma / delta).
_SCALARS = cupy.RawKernel(r"""
extern "C" __global__ void cgrt_dist_cg_scalars(const double* dots, double* gamma,
                                                double* alpha, double* beta, int start) {
    double g = dots[0], delta = dots[1];
    double b = start ? 0.0 : g / gamma[0];
    alpha[0] = start ? g / delta : g / (delta - b * g / alpha[0]);
    beta[0] = b;
    gamma[0] = g;
}
""", "cgrt_dist_cg_scalars")


def system(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric positive-definite ``n`` x ``n`` system ``(A, b)`` in float64, the same on
    every rank: ``A = B B^T / n + I / 10`` with a seeded normal ``B`` (eigenvalues in about
    [0.1, 4.1])."""
    rng = np.random.default_rng(seed)
    b_mat = rng.standard_normal((n, n))
    a = b_mat @ b_mat.T / n + np.eye(n) / 10
    return a, rng.standard_normal(n)


class DistributedCG:
    """CG on this rank's rows of ``A``, all state preallocated (graphs replay on it).

    Parameters
    ----------
    collectives : cugraphrt.distributed.Collectives
        The ranks' communicator (CuPy NCCL).
    a, b : numpy.ndarray
        The whole system (every rank passes the same); this rank keeps its rows.
    tol : float
        Stop when ``||r|| <= tol * ||b||``.
    """

    def __init__(self, collectives: Any, a: np.ndarray, b: np.ndarray, tol: float) -> None:
        n = b.shape[0]
        world, rank = collectives.world_size, collectives.rank
        if n % world:
            raise ValueError(f"n = {n} must divide over {world} ranks")
        rows = slice(rank * n // world, (rank + 1) * n // world)
        self.coll = collectives
        self.a = cupy.asarray(a[rows])
        self.b = cupy.asarray(b[rows])
        local = self.b.shape[0]
        self.x, self.p, self.s = (cupy.zeros(local) for _ in range(3))
        self.rw = cupy.zeros((2, local))  # r and w = A r, one matrix: both dots in one gemv
        self.r, self.w = self.rw[0], self.rw[1]
        self.r_full = cupy.zeros((world, local))
        self.dots = cupy.zeros(2)
        self.gamma, self.alpha, self.beta = (cupy.zeros(1) for _ in range(3))
        self.limit = cupy.asarray(tol * tol * float(np.dot(b, b)))

    def _exchange(self, start: int) -> None:
        """w = A r (after gathering r), then the dots and the scalars."""
        self.coll.all_gather(self.r, out=self.r_full)
        cupy.matmul(self.a, self.r_full.reshape(-1), out=self.w)
        cupy.matmul(self.rw, self.r, out=self.dots)  # (r.r, w.r) of this rank's rows
        self.coll.all_reduce(self.dots, out=self.dots)  # the iteration's one all-reduce
        _SCALARS((1,), (1,), (self.dots, self.gamma, self.alpha, self.beta, np.int32(start)))

    def start(self) -> None:
        """x = 0, r = b, p = s = 0, and the first scalars."""
        self.x.fill(0)
        self.p.fill(0)
        self.s.fill(0)
        self.r[...] = self.b
        self._exchange(start=1)

    def step(self) -> None:
        """One iteration: the vector updates, one all-gather, one all-reduce."""
        _UPDATE(self.alpha, self.beta, self.w, self.p, self.s, self.x, self.r)
        self._exchange(start=0)

    def going(self) -> cupy.ndarray:
        """Whether ``||r||^2`` is still above the limit (a 0-d device bool)."""
        return self.gamma[0] > self.limit

    def solve_while_loop(self, max_iters: int | None = None) -> cupy.ndarray:
        """Start and loop on the device until converged; returns the iteration count."""
        self.start()
        return cugraphrt.while_loop(self.going, self.step, max_iters=max_iters)

    def solve_host(self, step=None) -> int:
        """Start, then step while the host reads the residual after every iteration
        (``step``: a replay of a captured :meth:`step`, or eager when None)."""
        self.start()
        count = 0
        while bool(self.going()):
            (step or self.step)()
            count += 1
        return count

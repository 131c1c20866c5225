"""Conjugate gradient to a tolerance as one graph launch, with cugraphrt.while_loop.

The solver loops until the residual is small, a condition only the device knows. Captured
with cugraphrt.while_loop, the loop is a CUDA conditional node: each replay runs as many
iterations as its right-hand side needs, with no host round trip. The same function runs
eagerly outside a capture, which is how this example checks the graph.

Run: python examples/control_flow_cg.py
"""

from __future__ import annotations

import cupy
import numpy as np

import cugraphrt

N = 256  # a 256 x 256 grid: 65,536 unknowns
TOL = 1e-6  # relative residual


def laplace(p: cupy.ndarray, out: cupy.ndarray) -> None:
    """The 5-point Laplacian with zero boundary values, on an N x N grid (flattened)."""
    grid, result = p.reshape(N, N), out.reshape(N, N)
    result[...] = 4 * grid
    result[1:] -= grid[:-1]
    result[:-1] -= grid[1:]
    result[:, 1:] -= grid[:, :-1]
    result[:, :-1] -= grid[:, 1:]


class Solver:
    """CG state, preallocated: a graph reads and writes these arrays on every replay."""

    def __init__(self) -> None:
        self.b, self.x, self.r, self.p, self.ap = (cupy.zeros(N * N) for _ in range(5))
        self.rr, self.limit = cupy.zeros(()), cupy.zeros(())

    def solve(self, max_iters: int | None = None) -> cupy.ndarray:
        """Solve A x = b; returns the number of iterations (a 0-d device array)."""
        self.x.fill(0)
        self.r[...] = self.b
        self.p[...] = self.b
        self.rr[...] = cupy.sum(self.r * self.r)
        self.limit[...] = TOL * TOL * self.rr
        return cugraphrt.while_loop(lambda: self.rr > self.limit, self.step,
                                    max_iters=max_iters)

    def step(self) -> None:
        laplace(self.p, self.ap)
        alpha = self.rr / cupy.sum(self.p * self.ap)
        self.x += alpha * self.p
        self.r -= alpha * self.ap
        rr_new = cupy.sum(self.r * self.r)
        self.p *= rr_new / self.rr
        self.p += self.r
        self.rr[...] = rr_new


def main() -> None:
    rng = np.random.default_rng(0)
    smooth = np.outer(np.sin(np.linspace(0, np.pi, N)), np.sin(np.linspace(0, np.pi, N)))
    problems = [rng.standard_normal(N * N), smooth.ravel()]  # hard and easy right-hand sides

    solver = Solver()
    solver.b[...] = cupy.asarray(problems[0])
    solver.solve(max_iters=2)  # warm up every kernel eagerly

    graph = cugraphrt.Graph()
    with cugraphrt.graph(graph):
        iterations = solver.solve()  # captured once: the loop is a conditional node

    for b in problems:
        solver.b[...] = cupy.asarray(b)
        graph.replay()  # one launch solves to the tolerance, however many iterations
        graphed = (int(iterations), solver.x.copy())
        eager = int(solver.solve())  # the same code, run eagerly: the host reads rr
        assert graphed[0] == eager, (graphed[0], eager)
        cupy.testing.assert_allclose(graphed[1], solver.x, rtol=1e-12, atol=1e-12)
        residual = solver.b.copy()
        laplace(solver.x, residual)
        relative = float(cupy.linalg.norm(solver.b - residual) / cupy.linalg.norm(solver.b))
        print(f"{graphed[0]:4d} iterations in one launch (eager: {eager}); "
              f"relative residual {relative:.1e}")
        assert relative < 10 * TOL

    solver.b[...] = cupy.asarray(problems[0])  # the hard one: far more than 50 iterations
    capped = cugraphrt.Graph()
    with cugraphrt.graph(capped):
        capped_iterations = solver.solve(max_iters=50)  # a device-side iteration budget
    capped.replay()
    assert int(capped_iterations) == 50
    print("max_iters=50 stopped the loop after", int(capped_iterations), "iterations")


if __name__ == "__main__":
    main()

"""Collectives inside device-side loops and branches give eager's results (torchrun script).

Parts (argv):

* ``torch``: torch.distributed all-reduces before, inside and after a
  ``cugraphrt_torch.while_loop``, and inside a ``cugraphrt_torch.cond`` nested in it (its
  predicate computed from an all-reduced value, so the same on every rank); 20 replays with
  fresh inputs against the same code run eagerly; the bodies hold only node kinds a body may
  hold, and NCCL's event nodes were taken out of them.
* ``cupy``: the same with :class:`cugraphrt.distributed.Collectives` (an all-gather in the
  branch), in ``cugraphrt.while_loop`` and ``cugraphrt.cond``.
* ``cg``: the distributed conjugate gradient of ``cugraphrt.bench.dist_cg`` (all-reduce and
  all-gather in the loop body): the one-launch solve, a host loop of per-iteration replays
  and eager give the same iteration count and the same iterates, and solve the system
  (float64 numpy reference).
* ``mismatch``: rank 1 issues one all-reduce fewer per iteration than rank 0; the first
  replay raises the same CaptureError on every rank, naming the collective and its body.
"""

from __future__ import annotations

import os
import sys

import cugraphrt_torch
import numpy as np
import torch
import torch.distributed as dist
from _dist import ok, run_parts, same
from cugraphrt_torch.distributed import capture_stream, check_capture

import cugraphrt
from cugraphrt import CaptureError

N = 4096
REPLAYS = 20
ITERATIONS = 4
# What a body may hold (CUDA 12.4 to 13); NCCL's mixing events are taken out of it.
BODY_KINDS = {"KERNEL", "MEMCPY", "MEMSET", "EMPTY", "GRAPH", "CONDITIONAL"}
MIXING = os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "1") != "0"


def check_bodies(g: cugraphrt.Graph, world: int, labels: list[str],
                 with_collectives: int) -> None:
    """Every body (``labels``, in capture order) holds only what a body may hold; NCCL's
    events were taken out of the first ``with_collectives`` bodies, whose collectives added
    them (on more than one rank, with NCCL's graph mixing on), and none out of the others."""
    bodies = g.body_nodes
    assert [b.label for b in bodies] == labels, bodies
    for i, body in enumerate(bodies):
        assert set(body.kinds) <= BODY_KINDS, body
        assert "KERNEL" in body.kinds, body
        if i >= with_collectives:
            assert body.taken_out == 0, body
        elif world > 1 and MIXING:
            assert body.taken_out >= 2, body


def _warm(fn) -> None:
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def part_torch(rank: int, world: int, device) -> None:
    check_capture()
    x = torch.empty(N, device=device)
    y, z = torch.empty_like(x), torch.empty_like(x)
    count = torch.zeros((), dtype=torch.int64, device=device)

    def body():
        dist.all_reduce(y)  # the same on every rank from here
        flag = y[0] > 0  # so the branch is the same on every rank

        def positive():
            z.copy_(y)
            dist.all_reduce(z)
            y.add_(z, alpha=1e-3)

        y.mul_(0.5)
        cugraphrt_torch.cond(flag, positive, lambda: y.sub_(1.0))
        y.add_(rank * 0.25)  # the ranks differ again
        count.add_(1)

    def work():
        y.copy_(x)
        dist.all_reduce(y)  # at the top level, before the loop
        count.zero_()
        cugraphrt_torch.while_loop(lambda: count < ITERATIONS, body)
        dist.all_reduce(y)  # and after it

    generator = torch.Generator(device=device).manual_seed(4000 + rank)
    x.normal_(generator=generator)
    _warm(work)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        work()
    check_bodies(g, world, ["while_loop body", "while_loop body > cond body",
                            "while_loop body > cond else body"], with_collectives=2)
    for i in range(REPLAYS):
        x.normal_(generator=generator)
        if i % 2:
            x.neg_()  # both branches
        g.replay(torch.cuda.current_stream())
        got = y.clone()
        assert int(count) == ITERATIONS
        work()  # eagerly: the loop and the branch read their predicates on the host
        same(got, y, f"replay {i}", exact=world <= 2)
    ok("torch")


def part_cupy(rank: int, world: int, device) -> None:
    import cupy
    from cupy.cuda import nccl

    from cugraphrt.distributed import Collectives

    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    with cupy.cuda.Device(device.index):
        coll = Collectives(nccl.NcclCommunicator(world, uid[0], rank))
        x = cupy.empty(N, dtype=cupy.float32)
        y = cupy.empty_like(x)
        gathered = cupy.empty((world, N), dtype=cupy.float32)
        count = cupy.zeros((), dtype=cupy.int64)

        def body():
            coll.all_reduce(y, out=y)
            flag = y[0] > 0

            def positive():
                coll.all_gather(y, out=gathered)
                y[...] += gathered.sum(axis=0) * 1e-3

            y[...] *= 0.5
            cugraphrt.cond(flag, positive)
            y[...] += rank * 0.25
            cupy.add(count, 1, out=count)

        def work():
            y[...] = x
            count[...] = 0
            cugraphrt.while_loop(lambda: count < ITERATIONS, body)

        rng = cupy.random.default_rng(5000 + rank)
        x[...] = rng.standard_normal(N, dtype=cupy.float32)
        work()  # warm-up: Collectives refuses to capture what never ran eagerly,
        coll.all_gather(y, out=gathered)  # the branch's collective too, whichever ran
        g = cugraphrt.Graph()
        with cugraphrt.graph(g):
            work()
        check_bodies(g, world, ["while_loop body", "while_loop body > cond body"],
                     with_collectives=2)
        for i in range(REPLAYS):
            x[...] = rng.standard_normal(N, dtype=cupy.float32) * (1 if i % 2 else -1)
            g.replay()
            got = y.copy()
            assert int(count) == ITERATIONS
            work()
            if not bool((got == y).all()):
                raise AssertionError(f"replay {i}: cupy loop differs from eager")
        cupy.cuda.get_current_stream().synchronize()
        del g
        coll.close()
    ok("cupy")


def _same(got, want, world: int) -> bool:
    """Equal bit for bit on 2 ranks (a sum of two is exact in any order); to 1e-12 beyond,
    where NCCL may add the ranks' dot products in another order."""
    import cupy

    if world <= 2:
        return bool((got == want).all())
    return bool(cupy.allclose(got, want, rtol=1e-12, atol=0))


def part_cg(rank: int, world: int, device) -> None:
    import cupy
    from cupy.cuda import nccl

    from cugraphrt.bench.dist_cg import DistributedCG, system
    from cugraphrt.distributed import Collectives

    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    n = 256 * world
    with cupy.cuda.Device(device.index):
        coll = Collectives(nccl.NcclCommunicator(world, uid[0], rank))
        a, b = system(n, seed=11)
        cg = DistributedCG(coll, a, b, tol=1e-10)
        eager = cg.solve_host()
        want = cg.x.copy()
        one = cugraphrt.Graph()
        with cugraphrt.graph(one):
            cg.step()
        host = cg.solve_host(one.replay)
        assert host == eager, (host, eager)
        assert _same(cg.x, want, world), "per-iteration replays differ from eager"
        whole = cugraphrt.Graph()
        with cugraphrt.graph(whole):
            count = cg.solve_while_loop()
        check_bodies(whole, world, ["while_loop body"], with_collectives=1)
        for _ in range(3):
            cg.x.fill(0)
            whole.replay()
            assert int(count) == eager, (int(count), eager)
            assert _same(cg.x, want, world), "the one-launch solve differs from eager"
        rows = slice(rank * n // world, (rank + 1) * n // world)
        exact = np.linalg.solve(a, b)[rows]
        np.testing.assert_allclose(cupy.asnumpy(cg.x), exact, rtol=0, atol=1e-7)
        assert 10 < eager < 500, eager
        del one, whole
        coll.close()
    ok("cg")


def part_mismatch(rank: int, world: int, device) -> None:
    check_capture()
    y = torch.randn(N, device=device)
    count = torch.zeros((), dtype=torch.int64, device=device)
    _warm(lambda: dist.all_reduce(y.clone()))

    def body():
        dist.all_reduce(y)
        if rank == 0:  # the bug under test: rank 0 issues one more per iteration
            dist.all_reduce(y)
        count.add_(1)

    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        count.zero_()
        cugraphrt_torch.while_loop(lambda: count < 3, body)
    try:
        g.replay(torch.cuda.current_stream())
    except CaptureError as exc:
        message = str(exc)
    else:
        raise AssertionError("a loop whose collectives differ between the ranks replayed")
    group = dist.group.WORLD.group_name
    expected = (f"got at collective #1: rank 0: all_reduce float32[{N}] sum on group "
                f"'{group}' in a while_loop body; rank 1: nothing")
    assert expected in message, message
    z = y.clone()  # nothing was launched: NCCL is still in step
    dist.all_reduce(z)
    torch.cuda.synchronize()
    ok("mismatch")


if __name__ == "__main__":
    run_parts({"torch": part_torch, "cupy": part_cupy, "cg": part_cg,
               "mismatch": part_mismatch}, sys.argv[1:])

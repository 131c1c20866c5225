"""A distributed conjugate-gradient solve in one graph launch per rank.

Run with one process per GPU:

    torchrun --standalone --nproc-per-node 2 examples/distributed_cg.py

The matrix is split by rows over the ranks. Each iteration gathers the residual (all-gather,
for the matrix-vector product) and exchanges its two dot products (one all-reduce); both
collectives sit inside the body of a ``cugraphrt.while_loop``, so the whole solve, whatever
its iteration count, is one replay, decided on the device. cugraphrt takes out of the body
the event nodes NCCL adds around a captured collective, which a loop body cannot hold (see
docs/distributed.md). The solve is checked against a host loop of per-iteration replays and
against numpy's float64 solution.
"""

from __future__ import annotations

import os
import time

import cupy
import numpy as np
import torch
import torch.distributed as dist
from cupy.cuda import nccl

import cugraphrt
from cugraphrt.bench.dist_cg import DistributedCG, system
from cugraphrt.distributed import Collectives


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)  # torch only brings the ranks together
    with cupy.cuda.Device(local_rank):
        coll = Collectives(nccl.NcclCommunicator(world, uid[0], rank))
        n = 512 * world
        a, b = system(n, seed=1)
        cg = DistributedCG(coll, a, b, tol=1e-10)

        iterations = cg.solve_host()  # eager (and the collectives' warm-up)
        one_step = cugraphrt.Graph()
        with cugraphrt.graph(one_step):
            cg.step()
        assert cg.solve_host(one_step.replay) == iterations  # a host loop of replays
        per_iteration = cg.x.copy()

        whole = cugraphrt.Graph()
        with cugraphrt.graph(whole):
            count = cg.solve_while_loop()  # the whole solve, one launch
        start = time.perf_counter()
        whole.replay()
        cupy.cuda.get_current_stream().synchronize()
        elapsed = time.perf_counter() - start

        assert int(count) == iterations and bool((cg.x == per_iteration).all())
        rows = slice(rank * n // world, (rank + 1) * n // world)
        error = float(np.abs(cupy.asnumpy(cg.x) - np.linalg.solve(a, b)[rows]).max())
        assert error < 1e-7, error
        if rank == 0:
            print(f"{world} ranks: {iterations} iterations in one launch ({elapsed * 1e3:.2f} "
                  f"ms), equal to the per-iteration replays; max error {error:.1e} against "
                  f"numpy's float64 solve")
        del one_step, whole  # NCCL waits for the graphs that hold a communicator
        coll.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

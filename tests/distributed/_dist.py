"""What every torchrun script of this folder shares: one GPU per rank, NCCL, checks."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup() -> tuple[int, int, torch.device]:
    """Bind this rank to its GPU and join the NCCL group; returns (rank, world, device)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    # Exact comparisons: no TF32 rounding that could differ between kernels.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return dist.get_rank(), dist.get_world_size(), device


def ok(check: str) -> None:
    """Report a passed check for this rank (the launcher counts these lines)."""
    print(f"OK {check} rank={dist.get_rank()}", flush=True)


def same(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool = True) -> None:
    """Raise unless ``got`` equals ``want`` (bit for bit when ``exact``)."""
    if exact:
        if not torch.equal(got, want):
            diff = (got.double() - want.double()).abs().max().item()
            raise AssertionError(f"{what}: differs from eager (max abs diff {diff:.3e})")
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=what)


def teardown() -> None:
    """Leave the group. Graphs holding collectives may still be alive here (a graphed
    module references itself, so only a garbage collection frees it): cugraphrt_torch
    releases them before the communicator goes, else NCCL would wait for them forever."""
    rank = dist.get_rank()
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    ok_line = f"OK teardown rank={rank}"
    print(ok_line, flush=True)


def run_parts(parts: dict, argv: list[str]) -> None:
    """Join the group, run the parts named in ``argv`` (all by default), leave the group."""
    rank, world, device = setup()
    for name in argv or list(parts):
        parts[name](rank, world, device)
    teardown()

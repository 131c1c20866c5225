"""Collectives and data-parallel training in captured graphs, under torchrun.

Each test starts a script of this folder with ``python -m torch.distributed.run
--nproc-per-node N`` and checks that every rank passed. With N = 2 they are the multi-GPU
tests (skipped with fewer than 2 GPUs). With N = 1 (a world of one rank, where an
all-reduce is a copy) they prove the capture plumbing end to end on one GPU, not the
communication. Run: ``python -m pytest -q -p no:cacheprovider tests/distributed``.
"""

from __future__ import annotations

import pytest

from ._launch import ROOT, WORLD, passed, skip_unless_gpus, torchrun

pytestmark = pytest.mark.gpu
NPROC = [pytest.param(1, marks=skip_unless_gpus(1), id="1rank"),
         pytest.param(WORLD, marks=skip_unless_gpus(WORLD), id=f"{WORLD}ranks")]


@pytest.mark.parametrize("nproc", NPROC)
@pytest.mark.parametrize("part", ["graph", "callables", "cupy"])
def test_collectives_in_graphs_match_eager_over_100_replays(part, nproc):
    if part == "cupy":
        nccl = pytest.importorskip("cupy.cuda.nccl")
        if not nccl.available:
            pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    assert passed(torchrun("collectives.py", part, nproc=nproc), part, nproc=nproc)


@pytest.mark.parametrize("nproc", NPROC)
@pytest.mark.parametrize("part", ["step", "callables", "ddp_step"])
def test_graphed_data_parallel_training_equals_eager(part, nproc):
    assert passed(torchrun("ddp_training.py", part, nproc=nproc), part, nproc=nproc)


@pytest.mark.parametrize("nproc", NPROC)
def test_the_ddp_example_runs(nproc):
    out = torchrun(str(ROOT / "examples" / "distributed_ddp_step.py"), nproc=nproc)
    assert "losses equal to eager DDP's" in out

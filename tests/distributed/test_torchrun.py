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


def _cases(parts, *, short=()):
    """(part, nproc) for every part on 1 and on WORLD ranks. The one-rank runs prove only
    the capture plumbing (about 20 s each): those not in ``short`` are marked long."""
    cases = []
    for part in parts:
        long = [] if part in short else [pytest.mark.long]
        cases.append(pytest.param(part, 1, marks=[skip_unless_gpus(1), *long],
                                  id=f"{part}-1rank"))
        cases.append(pytest.param(part, WORLD, marks=skip_unless_gpus(WORLD),
                                  id=f"{part}-{WORLD}ranks"))
    return cases


@pytest.mark.parametrize("part, nproc", _cases(["graph", "callables", "cupy"],
                                               short=("graph",)))
def test_collectives_in_graphs_match_eager_over_100_replays(part, nproc):
    if part == "cupy":
        nccl = pytest.importorskip("cupy.cuda.nccl")
        if not nccl.available:
            pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    assert passed(torchrun("collectives.py", part, nproc=nproc), part, nproc=nproc)


@pytest.mark.parametrize("part, nproc", _cases(["step", "callables", "ddp_step"]))
def test_graphed_data_parallel_training_equals_eager(part, nproc):
    assert passed(torchrun("ddp_training.py", part, nproc=nproc), part, nproc=nproc)


@pytest.mark.parametrize("nproc", [
    pytest.param(1, marks=[skip_unless_gpus(1), pytest.mark.long], id="1rank"),
    pytest.param(WORLD, marks=skip_unless_gpus(WORLD), id=f"{WORLD}ranks")])
def test_the_ddp_example_runs(nproc):
    out = torchrun(str(ROOT / "examples" / "distributed_ddp_step.py"), nproc=nproc)
    assert "losses equal to eager DDP's" in out

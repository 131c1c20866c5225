"""Collectives and data-parallel training in captured graphs, on 2 GPUs under torchrun.

Each test starts a script of this folder with ``python -m torch.distributed.run
--nproc-per-node 2`` and checks that both ranks passed. They skip with fewer than 2 GPUs.
Run: ``python -m pytest -q -p no:cacheprovider tests/distributed``.
"""

from __future__ import annotations

import pytest

from ._launch import ROOT, passed, skip_unless_gpus, torchrun

pytestmark = [pytest.mark.gpu, skip_unless_gpus(2)]


@pytest.mark.parametrize("part", ["graph", "callables", "cupy"])
def test_collectives_in_graphs_match_eager_over_100_replays(part):
    if part == "cupy":
        nccl = pytest.importorskip("cupy.cuda.nccl")
        if not nccl.available:
            pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    assert passed(torchrun("collectives.py", part), part)


@pytest.mark.parametrize("part", ["step", "callables", "ddp_step"])
def test_graphed_data_parallel_training_equals_eager(part):
    assert passed(torchrun("ddp_training.py", part), part)


def test_the_ddp_example_runs():
    out = torchrun(str(ROOT / "examples" / "distributed_ddp_step.py"))
    assert "losses equal to eager DDP's" in out

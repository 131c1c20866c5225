"""The torchrun scripts on ONE GPU (a world of one rank): NCCL inside captures, the checks
and the training comparisons run end to end where only one GPU is available. A one-rank
all-reduce is a copy, so these prove the capture plumbing, not the communication; the 2-GPU
tests (test_multi_gpu.py) prove that.
"""

from __future__ import annotations

import pytest

from ._launch import ROOT, passed, skip_unless_gpus, torchrun

pytestmark = [pytest.mark.gpu, skip_unless_gpus(1)]


@pytest.mark.parametrize("part", ["graph", "callables", "cupy"])
def test_collectives_in_graphs_one_rank(part):
    if part == "cupy":
        nccl = pytest.importorskip("cupy.cuda.nccl")
        if not nccl.available:
            pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    assert passed(torchrun("collectives.py", part, nproc=1), part, nproc=1)


@pytest.mark.parametrize("part", ["step", "callables", "ddp_step"])
def test_graphed_training_one_rank(part):
    assert passed(torchrun("ddp_training.py", part, nproc=1), part, nproc=1)


def test_the_ddp_example_runs():
    out = torchrun(str(ROOT / "examples" / "distributed_ddp_step.py"), nproc=1)
    assert "losses equal to eager DDP's" in out

"""The Generator over a tensor-parallel model without a GPU: two ranks over gloo on the CPU,
the program run eagerly (``graphed=False``), against the same model's eager ``generate``,
then sampled, the same tokens on both ranks (``generation.py cpu``; the graphed part runs on
GPUs in ``test_torchrun``)."""

from __future__ import annotations

import pytest

from ._launch import passed, torchrun

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_a_tensor_parallel_model_generates_its_eager_tokens_on_every_rank():
    out = torchrun("generation.py", "cpu", nproc=2, env={"CUDA_VISIBLE_DEVICES": ""})
    assert passed(out, "greedy-tokens", 2) and passed(out, "sampled", 2)
    assert passed(out, "cpu", 2) and passed(out, "teardown", 2)

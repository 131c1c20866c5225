"""The Generator's decode experts (cugraphrt_torch.inference.expert_matmul) on the CPU.

``batched_mm``'s forward registered under a name of ours, with the projections computed by
the ``cugraphrt::gathered_matmul`` op, must give transformers' own ``batched_mm`` bit for
bit: whatever way the op computes (on the CPU, the gather and ``torch.bmm``), every other
operation of the forward is transformers'. The models cover gated experts without biases
(Mixtral, Qwen3-MoE) and gpt-oss's (biases, transposed weights, its own gate).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cugraphrt_torch.inference import expert_matmul  # noqa: E402

from cugraphrt.adapter import blas  # noqa: E402


def _experts_of(arch: str, dtype):
    from cugraphrt.bench.generate_models import causal_lm

    torch.manual_seed(0)
    model = causal_lm(arch, layers=1, hidden=64, vocab=128, window=8).to(dtype).eval()
    (experts,) = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    return model, experts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_the_registered_experts_equal_batched_mm_bit_for_bit(arch, dtype):
    model, experts = _experts_of(arch, dtype)
    name = expert_matmul.register()
    tokens = 7
    hidden = torch.randn(tokens, 64, dtype=dtype)
    top_k = model.config.num_experts_per_tok
    logits = torch.randn(tokens, experts.num_experts)
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = weights.to(dtype)
    ids[0, 0] = experts.num_experts + 3  # an expert-parallel sentinel: clamped, as batched_mm
    outputs = {}
    for implementation in ("batched_mm", name):
        model.set_experts_implementation(implementation)
        with torch.no_grad():
            outputs[implementation] = experts(hidden, ids, weights)
    assert outputs[name].dtype == dtype
    assert torch.equal(outputs[name], outputs["batched_mm"])
    assert not torch.equal(outputs[name], torch.zeros_like(outputs[name]))


@pytest.mark.parametrize("transposed", [False, True])
def test_the_op_computes_each_pairs_product_and_passes_torchs_checks(transposed):
    weights = torch.randn(5, 6, 3, dtype=torch.float64)
    ids = torch.tensor([4, 0, 0, 2])
    x = torch.randn(4, 6 if transposed else 3, dtype=torch.float64)
    got = expert_matmul.gathered_matmul(weights, ids, x, transposed)
    for s, e in enumerate(ids.tolist()):
        want = x[s] @ weights[e] if transposed else weights[e] @ x[s]
        assert torch.allclose(got[s], want, rtol=0, atol=1e-12)
    # Schema, fake (meta) implementation and dispatch agree: what torch.compile relies on.
    torch.library.opcheck(expert_matmul.gathered_matmul, (weights, ids, x, transposed),
                          test_utils=("test_schema", "test_faketensor"))


def test_off_the_gpu_no_shape_is_checked_and_the_gather_computes(monkeypatch):
    weights = torch.randn(3, 4, 5)
    ids, x = torch.tensor([1, 2]), torch.randn(2, 5)
    before = expert_matmul.checked_shapes()
    monkeypatch.setattr(expert_matmul, "_pointer_gemm", None)  # would raise if reached
    got = expert_matmul.gathered_matmul(weights, ids, x, False)
    assert expert_matmul.checked_shapes() == before
    assert torch.equal(got, torch.bmm(weights[ids], x.unsqueeze(-1)).squeeze(-1))


def test_mapped_libraries_lists_each_file_once_by_its_real_path():
    import os

    found = blas.mapped_libraries("libc.so")  # every CPython process maps the C library
    assert found and all(os.path.isabs(p) and os.path.realpath(p) == p for p in found)
    assert len(found) == len(set(found))
    assert blas.mapped_libraries("no-such-library-") == []


def test_a_layout_cublas_refuses_counts_as_a_shape_that_does_not_fit(monkeypatch):
    from cugraphrt.errors import CugraphrtError

    def refused(*args):
        raise CugraphrtError("cublasGemmBatchedEx failed (got cuBLAS status 15)")

    monkeypatch.setattr(expert_matmul, "_pointer_gemm", refused)
    assert expert_matmul._same_bits(torch.randn(3, 4, 5), torch.randn(2, 5), False) is False


def test_registering_again_keeps_the_same_forward_which_dynamo_guards_on():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    name = expert_matmul.register()
    first = ALL_EXPERTS_FUNCTIONS[name]
    assert expert_matmul.register() == name
    assert ALL_EXPERTS_FUNCTIONS[name] is first


def test_a_compiled_step_compiles_once_over_many_switches_to_our_experts():
    # The Generator's decode switches the experts to ours around every step (and registers
    # them again): the compiled step must not recompile for that, as it would if each
    # registration made a new function for dynamo's guard on the implementation.
    model, experts = _experts_of("mixtral", torch.float32)
    compiles = []

    def count(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    torch.compiler.reset()
    step = torch.compile(lambda h, i, w: experts(h, i, w), backend=count)
    hidden = torch.randn(3, 64)
    weights, ids = torch.topk(torch.randn(3, experts.num_experts).softmax(-1), 2, dim=-1)
    outputs = []
    for _ in range(4):
        model.set_experts_implementation(expert_matmul.register())
        outputs.append(step(hidden, ids, weights))
        model.set_experts_implementation("batched_mm")
    assert len(compiles) == 1
    model.set_experts_implementation("batched_mm")
    assert all(torch.equal(o, experts(hidden, ids, weights)) for o in outputs)

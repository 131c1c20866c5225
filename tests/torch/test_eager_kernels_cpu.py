"""eager_numerics="exact" without a GPU: which ops run eager's kernels, the lowering patch's
scope, and Inductor's code calling eager's kernels (compiled for the GPU where there is one,
bit for bit; else with Inductor's C++ backend, which rounds otherwise)."""

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.lowering")

from cugraphrt_torch.compile import _eager_kernels  # noqa: E402

aten = torch.ops.aten


def test_every_listed_op_exists_in_this_torch():
    # A name that resolves to nothing would silently leave an op to Inductor's kernels.
    missing = [name for name in _eager_kernels.EAGER_KERNEL_OPS
               if getattr(getattr(torch.ops.aten, name.partition(".")[0], None),
                          name.partition(".")[2], None) is None]
    assert set(missing) <= set(_eager_kernels.NEWER_OPS)


def test_the_lowering_patch_is_scoped_to_the_with():
    from torch._inductor import lowering

    before = {op: lowering.lowerings.get(op) for op in (aten.mean.dim, aten.silu.default,
                                                          aten.pow.Tensor_Scalar)}
    with _eager_kernels.eager_kernel_lowerings("exact"):
        assert lowering.lowerings[aten.mean.dim]._is_fallback_handler
        assert lowering.lowerings[aten.silu.default]._is_fallback_handler
        assert lowering.lowerings[aten.pow.Tensor_Scalar] is not before[aten.pow.Tensor_Scalar]
    assert {op: lowering.lowerings.get(op) for op in before} == before
    with _eager_kernels.eager_kernel_lowerings(True):  # eager's rounding alone: no patch
        assert {op: lowering.lowerings.get(op) for op in before} == before


def test_the_patch_is_undone_when_the_compilation_raises():
    from torch._inductor import lowering

    before = lowering.lowerings.get(aten.mean.dim)
    with pytest.raises(RuntimeError, match="boom"):
        with _eager_kernels.eager_kernel_lowerings("exact"):
            raise RuntimeError("boom")
    assert lowering.lowerings.get(aten.mean.dim) is before


def _rms_silu(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    h = h.to(x.dtype) * w
    return torch.nn.functional.silu(h) * h.cos() + h.pow(2.5).nan_to_num()


# A CUDA compilation takes seconds where a cold C++ one takes a minute: the GPU machine
# compiles for its GPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _compiled_calls(numerics):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x = torch.randn(4, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    w = torch.randn(64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    x, w = x.to(DEVICE), w.to(DEVICE)
    compiled = torch.compile(_rms_silu, backend=_eager_kernels.inductor_backend(numerics))
    out, code = run_and_get_code(compiled, x, w)
    # Calls, not comments: Triton kernels' headers name the aten nodes they fuse.
    lines = (line.partition("#")[0] for text in code for line in text.splitlines())
    calls = set(re.findall(r"torch\.ops\.aten\.(\w+\.\w+)\(", "\n".join(lines)))
    return out, _rms_silu(x, w), calls


def test_exact_calls_eager_kernels_for_reductions_and_math():
    out, eager, calls = _compiled_calls("exact")
    # x ** 2 stays fused (Inductor multiplies as eager does); x ** 2.5 is eager's pow.
    assert {"mean.dim", "silu.default", "cos.default", "pow.Tensor_Scalar"} <= calls
    if DEVICE == "cuda":
        assert torch.equal(out, eager)
    else:  # bits are the GPU's promise; Inductor's C++ rounds otherwise
        torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)


def test_rounding_alone_fuses_everything():
    out, eager, calls = _compiled_calls(True)
    assert not calls & {"mean.dim", "silu.default", "cos.default", "pow.Tensor_Scalar"}
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)


def test_exact_refuses_a_graph_that_trains():
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 8).to(DEVICE)
    compiled = torch.compile(model, backend="cugraphrt", options={"eager_numerics": "exact"})
    # Dynamo reports a backend's error as BackendCompilerFailed, naming it.
    with pytest.raises(Exception, match="OptionsError: invalid value for option "
                                        "'eager_numerics'") as info:
        compiled(torch.randn(2, 8, device=DEVICE))
    assert "aot_eager" in str(info.value)
    with torch.no_grad():  # inference compiles (and on a GPU, captures and replays)
        for _ in range(3):
            x = torch.randn(2, 8, device=DEVICE)
            torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)

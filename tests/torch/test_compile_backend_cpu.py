"""The "cugraphrt" torch.compile backend without a GPU: options, analysis, report, fallback."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import tomllib

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.compile import _fx_inspect, dynamo  # noqa: E402

import cugraphrt  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_entry_point_names_the_backend():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["torch_dynamo_backends"]["cugraphrt"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is dynamo.backend


@pytest.mark.parametrize("options, field", [
    ({"compiler": "tvm"}, "compiler"), ({"strict": "yes"}, "strict"), ({"warmup": 0}, "warmup"),
    ({"max_graphs": 0}, "max_graphs"), ({"max_rerecords": -1}, "max_rerecords"),
    ({"copy_output": True}, "copy_output"), ({"eager_numerics": "bits"}, "eager_numerics")])
def test_bad_options_name_the_field(options, field):
    with pytest.raises(cugraphrt.OptionsError, match=f"'{field}'"):
        dynamo.backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)],
                       options=options)


def test_a_mode_is_refused():
    with pytest.raises(cugraphrt.OptionsError, match="takes no mode"):
        dynamo.backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)],
                       mode="max-autotune")


def test_defaults():
    opts = dynamo.CompileOptions()
    assert (opts.compiler, opts.strict, opts.warmup, opts.copy_outputs) == \
        ("inductor", False, 1, True)
    assert opts.max_graphs >= 1 and opts.max_rerecords >= 0


@pytest.mark.parametrize("eager_numerics", [False, True, "exact"])
def test_eager_numerics_patches_inductor_for_this_compilation_only(monkeypatch, eager_numerics):
    import torch._inductor.compile_fx as compile_fx_module
    import torch._inductor.config as inductor_config

    seen = []

    def fake_compile_fx(gm, example_inputs, inner_compile, config_patches, decompositions):
        seen.append((config_patches, decompositions))
        return gm

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    assert dynamo.backend(gm, [torch.randn(2)], options={"eager_numerics": eager_numerics}) is gm
    patches, decompositions = seen[0]
    assert patches["triton.cudagraphs"] is False
    assert patches.get("emulate_precision_casts", False) is bool(eager_numerics)
    if eager_numerics and hasattr(inductor_config, "eager_numerics"):
        assert patches["eager_numerics.division_rounding"] is True
    if eager_numerics == "exact":
        # The ops eager's kernels run are not decomposed; the rest of Inductor's table is.
        from torch._inductor.decomposition import select_decomp_table

        aten = torch.ops.aten
        assert aten.silu.default in select_decomp_table()
        assert aten.silu.default not in decompositions
        assert aten._softmax.default not in decompositions
        assert set(decompositions) < set(select_decomp_table())
        assert patches["fx_graph_cache"] is False  # its key cannot see the lowering patch
    else:
        assert decompositions is None and "fx_graph_cache" not in patches
    # Given to compile_fx, which applies them around this compilation: nothing global.
    assert inductor_config.emulate_precision_casts is False


def _aot_graphs(fn, *args):
    """The AOT inference graphs (with fake tensors) aot_eager would compile for fn(*args)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    seen = []

    def keep(gm, inputs):
        seen.append((gm, list(inputs)))
        return make_boxed_func(gm.forward)

    compiled = torch.compile(fn, backend=aot_autograd(
        fw_compiler=keep, inference_compiler=keep, keep_inference_input_mutations=True))
    compiled(*args)
    return seen


def test_mutated_inputs_include_writes_through_views():
    def f(a, b, c):
        a[1:].mul_(2)      # through a view of a
        out = b * 3        # dynamo orders inputs by first use: a, b, c
        c.add_(b)
        return out

    ((gm, _),) = _aot_graphs(f, torch.randn(4), torch.randn(4), torch.randn(4))
    assert _fx_inspect.mutated_inputs(gm) == {0, 2}


def test_uncapturable_reasons():
    def on_cpu(x):
        return x.sin()

    ((gm, inputs),) = _aot_graphs(on_cpu, torch.randn(3))
    names = _fx_inspect.placeholder_names(gm)
    assert re.match(r"input '.*' is on cpu", _fx_inspect.uncapturable_reason(gm, inputs, names))


def test_report_of_a_piece_that_runs_eagerly():
    buffer = torch.zeros(3)

    def f(x):
        buffer.add_(x.sum())
        return x * 2

    compiled = torch.compile(f, backend=dynamo.backend, options={"compiler": "aot_eager"})
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), x * 2)
    (report,) = cugraphrt_torch.compile_report()
    assert report.name.endswith("inference") and report.compiler == "aot_eager"
    assert not report.graphed and report.graphs == 0 and "is on cpu" in report.reason
    assert report.mutated_inputs and all("buffer" in n for n in report.mutated_inputs)
    table = cugraphrt_torch.format_compile_report()
    assert table.splitlines()[0].split()[:3] == ["piece", "compiler", "graphed"]
    assert "is on cpu" in table.splitlines()[1]


def test_aot_eager_keeps_eagers_upsampling_and_puts_torchs_kernels_back():
    """torch._decomp traces bilinear upsampling as pointwise ops that round otherwise (~1e-6
    from eager); the aot_eager compiler keeps eager's op, forward and backward, and leaves
    torch's Python kernels as it found them."""
    import torch.nn.functional as F

    op = torch.ops.aten.upsample_bilinear2d.vec
    before = dict(op.py_kernels)

    def f(image):
        return F.interpolate(image, scale_factor=2.5, mode="bilinear",
                             recompute_scale_factor=True, align_corners=False)

    compiled = torch.compile(f, backend=dynamo.backend, options={"compiler": "aot_eager"})
    x = torch.rand(1, 3, 37, 41)
    with torch.no_grad():
        assert torch.equal(compiled(x), f(x))
    assert dict(op.py_kernels) == before and before  # torch's own kernels are back
    torch._dynamo.reset()
    leaf = x.clone().requires_grad_()
    compiled(leaf).square().sum().backward()
    graphed_grad = leaf.grad
    leaf.grad = None
    f(leaf).square().sum().backward()
    assert torch.equal(graphed_grad, leaf.grad)


def test_aot_eager_keeps_eagers_matmul_of_a_vector_and_a_batch():
    """torch._decomp's matmul sums a vector times a batch of matrices in another order
    (~6e-6 from eager on the CPU); for static sizes the aot_eager compiler keeps eager's."""
    compiled = torch.compile(lambda a, b: a @ b, backend=dynamo.backend, dynamic=False,
                             options={"compiler": "aot_eager"})
    a, b = torch.randn(53), torch.randn(5, 53, 29)
    with torch.no_grad():
        assert torch.equal(compiled(a, b), a @ b)


def test_aot_eager_matmul_of_symbolic_sizes_compiles_and_runs_every_batch():
    """torch 2.11's C++ matmul refuses symbolic sizes (it reads numel()): under dynamic shapes
    matmul keeps torch._decomp's trace, so every batch compiles and lands within rounding."""
    compiled = torch.compile(lambda a, b: a @ b, backend=dynamo.backend, dynamic=True,
                             options={"compiler": "aot_eager"})
    for batch in (3, 5, 7):
        a, b = torch.randn(53), torch.randn(batch, 53, 29)
        with torch.no_grad():
            torch.testing.assert_close(compiled(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_strict_raises_for_a_piece_that_cannot_be_captured():
    compiled = torch.compile(lambda x: x + 1, backend=dynamo.backend,
                             options={"compiler": "aot_eager", "strict": True})
    with pytest.raises(cugraphrt.CaptureError, match=r"cannot be captured \(input .* on cpu"):
        compiled(torch.randn(2))


# -- shape buckets: options and the plan read off the AOT graph -----------------------------


@pytest.mark.parametrize("options, field, match", [
    ({"buckets": "pow2"}, "max_bucket", "the largest bucket"),
    ({"buckets": [4, 8], "max_bucket": 8}, "max_bucket", "None with a list"),
    ({"max_bucket": 8}, "max_bucket", "None unless buckets='pow2'"),
    ({"buckets": [8, 4]}, "buckets", "strictly increasing"),
    ({"buckets": [0, 4]}, "buckets", "positive ints"),
    ({"buckets": "linear"}, "buckets", ""),
])
def test_bad_bucket_options_name_the_field(options, field, match):
    with pytest.raises(cugraphrt.OptionsError, match=f"'{field}'.*{match}"):
        dynamo.backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)],
                       options=options)


def test_bucket_options_resolve_to_sizes():
    assert dynamo._bucket_sizes(dynamo.CompileOptions(buckets="pow2", max_bucket=24)) == \
        (1, 2, 4, 8, 16, 24)
    assert dynamo._bucket_sizes(dynamo.CompileOptions(buckets=[3, 5])) == (3, 5)
    assert dynamo._bucket_sizes(dynamo.CompileOptions()) is None


def _dynamic_plans(fn, *args, dims=(0,), train=False):
    """plan_buckets of every AOT graph of fn(*args), with dims of args[0] marked dynamic."""
    from cugraphrt_torch.compile._aot_graph_buckets import plan_buckets
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    plans = []

    def keep(kind):
        def compiler(gm, inputs):
            names = _fx_inspect.placeholder_names(gm)
            static = dynamo._forward_static(len(inputs)) if kind != "backward" else []
            plans.append(plan_buckets(gm, inputs, static, _fx_inspect.mutated_inputs(gm),
                                      kind, names))
            return make_boxed_func(gm.forward)
        return compiler

    compiled = torch.compile(fn, backend=aot_autograd(
        fw_compiler=keep("forward"), bw_compiler=keep("backward"),
        inference_compiler=keep("inference"), keep_inference_input_mutations=True))
    for dim in dims:
        torch._dynamo.mark_dynamic(args[0], dim)
    with torch.set_grad_enabled(train):
        out = compiled(*args)
    if train:
        out.sum().backward()
    return plans


def test_plan_of_a_batched_mlp_finds_the_batch_in_input_sizes_and_output():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    (plan,) = _dynamic_plans(model, torch.randn(5, 8))
    assert not isinstance(plan, str), plan
    assert len(plan.copied) == 1 and plan.dims == (0,)
    assert [str(expr) for _, expr in plan.sizes] == [str(plan.symbol)]
    assert plan.output_dims == (0,)


def test_plan_cuts_outputs_in_the_dimension_that_carries_the_size():
    def f(x, table):
        return (x * 2).transpose(0, 1).contiguous(), table + 1, x.sum(1)

    (plan,) = _dynamic_plans(f, torch.randn(5, 3), torch.randn(4, 3))
    assert not isinstance(plan, str), plan
    assert plan.dims == (0, None) and plan.output_dims == (1, None, 0)


@pytest.mark.parametrize("fn, dims, why", [
    (lambda x: x.reshape(-1) * 2, (0,), r"output 0 has a dimension of size 3\*s\d+"),
    (lambda x: x * 2, (0, 1), "one dynamic size"),
    (lambda x: x.add_(1) * 2, (0,), r"writes to its inputs \('.*'\)"),
    (lambda x: (x[:, :1] * 2, x.shape[0] * 2), (0,), r"output 1 is the size 2\*s"),
])
def test_plan_refuses_what_padding_would_get_wrong(fn, dims, why):
    (plan,) = _dynamic_plans(fn, torch.randn(5, 3), dims=dims)
    assert isinstance(plan, str) and re.search(why, plan), plan


def test_plan_refuses_training_pieces():
    model = torch.nn.Linear(3, 2)
    plans = _dynamic_plans(model, torch.randn(5, 3), train=True)
    assert [p.split(":")[0] for p in plans] == [
        "buckets serve inference pieces only (got a forward piece)",
        "buckets serve inference pieces only (got a backward piece)"]


def test_static_addresses_name_the_static_inputs_only():
    from cugraphrt_torch.compile._aot_graph_buckets import static_addresses

    a, b = torch.zeros(2), torch.zeros(3)
    assert static_addresses([a, 4, b], [0, 2]) == [a.data_ptr(), None, b.data_ptr()]
    assert static_addresses([a, b], []) == [None, None]

"""graph_module on a GPU: graphed forward equals eager; mismatches fall back or raise."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import ReplayError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

nn = torch.nn


def _conv_bn():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 3))
    with torch.no_grad():  # non-trivial running statistics
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model, (2, 3, 16, 16)


def _mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 10)), (8, 32)


MODELS = {
    "linear": lambda: (nn.Linear(20, 30), (5, 20)),
    "conv_bn_eval": _conv_bn,
    "mlp": _mlp,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_graphed_forward_equals_eager_on_fresh_inputs(name, exact_math):
    torch.manual_seed(0)
    model, shape = MODELS[name]()
    model = model.cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(shape, device="cuda"))
    for _ in range(3):
        x = torch.randn(shape, device="cuda")
        out = graphed(x)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # A fresh tensor over the static output (the overwritten-output check is on by default).
    assert out is not graphed.static_outputs
    assert out.data_ptr() == graphed.static_outputs.data_ptr()
    assert not out.requires_grad


def test_static_input_is_not_copied_and_outputs_are_static(exact_math):
    model = nn.Linear(16, 4).cuda().eval()
    sample = torch.randn(3, 16, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, sample, num_warmup_iters=1)
    static = graphed.static_inputs[0]
    assert static.data_ptr() == sample.data_ptr()
    static.copy_(torch.randn(3, 16, device="cuda"))
    first = graphed(static)  # same data_ptr: replays on the buffer as it is
    with torch.no_grad():
        torch.testing.assert_close(first, model(static))
    where = first.data_ptr()
    second = graphed(torch.randn(3, 16, device="cuda"))
    assert second.data_ptr() == where  # the static output, overwritten
    with pytest.raises(RuntimeError, match="overwritten"):
        first.sum()  # and the earlier call's tensor says so when read
    with torch.no_grad():
        torch.testing.assert_close(second, model(static))  # the new input was copied in


def test_copy_outputs_returns_fresh_tensors(exact_math):
    model = _mlp()[0].cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(8, 32, device="cuda"),
                                           copy_outputs=True)
    inputs = [torch.randn(8, 32, device="cuda") for _ in range(2)]
    outs = [graphed(x) for x in inputs]
    assert outs[0].data_ptr() != outs[1].data_ptr()
    with torch.no_grad():
        for x, out in zip(inputs, outs, strict=True):
            torch.testing.assert_close(out, model(x))


def test_tuple_inputs_and_outputs():
    class TwoWay(nn.Module):
        def forward(self, a, b):
            return a @ b, (a.sum(dim=1), torch.relu(b))

    module = TwoWay().cuda()
    a, b = torch.randn(4, 5, device="cuda"), torch.randn(5, 6, device="cuda")
    graphed = cugraphrt_torch.graph_module(module, (a, b), copy_outputs=True)
    a2, b2 = torch.randn(4, 5, device="cuda"), torch.randn(5, 6, device="cuda")
    got = graphed(a2, b2)
    expected = module(a2, b2)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got[1][0], expected[1][0])
    torch.testing.assert_close(got[1][1], expected[1][1])


def test_arguments_that_overlap_at_capture_are_copied_in_apart():
    """(ids, ids[:, :8]) as sample arguments: each call's two tensors are its own, and
    copying the second in must not overwrite part of the first (the zoo's encoder-decoders
    differed from eager by 1.3 before)."""

    class Both(nn.Module):
        def forward(self, a, b):
            return a.float().sum(dim=1) * 10 + b.float().mean(dim=1)

    module = Both().cuda()
    ids = torch.randint(0, 100, (2, 16), device="cuda")
    graphed = cugraphrt_torch.graph_module(module, (ids, ids[:, :8]), copy_outputs=True)
    first = torch.randint(0, 100, (2, 16), device="cuda")
    second = torch.randint(100, 200, (2, 8), device="cuda")
    torch.testing.assert_close(graphed(first, second), module(first, second),
                               rtol=0, atol=0)


def test_a_module_with_a_tensor_off_the_samples_device_is_refused_by_name():
    """Every parameter and buffer, nested ones too, is checked against the samples' device
    before anything runs; the error names the first one that is elsewhere."""
    sample = torch.randn(2, 8, device="cuda")
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 4))).cuda()
    model[1][1].bias = nn.Parameter(torch.zeros(4))  # left on the host
    with pytest.raises(cugraphrt.OptionsError, match=r"1\.1\.bias on cpu"):
        cugraphrt_torch.graph_module(model, sample)
    model = nn.Sequential(nn.Linear(8, 4)).cuda()
    model[0].register_buffer("scale", torch.ones(4))
    with pytest.raises(cugraphrt.OptionsError, match=r"0\.scale on cpu"):
        cugraphrt_torch.graph_module(model, sample)


def test_a_submodule_used_twice_is_graphed_once_and_equals_eager(exact_math):
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.Tanh(), shared).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(3, 8, device="cuda"))
    x = torch.randn(3, 8, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_capture_under_inference_mode_copies_an_inference_sample_and_equals_eager(
        exact_math):
    """Under torch.inference_mode() the sample is an inference tensor, which cannot be
    written outside inference mode: the graph reads a copy of it, and calls made in
    inference mode or out of it equal eager."""
    model = _mlp()[0].cuda().eval()
    with torch.inference_mode():
        sample = torch.randn(8, 32, device="cuda")
        graphed = cugraphrt_torch.graph_module(model, sample)
        static = graphed.static_inputs[0]
        assert sample.is_inference() and not static.is_inference()
        assert static.data_ptr() != sample.data_ptr()
        x = torch.randn(8, 32, device="cuda")
        torch.testing.assert_close(graphed(x), model(x), rtol=1e-5, atol=1e-5)
    y = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(graphed(y), model(y), rtol=1e-5, atol=1e-5)


def test_mismatched_call_runs_eagerly_with_one_warning():
    model = nn.Linear(8, 3).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(4, 8, device="cuda"))
    other = torch.randn(6, 8, device="cuda")
    with pytest.warns(UserWarning, match=r"argument 0 has a different shape.*\(4, 8\).*\(6, 8\)"):
        out = graphed(other)
    with torch.no_grad():
        torch.testing.assert_close(out, model(other))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason: no second warning
        graphed(torch.randn(6, 8, device="cuda"))
    with pytest.warns(UserWarning, match="different dtype"):
        with pytest.raises(RuntimeError):  # runs eagerly, where Linear refuses float64
            graphed(torch.randn(4, 8, device="cuda", dtype=torch.float64))
    with pytest.warns(UserWarning, match="captured with 1 inputs"):
        with pytest.raises(TypeError):
            graphed(other, other)  # runs eagerly, where Linear takes one input
    # A matching call still replays.
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x))


def test_training_flag_change_runs_eagerly():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(4, 8, device="cuda"))
    model.train()
    with pytest.warns(UserWarning, match="training flag changed"):
        graphed(torch.randn(4, 8, device="cuda"))
    model.eval()
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x))


def test_strict_mismatch_raises_replay_error():
    model = nn.Linear(8, 3).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(4, 8, device="cuda"), strict=True)
    with pytest.raises(ReplayError, match=r"different shape.*strict=True"):
        graphed(torch.randn(5, 8, device="cuda"))
    with pytest.raises(ReplayError, match="device"):
        graphed(torch.randn(4, 8))


def test_shared_pool_and_stats():
    pool = cugraphrt.graph_pool_handle()
    first = cugraphrt_torch.graph_module(_mlp()[0].cuda().eval(),
                                         torch.randn(8, 32, device="cuda"), pool=pool)
    second = cugraphrt_torch.graph_module(nn.Linear(10, 2).cuda().eval(),
                                          torch.randn(8, 10, device="cuda"), pool=pool)
    stats = pool.stats()
    assert stats.live_graphs == 2 and stats.active_bytes > 0
    assert first.graph.pool() is pool and second.graph.pool() is pool
    x = torch.randn(8, 32, device="cuda")
    hidden = first(x)
    out = second(hidden)
    with torch.no_grad():
        torch.testing.assert_close(out, second.module(first.module(x)), rtol=1e-4, atol=1e-4)


def test_dropping_a_graph_frees_torch_graph_and_segments_at_once():
    """Teardown happens when the user drops the graph, not inside their next capture."""
    pool = cugraphrt.graph_pool_handle()
    model = _mlp()[0].cuda().eval()
    x = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        expected = model(x)
    # A first graph, dropped: what stays after it is the baseline the second is compared to.
    cugraphrt_torch.graph_module(model, x, pool=pool)
    gc.collect()
    baseline = pool.stats().active_bytes
    graphed = cugraphrt_torch.graph_module(model, x, pool=pool)
    torch_graph = weakref.ref(graphed.torch_graph)
    torch.testing.assert_close(graphed(x), expected, rtol=1e-4, atol=1e-4)
    during = pool.stats().active_bytes
    del graphed
    gc.collect()  # the adapter's owner and its replay form a cycle
    assert torch_graph() is None
    after = pool.stats()
    assert after.live_graphs == 0 and after.active_bytes < during, (baseline, during, after)
    # All but torch's one small (2 MiB) segment holding the static outputs, which die after
    # torch's pool: it goes back at torch's next empty_cache (docs/reliability.md). Before
    # this was fixed the whole 34 MiB of every dropped graph stayed (H100, torch 2.11).
    assert after.active_bytes - baseline <= 2 << 20, (baseline, during, after)


def test_warm_ups_allocate_from_the_graphs_pool_and_own_its_workspace():
    """The warm-ups run from the capture's pool: nothing of theirs stays cached in torch's
    general pool, and the cuBLAS workspace the graph bakes in is the graph's own, so torch
    clearing its workspace cache (as torch.compile's graph trees do) frees nothing the graph
    uses."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda().eval()
    x = torch.randn(256, 512, device="cuda")
    with torch.no_grad():
        expected = model(x)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    general = _general_pool_bytes()
    graphed = cugraphrt_torch.graph_module(model, x)
    torch.cuda.synchronize()
    # The warm-ups' activations (2 MiB a call) and workspace (32 MiB on an H200) went to the
    # graph's pool: torch's general pool grew by one small segment at most, for the RNG state
    # torch allocates for each graph (two 512-byte tensors). Eager warm-ups left 34 MiB or
    # more cached there.
    assert _general_pool_bytes() - general <= 2 << 20, (general, _general_pool_bytes())
    assert graphed.graph.pool().stats().reserved_bytes > 0
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    fillers = [torch.full((1 << 22,), 7.0, device="cuda") for _ in range(8)]
    fresh = torch.randn_like(x)
    with torch.no_grad():
        expected = model(fresh)
    torch.testing.assert_close(graphed(fresh), expected, rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()
    assert all(bool((f == 7.0).all()) for f in fillers), "the replay wrote into other memory"


def _general_pool_bytes() -> int:
    """Bytes of the segments of torch's general pool (not a graph's or a MemPool's)."""
    return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment["segment_pool_id"]) == (0, 0))


def test_a_failing_warm_up_raises_its_error_and_leaves_the_next_capture_working():
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("broken forward")

    with pytest.raises(ValueError, match="broken forward"):
        cugraphrt_torch.graph_module(Broken().cuda(), torch.randn(4, 8, device="cuda"))
    model = nn.Linear(8, 3).cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, x)
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x), rtol=1e-5, atol=1e-5)


def test_replay_after_reset_is_refused():
    model = nn.Linear(8, 3).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(4, 8, device="cuda"))
    assert graphed.torch_graph is not None
    graphed.graph.reset()
    gc.collect()
    assert graphed.torch_graph is None  # reset let torch's graph go: nothing kept it
    with pytest.raises(ReplayError, match="reset"):
        graphed(torch.randn(4, 8, device="cuda"))

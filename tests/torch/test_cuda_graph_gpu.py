"""cugraphrt_torch.CUDAGraph and the torch.cuda graph names on a GPU (issue 23.1): the same
programs run with torch.cuda's names and with cugraphrt_torch's give the same results, equal
to eager runs; keep_graph / instantiate / raw handles / debug_dump / reset as in torch; torch's
messages and exceptions where torch code matches on them."""

from __future__ import annotations

import gc
import warnings

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
import cupy  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import CaptureError, PoolOutOfMemoryError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

F = torch.nn.functional
NAMESPACES = {"torch.cuda": torch.cuda, "cugraphrt_torch": cugraphrt_torch}


def _step(x, w):
    return F.gelu(x @ w) * 2 + x.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("names", list(NAMESPACES))
def test_the_manual_capture_program_runs_with_either_namespace(names, exact_math):
    ns = NAMESPACES[names]
    w = torch.randn(64, 64, device="cuda")
    x = torch.randn(32, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _step(x, w)  # warm up on the capture stream
        g = ns.CUDAGraph()
        assert not ns.is_current_stream_capturing()
        g.capture_begin()
        assert ns.is_current_stream_capturing()
        y = _step(x, w)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        x.copy_(torch.randn(32, 64, device="cuda"))
        g.replay()  # on torch's current stream
        torch.testing.assert_close(y, _step(x, w))
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        x.copy_(torch.randn(32, 64, device="cuda"))
        g.replay()
        expected = _step(x, w)
    torch.cuda.current_stream().wait_stream(other)
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("names", list(NAMESPACES))
def test_pools_shared_by_handle_and_by_pool(names):
    ns = NAMESPACES[names]
    a = torch.randn(10_000, device="cuda")
    for share in ("graph_pool_handle", "pool()"):
        g0, g1 = ns.CUDAGraph(), ns.CUDAGraph()
        handle = ns.graph_pool_handle()
        with ns.graph(g0, pool=handle):
            b = a.clone() * 2 + 1
        with ns.graph(g1, pool=handle if share == "graph_pool_handle" else g0.pool()):
            c = b * 3 - a
        fresh = torch.randn(10_000, device="cuda")
        a.copy_(fresh)
        g0.replay()
        g1.replay()
        torch.testing.assert_close(c, (fresh * 2 + 1) * 3 - fresh)
        if ns is cugraphrt_torch:  # one cugraphrt pool, with its statistics
            assert g0.pool() is g1.pool() and g0.pool().stats().live_graphs == 2


def test_make_graphed_callables_with_torchs_positional_signature(exact_math):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8)).cuda()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(16, 32, device="cuda", requires_grad=True)
    pool = cugraphrt_torch.graph_pool_handle()
    graphed = cugraphrt_torch.make_graphed_callables(model, (x,), 2, False, pool)
    for _ in range(3):
        data = torch.randn(16, 32, device="cuda", requires_grad=True)
        graphed(data).square().sum().backward()
        reference(data.detach()).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert pool.stats().live_graphs >= 2  # forward and backward, in the pool given


def test_keep_graph_raw_handles_instantiate_and_recapture():
    cudart = pytest.importorskip("cuda.bindings.runtime")
    graph = cugraphrt_torch.CUDAGraph(keep_graph=True)
    x = torch.zeros(2000, device="cuda")
    with cugraphrt_torch.graph(graph, capture_error_mode="relaxed"):
        x += 1.0
    nodes = cudart.cudaGraphGetNodes(cudart.cudaGraph_t(init_value=graph.raw_cuda_graph()))
    assert nodes[0] == cudart.cudaError_t.cudaSuccess and nodes[-1] >= 1
    with pytest.raises(CaptureError, match=r"until instantiate\(\) has been called"):
        graph.raw_cuda_graph_exec()
    graph.instantiate()
    flags = cudart.cudaGraphExecGetFlags(cudart.cudaGraphExec_t(
        init_value=graph.raw_cuda_graph_exec()))
    assert flags[0] == cudart.cudaError_t.cudaSuccess
    graph.replay()
    graph.instantiate()  # again: a new executable of the same graph
    graph.replay()
    torch.cuda.synchronize()
    assert bool((x == 2.0).all())
    graph.reset()
    x = torch.zeros(2000, device="cuda")  # a new address: a new graph must run
    with cugraphrt_torch.graph(graph, capture_error_mode="relaxed"):
        x += 3.0
    graph.replay()  # instantiated by the first replay
    graph.replay()
    torch.cuda.synchronize()
    assert bool((x == 6.0).all())


def test_plain_graph_with_keep_graph_instantiates_after_a_torch_capture():
    g = cugraphrt.Graph(keep_graph=True)
    x = torch.randn(1000, device="cuda")
    start = x.clone()
    with cugraphrt_torch.graph(g):
        x.mul_(2)
    g.instantiate()
    g.replay()
    g.instantiate()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(x, start * 4)
    assert g.raw_graph and g.raw_graph_exec


def test_debug_dump_writes_dot(tmp_path):
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    g = cugraphrt_torch.CUDAGraph()
    g.enable_debug_mode()
    s0, s1 = torch.cuda.Stream(), torch.cuda.Stream()
    s0.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s0):
        g.capture_begin()
        z = x + y
        with torch.cuda.stream(s1):
            s1.wait_stream(s0)
            w = z * y
        s0.wait_stream(s1)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s0)
    g.debug_dump(tmp_path / "graph.dot")
    text = (tmp_path / "graph.dot").read_text()
    assert text.startswith("digraph") and len(text.splitlines()) > 4
    g.replay()
    torch.testing.assert_close(w, (x + y) * y)


def test_default_stream_capture_is_refused_with_torchs_message():
    g = cugraphrt_torch.CUDAGraph()
    with torch.cuda.stream(torch.cuda.default_stream()):
        with pytest.raises(RuntimeError, match=r"CUDA graphs must be captured on a "
                                               r"non-default stream\.") as info:
            g.capture_begin()
    assert isinstance(info.value, CaptureError)
    assert not cugraphrt_torch.is_current_stream_capturing()
    x = torch.randn(100, device="cuda")
    with cugraphrt_torch.graph(g):  # nothing was left half begun
        y = x * 2
    g.replay()
    torch.testing.assert_close(y, x * 2)


def test_empty_capture_warns_with_torchs_words():
    g = cugraphrt_torch.CUDAGraph()
    s = torch.cuda.Stream()
    with warnings.catch_warnings(record=True) as caught, torch.cuda.stream(s):
        warnings.simplefilter("always")
        g.capture_begin()
        g.capture_end()
    assert any("The CUDA Graph is empty" in str(w.message) for w in caught)


def test_capture_end_on_another_stream_keeps_the_capture():
    g = cugraphrt_torch.CUDAGraph()
    s, other = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.randn(100, device="cuda")
    with torch.cuda.stream(s):
        g.capture_begin()
        y = x + 1
    with torch.cuda.stream(other), pytest.raises(CaptureError, match="same stream it began"):
        g.capture_end()
    with torch.cuda.stream(s):
        g.capture_end()
    g.replay()
    torch.testing.assert_close(y, x + 1)


def test_capture_out_of_memory_is_torchs_error_and_the_pool_recovers():
    with pytest.raises(torch.OutOfMemoryError, match="out of memory") as info:
        with cugraphrt_torch.graph(cugraphrt_torch.CUDAGraph()):
            torch.zeros(2**40, device="cuda")
    assert isinstance(info.value, PoolOutOfMemoryError)
    x = torch.randn(1000, device="cuda")
    g = cugraphrt_torch.CUDAGraph()
    with cugraphrt_torch.graph(g):
        y = x.exp()
    g.replay()
    torch.testing.assert_close(y, x.exp())


def test_reset_during_a_capture_rolls_torch_back():
    g = cugraphrt_torch.CUDAGraph()
    s = torch.cuda.Stream()
    x = torch.randn(100, device="cuda")
    with torch.cuda.stream(s):
        g.capture_begin()
        x * 2
        g.reset()
        assert not cugraphrt_torch.is_current_stream_capturing()
        g.capture_begin()
        y = x * 3
        g.capture_end()
    g.replay()
    torch.testing.assert_close(y, x * 3)
    assert cupy.cuda.get_current_stream().ptr == cupy.cuda.Stream.null.ptr  # restored


def test_rng_replays_follow_the_generator_like_eager():
    g = cugraphrt_torch.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda.manual_seed(5)
        g.capture_begin()
        a = torch.rand(1000, device="cuda")
        b = F.dropout(torch.ones(1000, device="cuda"), 0.5)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    for seed in (6, 314, 271):
        torch.cuda.manual_seed(seed)
        g.replay()
        torch.cuda.manual_seed(seed)
        torch.testing.assert_close(a, torch.rand(1000, device="cuda"), rtol=0, atol=0)
        torch.testing.assert_close(b, F.dropout(torch.ones(1000, device="cuda"), 0.5),
                                   rtol=0, atol=0)


def test_registered_generator_state_advances_per_replay():
    generator = torch.Generator(device="cuda")
    generator.manual_seed(11)
    torch.rand(1, device="cuda", generator=generator)  # the generator exists on the device
    g = cugraphrt_torch.CUDAGraph()
    g.register_generator_state(generator.graphsafe_get_state())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        draw = torch.rand(1000, device="cuda", generator=generator)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    generator.manual_seed(23)
    replays = []
    for _ in range(2):
        g.replay()
        replays.append(draw.clone())
    reference = torch.Generator(device="cuda")
    reference.manual_seed(23)
    for replayed in replays:
        torch.testing.assert_close(replayed, torch.rand(1000, device="cuda",
                                                        generator=reference), rtol=0, atol=0)


def test_memory_comes_back_after_many_captures():
    a, b = torch.rand(1024, 512, device="cuda"), torch.rand(512, 64, device="cuda")
    torch.mm(a, b)
    gc.collect()
    free_before, _ = torch.cuda.mem_get_info()
    for _ in range(30):
        g = cugraphrt_torch.CUDAGraph()
        with cugraphrt_torch.graph(g):
            torch.mm(a, b)
        g.replay()
    del g
    gc.collect()
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    assert free_before - free_after < 256 << 20  # not one cuBLAS workspace per capture kept

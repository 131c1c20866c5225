"""cugraphrt_torch.graph on a GPU: replay, memory from the cugraphrt pool, RNG, streams."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
import cupy  # noqa: E402
from cugraphrt_torch.capture import _alloc  # noqa: E402

import cugraphrt  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

F = torch.nn.functional


def _in_cugraphrt_pool(tensor) -> bool:
    """Whether the tensor's memory lies in a segment torch took from a cugraphrt pool."""
    address = tensor.data_ptr()
    return any(ptr <= address < ptr + memory.mem.size for ptr, memory in
               list(_alloc._live.items()))


def test_torch_work_replays_on_fresh_inputs(exact_math):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32).cuda()
    x = torch.randn(16, 64, device="cuda")
    with torch.no_grad():
        linear(x)  # warm up: kernel choice, cuBLAS handle
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g):
            y = F.gelu(linear(x)) * 2
        for _ in range(3):
            x.copy_(torch.randn(16, 64, device="cuda"))
            g.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(y, F.gelu(linear(x)) * 2)


def test_replay_on_a_given_stream():
    x = torch.randn(4096, device="cuda")
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        y = torch.sin(x) + x
    stream = cupy.cuda.Stream(non_blocking=True)
    x.copy_(torch.randn(4096, device="cuda"))
    torch.cuda.synchronize()
    g.replay(stream=stream)
    stream.synchronize()
    torch.testing.assert_close(y, torch.sin(x) + x)


def test_torch_allocations_come_from_the_cugraphrt_pool():
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(512, 512, device="cuda")
    g = cugraphrt.Graph()
    before = pool.stats()
    with cugraphrt_torch.graph(g, pool=pool):
        y = (x @ x).relu()
    after = pool.stats()
    assert _in_cugraphrt_pool(y)
    assert after.active_bytes - before.active_bytes >= y.numel() * y.element_size()
    assert after.live_graphs == 1
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (x @ x).relu(), rtol=1e-3, atol=1e-3)


def test_reset_gives_torch_memory_back_to_the_pool(capture_stream):
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(1024, 1024, device="cuda")
    with torch.cuda.stream(capture_stream):
        x @ x  # the capture stream's cuBLAS workspace is made now, not in the capture
    torch.cuda.synchronize()
    baseline = pool.stats().active_bytes
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g, pool=pool):
        y = torch.tanh(x @ x)
    captured = pool.stats().active_bytes
    assert captured > baseline
    del y
    g.reset()
    gc.collect()
    torch.cuda.empty_cache()
    assert pool.stats().active_bytes < captured


def test_cupy_and_torch_graphs_share_one_pool(capture_stream):
    torch.manual_seed(1)
    x = cupy.random.standard_normal((4096, 4096)).astype(cupy.float32)  # 64 MiB
    a = torch.randn(1024, 1024, device="cuda")
    linear = torch.nn.Linear(1024, 1024).cuda()

    def cupy_work():
        return ((x * 2.0) + 1.0).sum(axis=0)  # two 64 MiB temporaries, freed in the capture

    def torch_work():
        with torch.no_grad():
            return torch.relu(linear(a))

    cupy_work()
    with torch.cuda.stream(capture_stream):
        torch_work()  # warm up where the capture runs: cuBLAS's workspace is made now
    cupy.cuda.Device().synchronize()

    def capture_both(cupy_pool, torch_pool):
        g_cupy, g_torch = cugraphrt.Graph(), cugraphrt.Graph()
        with cugraphrt.graph(g_cupy, pool=cupy_pool):
            out_cupy = cupy_work()
        with cugraphrt_torch.graph(g_torch, pool=torch_pool):
            out_torch = torch_work()
        return (g_cupy, out_cupy), (g_torch, out_torch)

    shared = cugraphrt.graph_pool_handle()
    (g1, out1), (g2, out2) = capture_both(shared, shared)
    separate_cupy, separate_torch = cugraphrt.graph_pool_handle(), cugraphrt.graph_pool_handle()
    kept = capture_both(separate_cupy, separate_torch)

    # Torch's bytes are in the pools, and sharing reuses the CuPy graph's freed temporaries.
    assert _in_cugraphrt_pool(out2) and _in_cugraphrt_pool(kept[1][1])
    assert separate_torch.stats().active_bytes >= out2.numel() * out2.element_size()
    shared_reserved = shared.stats().reserved_bytes
    separate_reserved = (separate_cupy.stats().reserved_bytes
                         + separate_torch.stats().reserved_bytes)
    assert shared_reserved < separate_reserved, (shared.stats(), separate_cupy.stats(),
                                                 separate_torch.stats())
    # Replays in capture order give the right results in the shared pool.
    x[...] = cupy.random.standard_normal(x.shape, dtype=cupy.float32)
    a.copy_(torch.randn(1024, 1024, device="cuda"))
    torch.cuda.synchronize()
    g1.replay()
    g2.replay()
    cupy.cuda.Device().synchronize()
    cupy.testing.assert_allclose(out1, cupy_work(), rtol=1e-4, atol=1e-2)
    torch.testing.assert_close(out2, torch_work(), rtol=1e-3, atol=1e-3)


def test_dropout_is_fresh_per_replay_and_equal_to_eager():
    x = torch.rand(4096, device="cuda") + 1.0  # no zeros: a zero marks a dropped element
    seed = 1234
    torch.cuda.manual_seed(seed)
    eager = [F.dropout(x, p=0.5, training=True) for _ in range(3)]
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        y = F.dropout(x, p=0.5, training=True)
    torch.cuda.manual_seed(seed)
    graphed = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        graphed.append(y.clone())
    for got, expected in zip(graphed, eager, strict=True):
        assert torch.equal(got, expected)
    masks = [(t == 0) for t in graphed]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    assert 0.4 < masks[0].float().mean().item() < 0.6


def test_fork_onto_another_torch_stream_and_join_back():
    side = torch.cuda.Stream()
    a = torch.randn(256, 256, device="cuda")
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = torch.cos(a) * 2  # allocated and computed on the forked stream
        main.wait_stream(side)
        c = b + a
    for _ in range(2):
        a.copy_(torch.randn(256, 256, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(c, torch.cos(a) * 2 + a)


def test_torch_and_cupy_kernels_in_one_capture():
    x = torch.randn(100_000, device="cuda")
    x_cp = cugraphrt_torch.to_cupy(x)
    scale = cupy.ElementwiseKernel("float32 y, float32 x", "float32 z", "z = y * 2 + x",
                                   "cugraphrt_torch_test_scale")

    def work():
        y = torch.sin(x)  # torch
        z = scale(cugraphrt_torch.to_cupy(y), x_cp)  # a CuPy kernel on torch's data
        return cugraphrt_torch.from_cupy(z).relu()  # torch again, on CuPy's result

    work()  # compile the CuPy kernel outside the capture
    torch.cuda.synchronize()
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g) as capture:
        w = work()
    assert capture.torch_graph is not None
    for _ in range(3):
        x.copy_(torch.randn(100_000, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(w, torch.relu(torch.sin(x) * 2 + x))


def test_a_capture_hands_back_a_captured_graph():
    """``capture.captured``: the graph, its capture number in the pool's order, its memory,
    and replays that stay live while it lives and raise once the graph is reset."""
    x = torch.randn(4096, device="cuda")
    pool = cugraphrt.graph_pool_handle()
    g1, g2 = cugraphrt.Graph(), cugraphrt.Graph()
    with cugraphrt_torch.graph(g1, pool=pool) as c1:
        y1 = x * 2
    with cugraphrt_torch.graph(g2, pool=pool) as c2:
        y2 = y1 + 1
    first, second = c1.captured, c2.captured
    assert isinstance(first, cugraphrt_torch.CapturedGraph)
    assert first.graph is g1 and second.graph is g2
    assert second.seq == first.seq + 1  # the pool's order: capture order
    assert first.memory is c1.memory and first.torch_graph is c1.torch_graph is not None
    for replay in ("launch", "on_torch_stream", "replay"):
        fresh = torch.randn_like(x)
        x.copy_(fresh)
        if replay == "replay":
            first.replay(torch.cuda.current_stream())
            second.replay(torch.cuda.current_stream())
        else:
            getattr(first, replay)()
            getattr(second, replay)()
        torch.cuda.synchronize()
        torch.testing.assert_close(y2, fresh * 2 + 1)
    del c1, y1, y2
    g1.reset()
    assert first.torch_graph is None
    with pytest.raises(cugraphrt.ReplayError, match="reset"):
        first.launch()
    assert "reset" in repr(first) and "live" in repr(second)

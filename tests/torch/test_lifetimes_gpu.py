"""Every kind of torch replay handle keeps its graph alive, and lets it go at once when dropped.

The cases of tests/lifetimes.py for the torch adapter: ``g.replay`` of a plain
``cugraphrt.Graph`` captured with ``cugraphrt_torch.graph`` (the pattern code ported from
``torch.cuda.graphs`` uses, and a loop that rebinds ``g`` once per batch size), a
``cugraphrt_torch.CUDAGraph``, ``graph_module`` with and without buckets,
``make_graphed_callables`` (forward and backward), the compile backend's pieces, a
device-side loop, and a graph holding a torch.distributed all-reduce (a one-rank group).
"""

from __future__ import annotations

import functools
import threading

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

import cugraphrt  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402
from tests.lifetimes import BIG_BYTES, Kept, check_lifetime  # noqa: E402

pytestmark = torch_gpu_marks(torch)

N = 1 << 16
ROWS = BIG_BYTES // (4 * N)  # the temporary (ROWS, N) float32 is BIG_BYTES


def _work(x, w):
    """x * sum(w), through a BIG_BYTES temporary freed inside the capture."""
    return (x.expand(ROWS, -1) * w[:, None]).sum(dim=0)


class Work(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(ROWS, device="cuda"))

    def forward(self, x):
        return _work(x, self.w)


def _flush(pool=None):
    """Torch keeps freed segments cached until empty_cache; a shared pool keeps its own."""

    def flush():
        torch.cuda.empty_cache()
        if pool is not None:
            pool.empty_cache()

    return flush


def _check_fn(x, w, out=None, *, call_with_input=False):
    """check(handle): a new input, one replay through the handle, compared with eager."""

    def check(handle):
        x.copy_(torch.randn(N, device="cuda"))
        got = handle(x) if call_with_input else handle()
        got = out if got is None else got
        torch.cuda.synchronize()
        with torch.no_grad():
            want = _work(x.double(), w.double())
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)

    return check


@pytest.fixture
def inputs():
    x = torch.randn(N, device="cuda")
    w = torch.randn(ROWS, device="cuda")
    _work(x, w)  # kernels loaded before any capture
    torch.cuda.synchronize()
    return x, w


def test_replay_of_a_plain_graph_keeps_torch_work_alive(inputs):
    """The issue's pattern: ``return g.replay, out`` from a function."""
    x, w = inputs

    def build():
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g):
            out = _work(x, w)
        return Kept(g.replay, _check_fn(x, w, out), g.pool(), _flush())

    check_lifetime(build)


def test_replays_kept_while_g_is_rebound_per_batch_size(inputs):
    """One graph per size into one shared pool, keeping each ``g.replay`` while ``g`` is
    rebound: every graph replays, not only the last."""
    x, w = inputs
    pool = cugraphrt.graph_pool_handle()
    sizes = (N // 4, N // 2, N)

    def build():
        replays, outs = [], []
        for n in reversed(sizes):  # largest first, as serving engines capture
            g = cugraphrt.Graph()
            with cugraphrt_torch.graph(g, pool=pool):
                outs.append(_work(x[:n], w))
            replays.append(g.replay)

        def check(handle):
            x.copy_(torch.randn(N, device="cuda"))
            for replay in handle:
                replay()
            torch.cuda.synchronize()
            for n, out in zip(reversed(sizes), outs, strict=True):
                want = _work(x[:n].double(), w.double())
                torch.testing.assert_close(out.double(), want, rtol=1e-3, atol=1e-3)

        return Kept(replays, check, pool, _flush(pool))

    check_lifetime(build)


def test_cuda_graph_replay_keeps_its_graph(inputs):
    x, w = inputs

    def build():
        g = cugraphrt_torch.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            g.capture_begin()
            out = _work(x, w)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        return Kept(g.replay, _check_fn(x, w, out), g.pool(), _flush())

    check_lifetime(build)


def test_graphed_module_keeps_its_graph(inputs):
    x, _ = inputs

    def build():
        module = Work()
        graphed = cugraphrt_torch.graph_module(module, (x,))
        return Kept(graphed, _check_fn(x, module.w.detach(), call_with_input=True),
                    graphed.graph.pool(), _flush())

    check_lifetime(build)


def test_bucketed_module_keeps_its_graphs(inputs):
    x, _ = inputs

    def build():
        module = Work()
        graphed = cugraphrt_torch.graph_module(module, (x,), buckets=[N // 2, N])
        graphed.capture_all(progress=False)
        pool = graphed.pool
        return Kept(graphed, _check_fn(x, module.w.detach(), call_with_input=True), pool,
                    _flush(pool))

    check_lifetime(build)


def test_graphed_callable_keeps_its_forward_and_backward_graphs(inputs):
    x, _ = inputs

    def build():
        w = torch.randn(ROWS, device="cuda")
        graphed = cugraphrt_torch.make_graphed_callables(
            lambda x: _work(x, w), (x.clone().requires_grad_(),))

        def check(handle):
            data = torch.randn(N, device="cuda")
            ours = data.clone().requires_grad_()
            out = handle(ours)
            out.square().sum().backward()
            torch.cuda.synchronize()
            want_x = data.double().requires_grad_()
            want = _work(want_x, w.double())
            want.square().sum().backward()
            torch.testing.assert_close(out.double(), want.detach(), rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(ours.grad.double(), want_x.grad, rtol=1e-3, atol=1e-2)

        return Kept(graphed, check, graphed.forward_graph.pool(), _flush())

    check_lifetime(build)


def test_compiled_pieces_keep_their_graphs_until_the_code_cache_lets_go(inputs):
    """Dynamo's code cache holds the compiled code beyond the compiled function: the pieces'
    graphs go when it is reset. In a thread of its own, whose pieces get a pool of their own
    (pieces share one pool per thread): what earlier tests compiled stays out of it."""
    import torch._dynamo
    from cugraphrt_torch.compile import _aot_graph

    x, w = inputs
    torch._dynamo.reset()

    def build():
        compiled = torch.compile(lambda x: _work(x, w), backend="cugraphrt",
                                 options={"compiler": "aot_eager"})
        for _ in range(3):  # warm-up, then the capture
            compiled(x)
        pool = _aot_graph.shared_pool(x.device.index)
        return Kept(compiled, _check_fn(x, w, call_with_input=True), pool, _flush(pool))

    failures: list[BaseException] = []

    def run():
        try:
            torch.cuda.set_device(x.device)
            check_lifetime(build, also_held_by=torch._dynamo.reset)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(exc)

    thread = threading.Thread(target=run)
    try:
        thread.start()
        thread.join()
    finally:
        torch._dynamo.reset()
    if failures:
        raise failures[0]


def test_graph_with_a_device_side_loop_keeps_its_graph(inputs):
    x, w = inputs

    def build():
        out = torch.zeros(N, device="cuda")
        i = torch.zeros((), dtype=torch.int32, device="cuda")
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g):
            out.zero_()
            i.zero_()

            def body():
                out.add_(_work(x, w))
                i.add_(1)

            cugraphrt_torch.while_loop(lambda: i < 3, body)
            cugraphrt_torch.cond(i == 3, lambda: out.div_(3))  # three iterations: the mean
        return Kept(g.replay, _check_fn(x, w, out), g.pool(), _flush())

    check_lifetime(build)


@pytest.fixture
def group_of_one(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("watchdog", [False, True], ids=["plain", "watchdog"])
def test_graph_holding_an_all_reduce_keeps_itself_through_its_checked_replays(
        inputs, group_of_one, watchdog, capture_stream):
    """First replay: the cross-rank check; later ones: the steady replay (watched with a
    collective timeout). A one-rank group's sum is the value itself."""
    from cugraphrt.distributed.watchdog import set_collective_timeout

    x, w = inputs

    def step(out):
        out.copy_(_work(x, w))
        group_of_one.all_reduce(out)

    set_collective_timeout(60.0 if watchdog else None)
    try:
        def build():
            out = torch.empty(N, device="cuda")
            with torch.cuda.stream(capture_stream):
                step(out)  # NCCL's and torch's first use outside the capture
            torch.cuda.synchronize()
            g = cugraphrt.Graph()
            with cugraphrt_torch.graph(g):
                step(out)
            return Kept(functools.partial(g.replay), _check_fn(x, w, out), g.pool(), _flush())

        check_lifetime(build)
    finally:
        set_collective_timeout(None)

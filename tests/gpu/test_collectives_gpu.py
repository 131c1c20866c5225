"""CuPy NCCL collectives in a graph on one GPU (a communicator of one rank): recorded, armed
for the cross-rank check, replayed through the class's own replay once checked, and released
before the communicator is destroyed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")

import cugraphrt  # noqa: E402
from cugraphrt import ReplayError  # noqa: E402
from cugraphrt.distributed import log as collective_log  # noqa: E402
from cugraphrt.distributed.log import Collective  # noqa: E402


def test_a_captured_collective_is_checked_then_replays_and_is_released(solo):
    rng = cupy.random.default_rng(5)
    x = rng.standard_normal(4096, dtype=cupy.float32)
    out = cupy.empty_like(x)
    solo.all_reduce(x * 2, out=out)  # warm-up
    g = cugraphrt.Graph()
    with cugraphrt.graph(g):
        solo.all_reduce(x * 2, out=out)
    ((graph, log),) = collective_log.live_graphs(exchanger=solo._exchanger)
    assert graph is g and log.entries == [Collective("all_reduce", "float32", 4096, "solo",
                                                     "sum")]
    assert g._route is not None and log.verdict is None  # armed, not checked yet
    for _ in range(3):
        x[...] = rng.standard_normal(4096, dtype=cupy.float32)
        g.replay()
        cupy.testing.assert_allclose(out, x * 2)  # one rank: the sum is the value
    assert log.verdict is True and g._route is None  # the plain launch again
    solo.close()
    with pytest.raises(ReplayError, match="after reset"):
        g.replay()


def test_a_collectives_freed_by_the_garbage_collector_in_a_capture_leaves_it_valid(one_rank):
    """A Collectives dropped without close() is freed by the garbage collector (it and its
    exchanger reference each other). Once its collective was captured (its graph dropped
    too), destroying its communicator inside a global-mode capture invalidated that capture
    (seen in the GPU suite as the test above failing at its first operation, after
    test_body_nodes_gpu dropped its one-rank communicator); the communicator now goes
    after the capture. Without the fix this capture raises CUDA_ERROR_STREAM_CAPTURE_
    INVALIDATED."""
    import gc

    from cugraphrt.distributed.collectives import Collectives

    gc.collect()  # earlier tests' garbage goes now: only this test's is collected below
    x = cupy.ones(4096, dtype=cupy.float32)
    out = cupy.empty_like(x)
    other = Collectives(one_rank(), label="other")
    other.all_reduce(x, out=out)  # warm-up
    captured = cugraphrt.Graph()
    with cugraphrt.graph(captured):
        other.all_reduce(x, out=out)
    captured.replay()
    cupy.cuda.Device().synchronize()
    gc.disable()  # the two go at the collection inside the capture below, not before
    try:
        del other, captured
        g = cugraphrt.Graph()
        with cugraphrt.graph(g):
            y = x * 2
            assert gc.collect() > 0  # the dropped Collectives goes here, inside the capture
            z = y + 1
    finally:
        gc.enable()
    g.replay()
    assert bool(cupy.all(z == 3))

"""graph_module with shape buckets: one torch module for every batch size."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch import BucketedModule, graph_module  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import ReplayError  # noqa: E402

pytestmark = pytest.mark.gpu


def convnet():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
    ).cuda().eval()


def test_every_size_equals_eager_on_the_unpadded_input(exact_math):
    model = convnet()
    graphed = graph_module(model, torch.randn(8, 3, 16, 16, device="cuda"), buckets="pow2")
    assert isinstance(graphed, BucketedModule) and graphed.buckets == (1, 2, 4, 8)
    for n in [1, 2, 3, 4, 5, 6, 7, 8, 8, 3, 1, 6]:
        x = torch.randn(n, 3, 16, 16, device="cuda")
        out = graphed(x)
        with torch.no_grad():
            expected = model(x)
        assert out.shape == (n, 10)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    stats = graphed.stats()
    assert [b.captures for b in stats.buckets] == [1, 1, 1, 1] and stats.eager_calls == 0
    assert stats.pool.live_graphs == 4


def test_capture_all_shares_one_pool_about_the_largest_alone():
    model = convnet()
    sample = torch.randn(32, 3, 32, 32, device="cuda")
    alone = graph_module(model, sample, buckets=[32])
    alone.capture_all(progress=False)
    largest = alone.pool.stats().reserved_bytes
    every = graph_module(model, sample, buckets="pow2")
    every.capture_all(progress=False)
    stats = every.stats()
    assert stats.pool.live_graphs == 6
    assert stats.pool.reserved_bytes <= 1.3 * largest, (stats.pool.reserved_bytes, largest)


def test_fallbacks_strict_and_training_flag():
    model = convnet()
    graphed = graph_module(model, torch.randn(4, 3, 8, 8, device="cuda"), buckets="pow2")
    x = torch.randn(6, 3, 8, 8, device="cuda")
    with pytest.warns(UserWarning, match="above the largest bucket 4"):
        out = graphed(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    with pytest.warns(UserWarning, match="only dimension 0 may vary"):
        graphed(torch.randn(2, 3, 9, 8, device="cuda"))
    model.train()
    with pytest.warns(UserWarning, match="training flag changed"):
        graphed(torch.randn(2, 3, 8, 8, device="cuda"))
    model.eval()
    assert graphed.stats().fallbacks == {"above": 1, "shape": 1, "training": 1}
    strict = graph_module(model, torch.randn(4, 3, 8, 8, device="cuda"), buckets=[2, 4],
                          strict=True)
    with pytest.raises(ReplayError, match="above the largest bucket 4"):
        strict(x)


class Doubling(torch.nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("shared", [False, True], ids=["given_pool", "own_pool"])
def test_memory_budget_under_torch_evicts_and_stays_correct(shared):
    # Each row is 4 MiB, so every bucket's output needs a segment of its own (torch carves
    # memory in coarse segments; small outputs would share one and never press the budget).
    # The budget is what bucket 8 reserves alone. With a given pool each bucket keeps its
    # outputs: buckets 4 and 8 each fit, both together do not, so alternating between them
    # must evict and re-capture. With a pool of its own the family shares its outputs'
    # memory: bucket 4's output takes bucket 8's, both fit, nothing is evicted.
    model = Doubling()
    sample = torch.randn(8, 1024, 1024, device="cuda")
    alone = graph_module(model, sample, buckets=[8])
    alone.capture_all(progress=False)
    budget = alone.pool.stats().reserved_bytes
    del alone
    pool = None if shared else cugraphrt.graph_pool_handle()
    graphed = graph_module(model, sample, buckets=[4, 8], memory_budget=budget, pool=pool)
    for n in (7, 3, 8, 1, 4, 6, 2):
        x = torch.randn(n, 1024, 1024, device="cuda")
        torch.testing.assert_close(graphed(x), x * 2, rtol=0, atol=0)
        assert graphed.pool.stats().reserved_bytes <= budget
    stats = graphed.stats()
    by_size = {b.size: b for b in stats.buckets}
    assert (by_size[4].calls, by_size[8].calls) == (4, 3) and stats.eager_calls == 0
    if shared:
        assert stats.shares_outputs
        assert [b.evictions for b in stats.buckets] == [0, 0]
        assert [b.captures for b in stats.buckets] == [1, 1]
        return
    assert sum(b.evictions for b in stats.buckets) >= 2
    assert sum(b.captures for b in stats.buckets) >= 4, "evicted buckets were captured again"

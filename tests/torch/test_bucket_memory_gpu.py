"""A bucket family's memory: shared outputs, the predicted reservation, per-bucket stats.

References: eager results, a family of the largest bucket alone, and the pool's own measured
reservation after ``capture_all`` (docs/shapes.md, "Sizing memory for serving").
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch import graph_module  # noqa: E402

import cugraphrt  # noqa: E402

pytestmark = pytest.mark.gpu

#: A serving-like family: 1, 2, 4, 8 and 16 to 128 by 8 (19 sizes).
SIZES = [1, 2, 4, 8, *range(16, 129, 8)]


def stack():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).cuda().half().eval()


def sample(n=SIZES[-1]):
    return torch.randn(n, 16, 256, device="cuda", dtype=torch.half)


def test_predicted_reservation_is_within_5_percent_of_the_measured_one():
    model = stack()
    family = graph_module(model, sample(), buckets=SIZES)
    predicted = family.predict_reserved_bytes()
    assert [b.captured for b in family.stats().buckets] == [False] * (len(SIZES) - 1) + [True]
    family.capture_all(progress=False)
    stats = family.stats()
    measured = stats.pool.reserved_bytes
    assert stats.predicted_reserved_bytes == predicted > 0
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)
    # The family's pool against the largest bucket captured alone, in a pool of its own.
    alone = graph_module(model, sample(), buckets=SIZES[-1:])
    alone.capture_all(progress=False)
    assert measured <= 1.05 * alone.stats().pool.reserved_bytes
    assert stats.shares_outputs and stats.pool.live_graphs == len(SIZES)
    # Per bucket: the largest one's capture found an empty pool, every other found it full.
    largest = stats.buckets[-1]
    assert largest.shared_bytes == 0 and largest.reserved_growth_bytes == predicted
    assert all(b.shared_bytes >= predicted for b in stats.buckets[:-1])
    assert sum(b.reserved_growth_bytes for b in stats.buckets) == measured
    assert all(b.exec_bytes is not None and b.exec_bytes >= 0 for b in stats.buckets)
    assert stats.exec_bytes == sum(b.exec_bytes for b in stats.buckets)
    assert "predicted reservation" in str(stats)


def test_shared_outputs_equal_eager_and_an_overwritten_one_raises():
    model = stack()
    family = graph_module(model, sample(), buckets=SIZES)
    family.capture_all(progress=False)
    with torch.no_grad():
        for n in (128, 3, 17, 100, 1, 128, 64):
            x = sample(n)
            torch.testing.assert_close(family(x), model(x), rtol=2e-3, atol=2e-3)
    small = family(sample(2))
    family(sample(128))  # another bucket: its replay may overwrite the first call's output
    with pytest.raises(RuntimeError, match="overwritten its memory"):
        small.sum()


def test_an_output_held_past_the_family_stays_readable():
    model = stack()
    family = graph_module(model, sample(), buckets=SIZES)
    x = sample(24)
    out = family(x)
    with torch.no_grad():
        expected = model(x)
    del family
    gc.collect()
    cugraphrt.empty_cache()
    torch.cuda.empty_cache()
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)


def test_the_shared_memory_goes_back_with_the_family():
    model = stack()
    with torch.no_grad():
        model(sample(8))  # cuBLAS's handle and workspace: made once, not the family's
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    family = graph_module(model, sample(), buckets=SIZES)
    family.capture_all(progress=False)
    reserved = family.stats().pool.reserved_bytes
    del family
    gc.collect()
    cugraphrt.empty_cache()
    torch.cuda.empty_cache()
    # Within two pages of where it started: the pool's segments went back (the warm-ups'
    # memory was the family's pool's).
    assert torch.cuda.mem_get_info()[0] >= free_before - (4 << 20), reserved


def test_a_given_pool_keeps_each_buckets_outputs():
    model = stack()
    pool = cugraphrt.graph_pool_handle()
    family = graph_module(model, sample(), buckets=[8, 16], pool=pool)
    family.capture_all(progress=False)
    assert not family.stats().shares_outputs
    big = family(sample(16))
    with torch.no_grad():
        x = sample(8)
        small = family(x)
        torch.testing.assert_close(small, model(x), rtol=2e-3, atol=2e-3)
    big.sum()  # bucket 8 was captured after 16: its replay cannot reach 16's outputs


def _free() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def _empty() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cugraphrt.empty_cache()


def test_a_family_leaves_no_warm_up_memory_cached():
    # What a server sees: cudaMemGetInfo after the build with nothing emptied, against the
    # same after emptying every cache. The warm-ups' activations (the largest bucket's, on
    # the capture stream) must have gone back already: the two readings differ by at most
    # 16 MiB (issue 51), where they differed by the warm-ups' whole working set before.
    model = stack()
    # Sequences of 128: the warm-ups' working set (about 100 MiB at the largest bucket) is
    # far above the 16 MiB allowed, so the test fails if it stays cached.
    x = torch.randn(SIZES[-1], 128, 256, device="cuda", dtype=torch.half)
    with torch.no_grad():
        model(x)  # kernels and handles for the default stream, billed to no reading
    _empty()
    before = _free()
    family = graph_module(model, x, buckets=SIZES)
    family.capture_all(progress=False)
    built = before - _free()
    _empty()
    emptied = before - _free()
    assert built > 0 and emptied > 0
    assert built - emptied <= 16 << 20, (built >> 20, emptied >> 20)
    # And the family still serves every size with eager's result (nothing it needs went).
    for n in (1, 37, SIZES[-1]):
        with torch.no_grad():
            want = model(x[:n])
        torch.testing.assert_close(family(x[:n]), want, atol=2e-2, rtol=2e-2)

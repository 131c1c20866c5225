"""The tensor-parallel decoder of the distributed tests and bench, on CPU: its shards and
all-reduces compute the unsharded float64 layer (two ranks emulated by two threads)."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from cugraphrt.bench.tp_decoder import Dims, build  # noqa: E402

DIMS = Dims(layers=2, hidden=64, heads=4, ffn=96, batch=3, max_len=8)


def _inputs(steps):
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(DIMS.batch, DIMS.hidden, generator=gen) for _ in range(steps)]


def test_one_rank_matches_the_float64_reference():
    decoder = build(torch, DIMS, rank=0, world=1, device="cpu", dtype=torch.float32)
    xs = _inputs(6)
    outs = [decoder.step(x) for x in xs]
    for got, want in zip(outs, decoder.reference(xs), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert int(decoder.pos) == 6
    decoder.reset()
    assert int(decoder.pos) == 0 and not any(c.any() for c in decoder.k_cache)


def test_two_ranks_sum_their_shards_to_the_reference(monkeypatch):
    barrier = threading.Barrier(2)
    partial: dict[int, torch.Tensor] = {}
    local = threading.local()

    def all_reduce(tensor, *args, **kwargs):  # two threads stand for two ranks
        partial[local.rank] = tensor.clone()
        barrier.wait()
        total = partial[0] + partial[1]
        barrier.wait()
        tensor.copy_(total)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    xs = _inputs(5)
    results: dict[int, list] = {}

    def rank_main(rank):
        local.rank = rank
        decoder = build(torch, DIMS, rank=rank, world=2, device="cpu", dtype=torch.float32)
        assert decoder.heads == 2 and decoder.layers[0]["gate"].shape == (48, 64)
        results[rank] = [decoder.step(x) for x in xs]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    reference = build(torch, DIMS, rank=0, world=1, device="cpu",
                      dtype=torch.float32).reference(xs)
    for rank in (0, 1):
        for got, want in zip(results[rank], reference, strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_sizes_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="must divide by the 3 ranks"):
        build(torch, DIMS, rank=0, world=3, device="cpu", dtype=torch.float32)

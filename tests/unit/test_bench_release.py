"""The bench's torch clean-up between workloads (no GPU: torch and CuPy's pool are faked)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from types import SimpleNamespace

import cupy

import cugraphrt
from cugraphrt.bench import torch_common


def fake_torch(calls: list[str], with_clear: bool = True):
    c = SimpleNamespace()
    if with_clear:
        c._cuda_clearCublasWorkspaces = lambda: calls.append("clear cuBLAS workspaces")
    cuda = SimpleNamespace(synchronize=lambda: calls.append("synchronize"),
                           empty_cache=lambda: calls.append("torch empty_cache"))
    return SimpleNamespace(_C=c, cuda=cuda)


def patch_pools(monkeypatch, calls: list[str]) -> None:
    monkeypatch.setattr(cugraphrt, "empty_cache", lambda: calls.append("cugraphrt empty_cache"))
    pool = SimpleNamespace(free_all_blocks=lambda: calls.append("cupy free_all_blocks"))
    monkeypatch.setattr(cupy, "get_default_memory_pool", lambda: pool)


def test_release_clears_torchs_blas_workspaces_before_emptying_its_cache(monkeypatch):
    # The clear must come before empty_cache, or a dropped hand graph's workspace would stay
    # cached (and referenced) while its memory went back to the driver.
    calls: list[str] = []
    patch_pools(monkeypatch, calls)
    torch_common.release_torch(fake_torch(calls))
    assert calls == ["synchronize", "clear cuBLAS workspaces", "torch empty_cache",
                     "cugraphrt empty_cache", "cupy free_all_blocks"]


def test_release_works_with_a_torch_that_cannot_clear_its_workspaces(monkeypatch):
    calls: list[str] = []
    patch_pools(monkeypatch, calls)
    torch_common.release_torch(fake_torch(calls, with_clear=False))
    assert calls == ["synchronize", "torch empty_cache", "cugraphrt empty_cache",
                     "cupy free_all_blocks"]


class _Cycle:
    """A build's result that only the cycle collector can free."""

    def __init__(self, freed: list[str]) -> None:
        self.me = self
        weakref.finalize(self, freed.append, "build freed")


def _torch_for_builds(calls: list[str] | None = None):
    torch = fake_torch([] if calls is None else calls)
    torch.set_grad_enabled = lambda grad: contextlib.nullcontext()
    return torch


def test_capture_batch_empties_every_cache_before_the_clock_and_keeps_workspaces(monkeypatch):
    # The previous build's teardown (a dropped graph's segments going back) happens before
    # the clock starts, for every system alike: not inside the next build, which for
    # torch.cuda.graph empties torch's cache on torch's clock.
    calls: list[str] = []
    patch_pools(monkeypatch, calls)
    monkeypatch.setattr(torch_common, "device_sync", lambda: calls.append("device sync"))
    monkeypatch.setattr(torch_common, "perf_counter", lambda: calls.append("clock") or 0.0)
    torch_common.capture_batch(_torch_for_builds(calls), lambda: calls.append("prepare"),
                               lambda model: calls.append("build"))
    assert calls[:calls.index("clock")] == [
        "prepare", "synchronize", "torch empty_cache", "cugraphrt empty_cache",
        "cupy free_all_blocks", "device sync"]
    assert calls[calls.index("clock"):] == ["clock", "build", "device sync", "clock"]
    assert "clear cuBLAS workspaces" not in calls  # a user's next capture finds them too


def test_capture_batch_collects_the_builds_cycles_scanning_only_new_objects(monkeypatch):
    patch_pools(monkeypatch, [])
    monkeypatch.setattr(torch_common, "device_sync", lambda: None)
    old = [object() for _ in range(100)]  # a container alive before the build
    frozen_during: list[int] = []
    freed: list[str] = []

    def build(model):
        frozen_during.append(gc.get_freeze_count())
        return _Cycle(freed)

    seconds = torch_common.capture_batch(_torch_for_builds(), lambda: None, build)
    assert seconds >= 0
    assert frozen_during[0] > 0  # what lived before the build was frozen during it
    assert freed == ["build freed"]  # the cycle was collected before capture_batch returned
    assert gc.get_freeze_count() == 0  # and everything was unfrozen
    assert len(old) == 100


def test_capture_batch_works_when_objects_were_frozen_before(monkeypatch):
    # On the GPU image, processes have objects frozen before the bench runs: the build's
    # cycles must still be collected, and the process ends up with nothing frozen (freezing
    # is a hint to the collector only).
    patch_pools(monkeypatch, [])
    monkeypatch.setattr(torch_common, "device_sync", lambda: None)
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        freed: list[str] = []
        counts: list[int] = []

        def build(model):
            counts.append(gc.get_freeze_count())
            return _Cycle(freed)

        torch_common.capture_batch(_torch_for_builds(), lambda: None, build)
        assert counts[0] > 0 and freed == ["build freed"]
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_rotating_times_each_build_in_turn():
    from cugraphrt.bench.spec import rotating

    batch = rotating([lambda: 1.0, lambda: 2.0, lambda: 3.0])
    assert [batch() for _ in range(7)] == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0]


def _recording_builds(monkeypatch, fail_at: int | None = None):
    """graph_builds with HandGraph and graph_module replaced by recorders: the build order,
    and the ``fail_at``-th build raising."""
    from cugraphrt.bench.spec import RowBuilder

    order: list[str] = []

    def build(system):
        def make(*args, **kwargs):
            order.append(system)
            if len(order) == fail_at:
                raise RuntimeError(f"{system} build {len(order)} failed")
            return (system, len(order))
        return make

    monkeypatch.setattr(torch_common, "HandGraph", build("torch_graph"))
    monkeypatch.setattr(torch_common, "adapter_function",
                        lambda name: build("cugraphrt_torch"))
    sample = SimpleNamespace(clone=lambda: "clone")
    row = RowBuilder("m", "us", ("torch_graph", "cugraphrt_torch"), "torch_graph",
                     "cugraphrt_torch")
    return torch_common.graph_builds(row, None, [1], sample), order, row


def test_graph_builds_alternate_which_system_builds_first(monkeypatch):
    builds, order, row = _recording_builds(monkeypatch)
    assert torch_common.PLACEMENTS == 3
    # torch's graph took the first place once, cugraphrt's next: no system always first.
    assert order == ["torch_graph", "cugraphrt_torch", "cugraphrt_torch", "torch_graph",
                     "torch_graph", "cugraphrt_torch"]
    assert builds == {"torch_graph": [("torch_graph", 1), ("torch_graph", 4),
                                      ("torch_graph", 5)],
                      "cugraphrt_torch": [("cugraphrt_torch", 2), ("cugraphrt_torch", 3),
                                          ("cugraphrt_torch", 6)]}
    assert row.row.cells == {}


def test_a_failed_build_leaves_its_system_out_and_says_why(monkeypatch):
    builds, order, row = _recording_builds(monkeypatch, fail_at=3)
    # cugraphrt's second build failed: no more of its builds, torch's go on.
    assert order == ["torch_graph", "cugraphrt_torch", "cugraphrt_torch", "torch_graph",
                     "torch_graph"]
    assert builds["cugraphrt_torch"] is None
    assert len(builds["torch_graph"]) == 3
    assert "build 3 failed" in str(row.row.cells["cugraphrt_torch"])

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

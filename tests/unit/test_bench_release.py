"""The bench's torch clean-up between workloads (no GPU: torch and CuPy's pool are faked)."""

from __future__ import annotations

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

"""The scripts of docs/experiments/ that need no GPU: the peer-suite renames (the migration's
names, exactly) and the regime-change table of docs/performance.md."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "docs" / "experiments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


TORCH_TEST = '''"""A peer test."""
from __future__ import annotations
import torch

def test_graph():
    g = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    with torch.cuda.graph(g, pool=pool):
        assert torch.cuda.is_current_stream_capturing()
    f = torch.cuda.make_graphed_callables(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    torch.cuda.graphs.graph_pool_handle  # the module path stays torch's
    torch.cuda.synchronize()
'''

CUPY_TEST = '''from cupy import cuda
import cupy

def test_graph():
    s = cuda.Stream(non_blocking=True)
    t = cupy.cuda.Stream()
    e = cuda.Event()
'''


def test_the_torch_renames_are_the_migrations_and_nothing_else():
    peer_suite = _load("peer_suite")
    renamed = peer_suite.rename(TORCH_TEST, "torch")
    for name in ("CUDAGraph()", "graph_pool_handle()", "graph(g, pool=pool)",
                 "is_current_stream_capturing()", "make_graphed_callables("):
        assert f"cugraphrt_torch.{name}" in renamed and f"torch.cuda.{name}" not in renamed
    assert "torch.cuda.graphs.graph_pool_handle" in renamed  # not a migrated name
    assert "torch.cuda.synchronize()" in renamed
    lines = renamed.splitlines()
    assert lines[2].startswith("import cugraphrt_torch")  # after the __future__ import
    compile(renamed, "renamed", "exec")


def test_the_cupy_renames_swap_the_stream_only():
    peer_suite = _load("peer_suite")
    renamed = peer_suite.rename(CUPY_TEST, "cupy")
    assert renamed.count("cugraphrt.Stream(") == 2 and "cuda.Event()" in renamed
    assert renamed.startswith("import cugraphrt")
    with pytest.raises(ValueError, match="nothing to rename"):
        peer_suite.rename("import torch\n", "torch")
    with pytest.raises(ValueError, match="peer must be"):
        peer_suite.rename(CUPY_TEST, "jax")


def test_the_regime_change_script_prints_the_table_performance_md_quotes():
    out = subprocess.run([sys.executable, str(EXPERIMENTS / "regime_change.py")],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    page = (ROOT / "docs" / "performance.md").read_text()
    for row in out.splitlines()[2:5]:
        assert row in page, row
    assert "[0.97, 1.01]" in out and "[0.97, 1.01]" in page

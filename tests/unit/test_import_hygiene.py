"""The core never imports torch, and imports without a GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_core_does_not_import_torch():
    result = _run("""
        import sys
        import cugraphrt, cugraphrt.random, cugraphrt.cli
        from cugraphrt import graphs, graphed, pool, _capture, _libs, _cublas
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("TORCH" if bad else "CLEAN", bad[:3])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("CLEAN"), result.stdout


def test_core_imports_with_torch_unavailable():
    result = _run("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, Block())
        import cugraphrt, cugraphrt.random
        print(cugraphrt.__version__)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_import_is_cheap_and_defers_kernels():
    result = _run("""
        import sys, cugraphrt
        print("cugraphrt.random" in sys.modules, "cupy_backends.cuda.libs.cublas" in sys.modules)
    """)
    assert result.stdout.split() == ["False", "False"], result.stdout + result.stderr

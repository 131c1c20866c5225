"""The core never imports torch: it must work where torch is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = textwrap.dedent("""
    import importlib, pkgutil, sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("No module named 'torch' (blocked by the test)")
            return None

    sys.meta_path.insert(0, BlockTorch())
    import cugraphrt
    names = [m.name for m in pkgutil.walk_packages(cugraphrt.__path__, "cugraphrt.")
             if not m.name.endswith("__main__") and "torch" not in m.name]
    for name in names:
        importlib.import_module(name)
    cugraphrt.Graph()
    cugraphrt.MemPool  # the public namespace resolves
    loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    assert not loaded, loaded
    print("imported", len(names), "modules")
""")


def test_core_imports_with_torch_blocked():
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout


def test_blocking_really_hides_torch():
    # The check above means something only if the blocker works.
    script = _SCRIPT.split("import cugraphrt")[0] + "import torch\n"
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "blocked by the test" in result.stderr

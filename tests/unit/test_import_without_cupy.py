"""Without CuPy, `import cugraphrt` says which extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = textwrap.dedent("""
    import sys

    class BlockCupy:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cupy", "cupy_backends", "cupyx"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)",
                                          name=name)
            return None

    sys.meta_path.insert(0, BlockCupy())
    try:
        import cugraphrt
    except ImportError as exc:
        print("ImportError:", exc)
        print("name:", exc.name)
    else:
        print("imported")
""")


def test_import_without_cupy_names_the_extra():
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ImportError: cugraphrt needs CuPy (got: No module named 'cupy'" in out
    assert 'pip install "cugraphrt[cuda13]" (CUDA 13)' in out
    assert 'pip install "cugraphrt[cuda12]" (CUDA 12)' in out
    assert 'in a clone of cugraphrt: pip install -e ".[cuda13]"' in out
    assert "name: cupy" in out

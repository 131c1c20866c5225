"""The core never imports torch, and imports without a GPU."""

from __future__ import annotations

import ast
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


# -- every module on its own, and one-way layers ------------------------------------------

PACKAGES = {"cugraphrt": ROOT / "cugraphrt",
            "cugraphrt_torch": ROOT / "adapters" / "cugraphrt_torch"}


def _modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (``__main__`` left out: it runs the CLI)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_every_module_imports_on_its_own():
    # One forked child per module, after the third-party libraries are loaded in the parent:
    # each child starts with none of the packages' modules, so a module that only imports
    # after another one did (an import cycle, a missing import) fails here.
    names = sorted(_modules())
    result = _run(f"""
        import os, sys, traceback, importlib
        import cupy, numpy, pydantic, torch
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "adapters")!r}]
        failed = []
        for name in {names!r}:
            pid = os.fork()
            if pid == 0:
                try:
                    importlib.import_module(name)
                except BaseException:
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status:
                failed.append(name)
        print("FAILED", failed)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "FAILED []", result.stdout + result.stderr


def _imports_of(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions."""
    modules = _modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in targets if t in modules] or [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_cli_dispatches_to_the_bench_and_nothing_imports_back():
    # The layers run one way: core < bench < cli. A lazy import counts too (the bench once
    # imported cugraphrt.cli from inside its main(), closing a circle bench -> cli -> bench).
    graph = {name: _imports_of(name, path) for name, path in _modules().items()}
    assert "cugraphrt.bench" in graph["cugraphrt.cli"], "the CLI no longer reaches the bench?"
    back = sorted((name, target) for name, targets in graph.items() for target in targets
                  if (target == "cugraphrt.cli" and name != "cugraphrt.cli")
                  or (target.startswith("cugraphrt.bench") and not name.startswith(
                      ("cugraphrt.bench", "cugraphrt.cli"))))
    assert back == [], f"imports against the layers: {back}"


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (a list that starts and ends at the same module), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circles_between_modules():
    # A lower floor never imports a higher one, lazily inside a function either: the floors
    # run errors -> _cuda/options -> devices -> backing -> pool -> _capture -> ... -> graphs.
    # Package __init__ modules only re-export, so imports of a package itself are left out.
    packages = set(PACKAGES)
    graph = {name: {t for t in _imports_of(name, path) if t not in packages}
             for name, path in _modules().items() if name not in packages}
    assert _cycle(graph) == []

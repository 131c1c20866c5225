"""The core never imports torch, and imports without a GPU."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_core_does_not_import_torch():
    result = _run("""
        import sys
        import cugraphrt, cugraphrt.random, cugraphrt.cli
        from cugraphrt._capture import graphs
        from cugraphrt._callables import graphed
        from cugraphrt._memory import pool
        from cugraphrt._capture import stream_capture as _capture
        from cugraphrt._libraries import capture_setup as _libs
        from cugraphrt._cuda import cublas as _cublas
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

def _package_dir(package: str) -> Path:
    """The folder ``package`` imports from (the source tree, or an installed wheel when the
    tests run against one), found without importing it: cugraphrt_torch imports torch."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not importable"
    return Path(next(iter(spec.submodule_search_locations)))


PACKAGES = {name: _package_dir(name) for name in ("cugraphrt", "cugraphrt_torch")}


def _modules(packages=tuple(PACKAGES)) -> dict[str, Path]:
    """Every module of ``packages``, by dotted name (``__main__`` left out: it runs the CLI)."""
    found = {}
    for package in packages:
        folder = PACKAGES[package]
        for path in sorted(folder.rglob("*.py")):
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _failing_alone(names: list[str], preload: list[str]) -> str:
    """Import each module in a child forked after ``preload`` (third-party libraries) is
    loaded: each child starts with none of the packages' modules, so a module that only
    imports after another one did (an import cycle, a missing import) fails. Returns the
    child's report, ``FAILED []`` when every module imported."""
    roots = sorted({str(PACKAGES[name].parent) for name in PACKAGES})
    result = _run(f"""
        import os, sys, traceback, importlib
        for lib in {preload!r}:
            importlib.import_module(lib)
        sys.path[:0] = {roots!r}
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
    return result.stdout + result.stderr


def test_the_forked_importer_reports_a_module_that_fails():
    report = _failing_alone(["cugraphrt._capture.graphs", "cugraphrt.no_such_module"], ["cupy"])
    assert report.startswith("FAILED ['cugraphrt.no_such_module']"), report


def test_every_core_module_imports_on_its_own():
    # Without torch: the core never needs it, and the README's install does not bring it.
    names = sorted(_modules(["cugraphrt"]))
    assert "cugraphrt._capture.graphs" in names and "cugraphrt.bench.runner" in names, names
    report = _failing_alone(names, ["cupy", "numpy", "pydantic"])
    assert report.startswith("FAILED []"), report


def test_every_adapter_module_imports_on_its_own():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the cugraphrt_torch modules import it "
                    "(pip install torch to check them)")
    names = sorted(_modules(["cugraphrt_torch"]))
    assert "cugraphrt_torch.compile.dynamo" in names, names
    report = _failing_alone(names, ["cupy", "numpy", "pydantic", "torch"])
    assert report.startswith("FAILED []"), report


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

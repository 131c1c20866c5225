"""The layers of the package, read from the source (GPU-free).

* An adapter (``cugraphrt_torch``, the minitensor example) imports only cugraphrt's public
  modules, never a private name, and never reaches the core's private hooks.
* The core never imports an adapter, nor the bench outside the CLI's lazy import.
* Every CUDA call goes through the ``cugraphrt._cuda`` floor.
* No import cycle between modules, nor between the core's rooms (its folders).
* The torch adapter's folders import only folders of a lower layer (docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cugraphrt
from cugraphrt import adapter

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "cugraphrt"
TORCH_ADAPTER = ROOT / "adapters" / "cugraphrt_torch"
EXAMPLE_ADAPTER = ROOT / "examples" / "dlpack_framework"

# These tests read the source tree; the CI job that tests the installed wheel has none.
pytestmark = pytest.mark.skipif(not (CORE / "__init__.py").is_file()
                                or not (TORCH_ADAPTER / "__init__.py").is_file(),
                                reason="reads the source tree (absent beside an installed wheel)")

#: The modules an adapter may import from cugraphrt, and so the names it may use: each one's
#: ``__all__`` (``cugraphrt.adapter.__all__`` is the adapter interface).
PUBLIC = {"cugraphrt", "cugraphrt.adapter", "cugraphrt.errors", "cugraphrt.options",
          "cugraphrt.distributed", "cugraphrt.random"}
#: Chains rooted at another library's names: their private names are the adapter's own floor
#: (issue 52), not the core's.
FOREIGN_ROOTS = ("torch", "transformers", "cupy", "numpy", "ctypes")


def _allowed(module: str) -> set[str]:
    """The names of ``module`` (a public module of cugraphrt) an adapter may use."""
    import importlib

    names = set(getattr(importlib.import_module(module), "__all__", ()))
    return names | {"__version__"} if module == "cugraphrt" else names


#: What only the floor may import or reach.
CUDA_MODULES = ("cupy_backends.cuda.api", "cuda.bindings", "cuda.core", "cupy.cuda.runtime",
                "cupy.cuda.driver")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    base = ROOT / "adapters" if TORCH_ADAPTER in path.parents else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, top_level: bool = False) -> list[tuple[str, str, int]]:
    """(module, imported name or "", line) of every import; relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    inside = ROOT in path.parents
    own = _module(path) if inside else path.stem
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    nodes = tree.body if top_level else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found += [(base, alias.name, node.lineno) for alias in node.names]
    return found


def _adapter_files() -> list[Path]:
    return _files(TORCH_ADAPTER) + _files(EXAMPLE_ADAPTER)


def _public_uses(path: Path) -> list[str]:
    """What ``path`` takes from cugraphrt outside the allowlist: imports of a module that is
    not public or of a name outside its ``__all__``, and attributes reached through an alias
    of a public module (``core.begin_capture``) that its ``__all__`` does not name."""
    found = []
    aliases: dict[str, str] = {}
    for module, name, line in _imports(path):
        if module != "cugraphrt" and not module.startswith("cugraphrt."):
            continue
        where = f"{path.relative_to(ROOT)}:{line}"
        if module not in PUBLIC:
            found.append(f"{where} imports {module}: not a public module")
            continue
        full = f"{module}.{name}" if name else module
        if full in PUBLIC:  # a public module itself (from cugraphrt import adapter as core)
            aliases[name or module.rpartition(".")[2]] = full
        elif name and name not in _allowed(module):
            found.append(f"{where} imports {module}.{name}: not in {module}.__all__")
    tree = ast.parse(path.read_text(), str(path))
    for alias in ast.walk(tree):
        if isinstance(alias, ast.ImportFrom) and alias.module in PUBLIC:
            for item in alias.names:
                full = f"{alias.module}.{item.name}"
                if full in PUBLIC:
                    aliases[item.asname or item.name] = full
        elif isinstance(alias, ast.Import):
            for item in alias.names:
                if item.name in PUBLIC and item.asname:
                    aliases[item.asname] = item.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and not node.attr.startswith("__")
                and node.attr not in _allowed(aliases[node.value.id])):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} uses "
                         f"{aliases[node.value.id]}.{node.attr}: not in its __all__")
    return found


def _private_names(files: list[Path]) -> set[str]:
    """Private names (one underscore) that ``files`` define: functions, classes, attributes
    they assign and ``__slots__`` entries."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif (isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                    and isinstance(node.value, (ast.Tuple, ast.List))):
                names.update(str(e.value) for e in node.value.elts
                             if isinstance(e, ast.Constant))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _core_private_reaches(path: Path, core_only: set[str]) -> list[str]:
    """Attributes ``path`` reaches that only the core defines (private ones)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in core_only:
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.value if not isinstance(root, ast.Call) else root.func
            if isinstance(root, ast.Name) and root.id in FOREIGN_ROOTS:
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} reaches "
                         f"{ast.unparse(node)}, a private name of the core")
    return found


def _core_only_private_names() -> set[str]:
    core = [p for p in _files(CORE) if CORE / "bench" not in p.parents]
    return _private_names(core) - _private_names(_adapter_files())


@pytest.mark.parametrize("path", _adapter_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_adapters_use_only_what_the_public_modules_export(path):
    found = _public_uses(path)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", _adapter_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_adapters_reach_no_private_name_of_the_core(path):
    found = _core_private_reaches(path, _core_only_private_names())
    assert not found, "\n".join(found) + "; use cugraphrt.adapter"


def test_the_allowlist_catches_what_an_adapter_must_not_use():
    # The two tests above can fail: a planted file trips each rule.
    planted = ROOT / "tests" / "unit" / "_planted_adapter.py"
    planted.write_text("from cugraphrt._capture.graphs import Graph\n"
                       "from cugraphrt import _tree\n"
                       "from cugraphrt.adapter import Bucketed, _runtime\n"
                       "from cugraphrt import adapter as core\n"
                       "core.begin_capture\ncore.not_exported\n"
                       "def f(family):\n    return family._core._fallbacks, family.fallback\n")
    try:
        uses = _public_uses(planted)
        reaches = _core_private_reaches(planted, _core_only_private_names())
    finally:
        planted.unlink()
    assert len(uses) == 4, uses  # a private module, _tree, _runtime, core.not_exported
    assert any("not_exported" in u for u in uses) and any("_runtime" in u for u in uses)
    assert [r.split(" reaches ")[1] for r in reaches] == [
        "family._core._fallbacks, a private name of the core"]
    assert "_fallback" not in _private_names(_adapter_files())  # the core's alone


def test_the_core_imports_no_adapter_and_the_bench_only_from_the_cli():
    for path in _files(CORE):
        if CORE / "bench" in path.parents:
            continue
        for module, _, line in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            assert not module.startswith("cugraphrt_torch"), f"{where} imports the adapter"
            if module.startswith("cugraphrt.bench"):
                assert path.name == "cli.py", f"{where} imports the bench"
        for module, _, line in _imports(path, top_level=True):
            assert not module.startswith("cugraphrt.bench"), \
                f"{path.relative_to(ROOT)}:{line} imports the bench at import time"


def test_every_cuda_call_goes_through_the_floor():
    outside = [p for p in _files(CORE) + _files(TORCH_ADAPTER) + _files(EXAMPLE_ADAPTER)
               if CORE / "_cuda" not in p.parents and CORE / "bench" not in p.parents]
    for path in outside:
        text = path.read_text()
        for module, name, line in _imports(path):
            full = f"{module}.{name}" if name else module
            assert not full.startswith(CUDA_MODULES), \
                f"{path.relative_to(ROOT)}:{line} imports {full}: call it through cugraphrt._cuda"
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and ast.unparse(node).startswith(
                    ("cupy.cuda.runtime.", "cupy.cuda.driver.")):
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} calls "
                            f"{ast.unparse(node)}: call it through cugraphrt._cuda")
            if isinstance(node, ast.Attribute) and ast.unparse(node) == "ctypes.CDLL":
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} loads a library")


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports at import time."""
    files = _files(CORE) + _files(TORCH_ADAPTER)
    known = {_module(p) for p in files}
    edges: dict[str, set[str]] = {}
    for path in files:
        out = edges.setdefault(_module(path), set())
        for module, name, _ in _imports(path, top_level=True):
            target = f"{module}.{name}" if f"{module}.{name}" in known else module
            if target in known and target != _module(path):
                out.add(target)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_between_the_rooms_of_the_core():
    def room(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != "cugraphrt" or len(parts) < 2 or parts[1] == "bench":
            return None
        folder = CORE / parts[1]
        return parts[1] if folder.is_dir() else None

    rooms: dict[str, set[str]] = {}
    for source, targets in _graph().items():
        a = room(source)
        if a is None:
            continue
        for target in targets:
            b = room(target)
            if b is not None and b != a:
                rooms.setdefault(a, set()).add(b)
    cycle = _cycle(rooms)
    assert cycle is None, "rooms import each other: " + " -> ".join(cycle or [])


#: The torch adapter's folders, bottom up: a folder imports only folders of lower layers
#: (lazily inside a function too). torch's private names live in ``_internals``; capture and
#: memory sit on it; the callables, the compile backend, control flow and distributed
#: capture beside each other on capture; inference pieces use the compile backend; generation
#: is on top. The package's ``__init__`` only re-exports.
ADAPTER_LAYERS = (("_internals",), ("capture",),
                  ("autograd", "compile", "control", "distributed"), ("inference",),
                  ("generation",))


def _arrows_up(edges: dict[str, set[str]]) -> list[str]:
    """Folder imports that do not go strictly down ``ADAPTER_LAYERS``."""
    level = {name: i for i, layer in enumerate(ADAPTER_LAYERS) for name in layer}
    return [f"{a} -> {b}" for a, targets in sorted(edges.items()) for b in sorted(targets)
            if a not in level or b not in level or level[b] >= level[a]]


def _adapter_folder_edges() -> dict[str, set[str]]:
    files = _files(TORCH_ADAPTER)
    known = {_module(p) for p in files}
    edges: dict[str, set[str]] = {}
    for path in files:
        source = _module(path).split(".")
        if len(source) < 3:  # cugraphrt_torch/__init__.py: the top, re-exports only
            continue
        for module, name, _ in _imports(path):
            target = f"{module}.{name}" if f"{module}.{name}" in known else module
            parts = target.split(".")
            if target in known and len(parts) >= 2 and parts[1] != source[1]:
                edges.setdefault(source[1], set()).add(parts[1])
    return edges


def test_the_torch_adapters_folders_import_only_downward():
    edges = _adapter_folder_edges()
    folders = {p.name for p in TORCH_ADAPTER.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {name for layer in ADAPTER_LAYERS for name in layer}, \
        "a folder of the adapter is missing from ADAPTER_LAYERS, or gone"
    assert _arrows_up(edges) == []
    assert _cycle(edges) is None


def test_the_layer_rule_sees_an_arrow_up():
    assert _arrows_up({"capture": {"generation"}}) == ["capture -> generation"]
    assert _arrows_up({"compile": {"control"}}) == ["compile -> control"]  # same layer
    assert _arrows_up({"generation": {"capture", "_internals"}}) == []


def test_the_cycle_finder_finds_a_cycle():
    # The tests above can fail: the finder sees a planted cycle, and none without it.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_rules_catch_a_private_import(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("from cugraphrt._capture.graphs import Graph\nfrom cugraphrt import _tree\n")
    found = [(m, n) for m, n, _ in _imports(bad) if m.startswith("cugraphrt")]
    assert ("cugraphrt._capture.graphs", "Graph") in found and ("cugraphrt", "_tree") in found
    assert not all(m in PUBLIC and not n.startswith("_") for m, n in found)


FRAMEWORK_MEMBERS = [name for name in vars(adapter.Framework)
                     if not name.startswith("_") and name not in ("name",)]


def _frameworks() -> list:
    import sys

    sys.path.insert(0, str(EXAMPLE_ADAPTER))
    try:
        import cugraphrt_minitensor
    finally:
        sys.path.remove(str(EXAMPLE_ADAPTER))
    found = [adapter.CUPY, cugraphrt_minitensor.MINI]
    try:
        from cugraphrt_torch.capture.framework import TORCH
    except ImportError:  # torch is not installed here
        return found
    return [*found, TORCH]


@pytest.mark.parametrize("framework", _frameworks(), ids=lambda f: f.name)
def test_every_framework_implements_the_whole_interface(framework):
    assert "hand_out" in FRAMEWORK_MEMBERS and "capture" in FRAMEWORK_MEMBERS
    missing = [name for name in FRAMEWORK_MEMBERS if not callable(getattr(framework, name, None))
               and name != "array_type"]
    assert not missing, f"{framework.name} lacks {missing}"
    assert isinstance(framework.array_type, type)


def test_the_adapter_interface_exports_what_it_documents():
    for name in adapter.__all__:
        assert hasattr(adapter, name), name
    assert cugraphrt.adapter is adapter

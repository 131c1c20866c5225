"""The torch adapter's floor, read from the source (GPU-free, torch-free).

Only ``cugraphrt_torch._internals`` touches torch's and transformers' private names (issue
52): outside it, no module imports ``torch._*`` or transformers, reaches a ``_`` attribute
through ``torch``, or reads the private attributes torch puts on tensors, storages and
operators. The last test plants each kind of reach and shows the check catching it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "adapters" / "cugraphrt_torch"
FLOOR = ADAPTER / "_internals"

pytestmark = pytest.mark.skipif(not (ADAPTER / "__init__.py").is_file(),
                                reason="reads the source tree (absent beside an installed wheel)")

#: Private attributes torch and transformers put on objects of theirs (a tensor's version
#: counter, a storage's C object, an operator's schema, a TorchBind type, a model's
#: compiled call): read through any name, they are the floor's.
PRIVATE_ATTRIBUTES = frozenset({"_version", "_cdata", "_schema", "_overloadname", "_type",
                                "_compiled_call", "_get_default_group", "_get_default_store"})


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reaches(source: str) -> list[tuple[int, str]]:
    """(line, what) for every private torch or transformers name ``source`` touches."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "transformers" or (parts[0] == "torch"
                                                  and any(map(_private, parts[1:]))):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            if parts[0] == "transformers" or (parts[0] == "torch" and (
                    any(map(_private, parts[1:])) or any(map(_private, names)))):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES or (
                    _private(node.attr) and _root(node) == "torch"):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in PRIVATE_ATTRIBUTES):
            found.append((node.lineno, ast.unparse(node)))
    return found


def _outside_the_floor() -> list[Path]:
    return sorted(p for p in ADAPTER.rglob("*.py") if FLOOR not in p.parents)


@pytest.mark.parametrize("path", _outside_the_floor(), ids=lambda p: str(p.relative_to(ADAPTER)))
def test_only_the_floor_touches_private_torch_names(path):
    found = reaches(path.read_text())
    assert not found, "\n".join(
        f"{path.relative_to(ROOT)}:{line} touches {what}: add a named function to "
        f"cugraphrt_torch._internals (with the versions it was tested on) and call that"
        for line, what in found)


def test_the_floor_holds_the_names():
    # The floor is where the reaches are: the rule above is not vacuous.
    inside = [what for p in FLOOR.glob("*.py") for _, what in reaches(p.read_text())]
    assert any(what.startswith("torch._C.") for what in inside)
    assert any("_schema" in what for what in inside)
    assert any("transformers" in what for what in inside)


@pytest.mark.parametrize("planted", [
    "import torch._dynamo\n",
    "from torch._inductor import lowering\n",
    "from torch import _C\n",
    "from transformers import StaticCache\n",
    "import torch\nflag = torch._C._cuda_clearCublasWorkspaces()\n",
    "import torch\ngroup = torch.distributed.distributed_c10d._get_default_group()\n",
    "def f(t):\n    return t._version\n",
    "def f(op):\n    return op._schema.arguments\n",
    "def f(node):\n    return getattr(node.target, '_schema', None)\n",
    "def f(storage):\n    return storage._cdata\n",
])
def test_the_check_catches_every_kind_of_reach(planted):
    assert reaches(planted), planted


def test_the_check_leaves_public_and_own_names_alone():
    clean = ("import torch\nfrom torch.multiprocessing.reductions import StorageWeakRef\n"
             "v = torch.__version__\nx = torch.cuda.current_stream()\n"
             "class A:\n    def f(self):\n        return self._private, A._other\n")
    assert reaches(clean) == []

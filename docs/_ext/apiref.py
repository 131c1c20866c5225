"""The generated pages of the documentation site: the API reference and the examples.

Nothing here lists a name. Each package's reference page holds every name of its
``__all__``; each public submodule (no leading underscore) that has names of its own, beyond
what the package re-exports, gets a page of those names; the examples page holds every
``examples/*.py``. So a name added to ``__all__``, a new public module or a new example is
documented by the next build with no edit here. ``docs/conf.py`` writes the pages into
``docs/reference/`` (git-ignored) before Sphinx reads the sources, and
``tests/unit/test_docs_reference.py`` checks them against the packages.

Importable without Sphinx: the test uses :func:`package_pages` and :func:`examples_page`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import types
from pathlib import Path

PACKAGES = ("cugraphrt", "cugraphrt_torch")
OUT = "reference"  # folder under docs/ that holds the generated pages
GENERATED = "generated"  # autosummary's per-name pages, under OUT

_KINDS = ("Classes", "Functions", "Exceptions", "Constants and types")


def _kind(obj: object) -> str:
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return "Exceptions"
    if inspect.isclass(obj):
        return "Classes"
    if inspect.isroutine(obj):
        return "Functions"
    return "Constants and types"


def public_names(module: types.ModuleType) -> list[str]:
    """The module's ``__all__``, or its own public names when it has none."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return list(names)


def submodules(package: types.ModuleType) -> list[str]:
    """The public submodules of ``package``: named without a leading underscore, found on
    disk (``pkgutil``) or named in the package's ``__all__``."""
    found = {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")}
    found |= {n for n in public_names(package)
              if isinstance(getattr(package, n, None), types.ModuleType)}
    return sorted(f"{package.__name__}.{name}" for name in found)


def _page(module: types.ModuleType, names: list[str], children: list[str]) -> str:
    """One reference page: the module's docstring, then its names by kind, then links to the
    pages of ``children`` (submodules)."""
    title = module.__name__
    lines = [title, "=" * len(title), "", f".. automodule:: {title}", "   :no-members:", "",
             f".. currentmodule:: {title}", ""]
    by_kind: dict[str, list[str]] = {kind: [] for kind in _KINDS}
    for name in sorted(names, key=str.lower):
        by_kind[_kind(getattr(module, name))].append(name)
    for kind in _KINDS:
        if not by_kind[kind]:
            continue
        lines += [kind, "-" * len(kind), ""]
        if kind == "Constants and types":
            # Values are shown where they are documented: no page of their own.
            for name in by_kind[kind]:
                lines += [f".. autodata:: {name}", ""]
            continue
        lines += [".. autosummary::", f"   :toctree: {GENERATED}", "   :nosignatures:", ""]
        lines += [f"   {name}" for name in by_kind[kind]] + [""]
    if children:
        lines += ["Submodules", "----------", "", ".. toctree::", "   :maxdepth: 1", ""]
        lines += [f"   {child}" for child in children] + [""]
    return "\n".join(lines)


def package_pages(package_name: str) -> dict[str, str]:
    """The reference pages of one package, by file name (under ``docs/reference``).

    The package page lists its ``__all__`` (a submodule named there is linked, not listed);
    every public submodule with names the package does not re-export gets its own page.
    """
    try:
        package = importlib.import_module(package_name)
    except ImportError as exc:
        raise ImportError(
            f"the API reference documents {package_name}, which does not import (got {exc}); "
            f'install what it needs: pip install -e ".[cuda13,torch,docs]"') from exc
    exported = {id(getattr(package, n)) for n in public_names(package)
                if not isinstance(getattr(package, n), types.ModuleType)}
    pages: dict[str, str] = {}
    children = []
    for name in submodules(package):
        module = importlib.import_module(name)
        own = [n for n in public_names(module) if id(getattr(module, n)) not in exported]
        if own or name.rpartition(".")[2] in public_names(package):
            pages[f"{name}.rst"] = _page(module, own, [])
            children.append(name)
    top = [n for n in public_names(package)
           if not isinstance(getattr(package, n), types.ModuleType)]
    pages[f"{package_name}.rst"] = _page(package, top, children)
    return pages


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def examples_page(examples: Path) -> str:
    """A MyST page with every example: its docstring (Markdown-like prose) and its code."""
    lines = ["# Examples", "",
             "Complete programs, run from the repository root as `python examples/NAME.py` "
             "(each needs a CUDA GPU; the GPU tests run them).",
             ""]
    for path in sorted(examples.glob("*.py")):
        rel = f"../../examples/{path.name}"
        lines += [f"## {path.name}", "", _docstring(path), "",
                  f"{{download}}`Download {path.name} <{rel}>`", "",
                  f"```{{literalinclude}} {rel}", ":language: python", "```", ""]
    return "\n".join(lines)


def filename_map(pages: dict[str, str]) -> dict[str, str]:
    """autosummary file names for names that differ only in case (``cugraphrt.Graph`` and
    ``cugraphrt.graph``): one file each on case-insensitive file systems too."""
    full: list[str] = []
    for text in pages.values():
        module = ""
        for line in text.splitlines():
            if line.startswith(".. currentmodule:: "):
                module = line.split()[-1]
            elif line.startswith("   ") and not line.strip().startswith(":") and module:
                name = line.strip()
                if name.isidentifier():
                    full.append(f"{module}.{name}")
    mapping: dict[str, str] = {}
    taken: dict[str, int] = {}
    for name in sorted(set(full)):
        key = name.lower()
        taken[key] = taken.get(key, 0) + 1
        if taken[key] > 1:
            mapping[name] = f"{name}-{taken[key]}"
    return mapping


def write_pages(docs: Path) -> dict[str, str]:
    """Write the generated pages under ``docs/reference`` (only those whose text changed, so
    Sphinx rebuilds only what changed); returns the autosummary file-name map."""
    out = docs / OUT
    out.mkdir(exist_ok=True)
    pages: dict[str, str] = {}
    for package in PACKAGES:
        pages.update(package_pages(package))
    mapping = filename_map(pages)
    pages["examples.md"] = examples_page(docs.parent / "examples")
    for old in out.glob("*.*"):
        if old.is_file() and old.name not in pages:
            old.unlink()  # a module or page that no longer exists
    for name, text in pages.items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return mapping

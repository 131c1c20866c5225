"""The documentation site documents every public name of cugraphrt and cugraphrt_torch.

The reference pages are generated at build time from the packages' ``__all__``
(``docs/_ext/apiref.py``). These tests read the generated reStructuredText, which is what
Sphinx's autosummary turns into one page per name, so they run without Sphinx; where the
site was built (``CUGRAPHRT_DOCS_HTML=docs/_build/html``, as ``.ci/run`` sets after its docs
job), the built inventory is checked too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import types
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ["cugraphrt", pytest.param("cugraphrt_torch", marks=pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed: cugraphrt_torch's names are read by importing it"))]


def _apiref() -> types.ModuleType:
    path = DOCS / "_ext" / "apiref.py"
    if not path.is_file():
        pytest.skip(f"the tests run without the repository's docs/ ({path} is missing)")
    spec = importlib.util.spec_from_file_location("_cugraphrt_docs_apiref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented(pages: dict[str, str]) -> dict[str, set[str]]:
    """The full names each page documents (autosummary entries, autodata) and the pages it
    links (toctree entries), read off the reStructuredText as Sphinx would."""
    found: dict[str, set[str]] = {}
    for page, text in pages.items():
        names = found.setdefault(page, set())
        module, block = "", ""
        for line in text.splitlines():
            if line.startswith(".. currentmodule:: "):
                module = line.split()[-1]
            elif line.startswith(".. autodata:: "):
                names.add(f"{module}.{line.split()[-1]}")
            elif line.startswith(".. "):
                block = line.split()[1]
            elif line.startswith("   ") and not line.strip().startswith(":") and line.strip():
                entry = line.strip()
                names.add(f"{module}.{entry}" if block == "autosummary::" else f"page:{entry}")
            elif line and not line.startswith(" "):
                block = ""
    return found


def _reference(package: str):
    """The package, its generated pages and what each page documents."""
    module = importlib.import_module(package)
    pages = _apiref().package_pages(package)
    return module, pages, _documented(pages)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_of_all_is_in_the_reference(package):
    module, pages, documented = _reference(package)
    top = documented[f"{package}.rst"]
    missing = []
    for name in module.__all__:
        if isinstance(getattr(module, name), types.ModuleType):
            ok = f"page:{package}.{name}" in top and f"{package}.{name}.rst" in pages
        else:
            ok = f"{package}.{name}" in top
        if not ok:
            missing.append(name)
    assert missing == [], f"names of {package}.__all__ missing from the reference: {missing}"
    assert len(top) >= len(module.__all__)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_submodule_name_is_documented_once(package):
    # A submodule's own name is documented on its page; one the package re-exports, on the
    # package's page (under the package's name, the one users write).
    apiref = _apiref()
    top_module, pages, documented = _reference(package)
    everything = set().union(*documented.values())
    for name in apiref.submodules(top_module):
        sub = importlib.import_module(name)
        for attr in apiref.public_names(sub):
            obj = getattr(sub, attr)
            reexported = [n for n in top_module.__all__ if getattr(top_module, n) is obj]
            where = {f"{package}.{n}" for n in reexported} or {f"{name}.{attr}"}
            assert where & everything, f"{name}.{attr} is not in the reference"
    assert not [p for p in pages if p.startswith(f"{package}._")], "a private module has a page"


def test_the_examples_page_shows_every_example():
    apiref = _apiref()
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert len(examples) >= 5
    page = apiref.examples_page(ROOT / "examples")
    for path in examples:
        assert f"## {path.name}" in page
        assert f"{{literalinclude}} ../../examples/{path.name}" in page


def test_names_differing_in_case_get_their_own_files():
    apiref = _apiref()
    pages = {"x.rst": ".. currentmodule:: pkg\n\n.. autosummary::\n   :toctree: g\n\n"
                      "   Graph\n   graph\n   other\n"}
    assert apiref.filename_map(pages) == {"pkg.graph": "pkg.graph-2"}


def _inventory(path: Path) -> set[str]:
    """The Python object names of a Sphinx ``objects.inv`` (version 2)."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):  # four plain-text header lines, then the zlib stream
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2"), data[:40]
    names = set()
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        name, role = line.split(" ", 2)[:2]
        if role.startswith("py:"):
            names.add(name)
    return names


@pytest.mark.skipif(not os.environ.get("CUGRAPHRT_DOCS_HTML"),
                    reason="the site is not built here: .ci/run's docs job builds it and sets "
                           "CUGRAPHRT_DOCS_HTML=docs/_build/html")
@pytest.mark.parametrize("package", PACKAGES)
def test_the_built_site_documents_every_name_of_all(package):
    inventory = _inventory(ROOT / os.environ["CUGRAPHRT_DOCS_HTML"] / "objects.inv")
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if f"{package}.{n}" not in inventory]
    assert missing == [], f"not in the built reference: {missing}"

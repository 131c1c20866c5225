"""Sphinx configuration of the cugraphrt documentation site.

Build: ``sphinx-build -W docs docs/_build/html`` (after ``pip install -e ".[cuda13,torch,docs]"``).
The Markdown pages of docs/ are read as they are (MyST-Parser); the API reference and the
examples page are generated from the packages' ``__all__`` and examples/ by ``_ext/apiref.py``
before Sphinx reads anything, so this file lists no name.
"""

from __future__ import annotations

import inspect
import operator
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The packages as the source tree has them (an editable install points there too).
sys.path[:0] = [str(ROOT), str(ROOT / "adapters"), str(DOCS / "_ext")]

import apiref  # noqa: E402

import cugraphrt  # noqa: E402

project = "cugraphrt"
copyright = "the cugraphrt authors"
release = version = cugraphrt.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
templates_path = ["_templates"]

# MyST: GitHub-flavoured tables and strikethrough; headings get anchors so the pages' own
# "page.md#section" links resolve.
myst_enable_extensions = ["strikethrough"]
myst_heading_anchors = 3

# The reference: NumPy-style docstrings, signatures with their annotations.
autosummary_generate = True
autosummary_filename_map = apiref.write_pages(DOCS)
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    # pydantic's machinery on every model; the fields are the docstrings' "Attributes".
    "exclude-members": "model_config, model_fields, model_computed_fields",
}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # "Attributes" as fields: pydantic fields are no class attributes
napoleon_use_rtype = True  # one "Return type" field (autodoc adds none beside it)

html_theme = "furo"
html_title = f"cugraphrt {release}"


def _public_bases(app, name, obj, options, bases: list) -> None:
    """Show a private base class (``_Frozen``) as the public classes it derives from."""
    for i in reversed(range(len(bases))):
        base = bases[i]
        if isinstance(base, type) and base.__name__.startswith("_"):
            bases[i:i + 1] = [b for b in base.__bases__ if b is not object]


def _no_type_docstring(app, what, name, obj, options, lines: list) -> None:
    """A constant without a doc comment of its own shows its value, not ``int.__doc__``."""
    own = " ".join(" ".join(lines).split())
    if what == "data" and own and own == " ".join((type(obj).__doc__ or "").split()):
        lines.clear()


def _skip_foreign_functions(app, what, name, obj, skip, options):
    """Skip a member bound to another library's C function (``TorchFramework.copy`` is
    ``torch.Tensor.copy_``, a framework's ``signature`` an ``operator.attrgetter``): its
    docstring is that library's, not ours to render."""
    foreign = (inspect.isbuiltin(obj) or inspect.ismethoddescriptor(obj)
               or isinstance(obj, operator.attrgetter))
    return True if foreign and what == "class" else skip


def setup(app) -> None:
    app.connect("autodoc-skip-member", _skip_foreign_functions)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-docstring", _no_type_docstring)

"""Sphinx configuration of the easyad documentation site.

Build: ``make docs`` (strict: every warning is an error) -> ``docs/_build/html``.
Pages are Markdown (MyST); the API reference is autodoc over the imported package, so the
compiled classes of ``easyad._core`` show their runtime docstrings (numpydoc, read by
napoleon). Adding a page: a ``docs/NAME.md`` file and its entry in ``index.md``'s toctree.
"""
from __future__ import annotations

import pathlib
import importlib.util
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS))  # _benchmarks.py, _functions.py

import easyad  # noqa: E402  (the built package: make docs builds it first)

import _benchmarks  # noqa: E402
import _functions  # noqa: E402

project = "easyad"
author = "the easyad authors"
copyright = "2026, the easyad authors"
release = version = easyad.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
# MathJax offline: the package sphinx-mathjax-offline (PyPI; the docs extra and `make docs`
# install it) copies MathJax into _static and points mathjax_path there, so the built
# site loads no script from a CDN (tests/test_docs_site.py checks). Without it the
# formulas come from the CDN, as Sphinx's default, and need a network to render.
if importlib.util.find_spec("sphinx-mathjax-offline") is not None:
    extensions.append("sphinx-mathjax-offline")
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "scripts", "README.md", "Thumbs.db", ".DS_Store"]

# MyST: anchors for "page.md#heading" links, $...$ maths, ```{directive} fences
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "colon_fence"]

# autodoc + napoleon: numpydoc docstrings; signatures from the compiled module's
# embedsignature first lines, members in source order
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_docstring_signature = True
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"easyad {release}"
html_static_path: list[str] = []
pygments_style = "sphinx"

# the benchmark tables: every benchmarks/results/*.md that exists at build time
_benchmarks.write_includes(ROOT / "benchmarks" / "results", DOCS / "_generated")
# the generic functions' table of generic.md: every row of the rule table
_functions.write(DOCS / "_generated")


def _skip_generic_methods(app, what, name, obj, skip, options):
    """Trace.sin, Record.exp...: documented once, as the generic functions ad.sin..."""
    if what == "class" and name in _GENERIC_NAMES:
        return True
    return None


_GENERIC_NAMES = {name for name in easyad.__all__
                  if callable(getattr(easyad, name)) and hasattr(easyad.Trace, name)}


def setup(app):
    app.connect("autodoc-skip-member", _skip_generic_methods)

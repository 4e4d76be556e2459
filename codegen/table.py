"""Load the rule table (easyad/_rules.py) and its expression module (easyad/_expr.py) for the
generator, without importing the easyad package.

``import easyad._rules`` would run easyad/__init__.py, which needs the compiled core this
build makes. So a bare package object named ``easyad`` is made with ``__path__`` set to the
source folder (its __init__ is never run), the modules are imported as its submodules
(their own ``from . import _rules`` works, and _expr's of _csyntax), and sys.modules is put
back as it was: a process that already imported easyad (a test) keeps its own modules, and
nothing leaks.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("easyad", "easyad._rules", "easyad._csyntax", "easyad._expr")


def load(source: Path = ROOT / "easyad") -> tuple[ModuleType, ModuleType]:
    """(rules, expr): easyad/_rules.py and easyad/_expr.py of the folder ``source``."""
    saved = {name: sys.modules.pop(name) for name in NAMES if name in sys.modules}
    try:
        spec = importlib.util.spec_from_file_location(
            "easyad", source / "__init__.py", submodule_search_locations=[str(source)])
        assert spec is not None
        sys.modules["easyad"] = importlib.util.module_from_spec(spec)  # __init__ not run
        return importlib.import_module("easyad._rules"), importlib.import_module("easyad._expr")
    finally:
        for name in NAMES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)

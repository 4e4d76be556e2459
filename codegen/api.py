"""Renders the public names of the rule table: easyad/_generated/functions.py, the generic
functions ``ad.<rule>`` (and aliases) re-exported by easyad/__init__.py with a literal
``__all__``, so static tools and ``from easyad import *`` see every row."""
from __future__ import annotations

from .table import load

rules, _ = load()


def function_names() -> list[str]:
    """ad.<rule> and its aliases for every row with a generic function, sorted."""
    names = [n for r in rules.RULES if r.generic for n in (r.name, *r.aliases)]
    return sorted(names, key=str.lower)


def render_functions() -> str:
    names = function_names()
    imports = "".join(f"    {n},\n" for n in names)
    listed = "".join(f'    "{n}",\n' for n in names)
    return ("# GENERATED from easyad/_rules.py by codegen/api.py, do not edit\n"
            '"""The generic functions of the rule table (one per row and alias), compiled in\n'
            'easyad._core; easyad/__init__.py re-exports them with this ``__all__``."""\n'
            f"from easyad._core import (\n{imports})\n\n__all__ = [\n{listed}]\n")

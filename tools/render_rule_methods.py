"""Render easyad/tensor/_rule_methods.py from the rule table (easyad/_rules.py).

The tensor classes (Tensor, TraceTensor) get one method per row of the table, per alias and
per operator, written out in a mixin so that mypy and IDEs see ``Tensor.sin``. Each method
only calls the class's hook (``_unary_rule`` / ``_binary_rule``), so the file needs nothing
but the table and can sit below both classes.

    python tools/render_rule_methods.py          # rewrite the file
    python tools/render_rule_methods.py --check  # exit 1 if it is stale (tests/test_layers.py)

Adding a rule needs no edit here: run this (the test says so when it is forgotten).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "easyad" / "tensor" / "_rule_methods.py"


def _load_rules():  # type: ignore[no-untyped-def]
    # the table is plain data with no easyad imports: load it without importing the package
    # (which needs the compiled core)
    spec = importlib.util.spec_from_file_location("_easyad_rules", ROOT / "easyad" / "_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look the module up while decorating
    spec.loader.exec_module(module)
    return module.RULES


HEADER = '''\
# GENERATED from easyad/_rules.py by tools/render_rule_methods.py, do not edit.
"""RuleMethods: the elementwise methods and operators of Tensor and TraceTensor, one per
row of the rule table (with its aliases and operator dunders), written out so that mypy
and IDEs see them. Each calls the class's hook, ``_unary_rule(rule)`` or
``_binary_rule(rule, other, reflected)``; a binary one returns NotImplemented for an
operand the class does not take, so Python tries the other operand's reflected method.
"""
from __future__ import annotations

from typing import Any, TypeVar

from easyad._rules import RULES_BY_NAME, Rule

_T = TypeVar("_T", bound="RuleMethods")

'''


def _docstring(text: str) -> str:
    """A method's docstring line(s), wrapped to the project's 100 columns."""
    return textwrap.fill(f'"""{text}"""', width=100, initial_indent=" " * 8,
                         subsequent_indent=" " * 8) + "\n"


def render() -> str:
    rules = _load_rules()
    lines = [HEADER]
    for rule in rules:
        lines.append(f'_{rule.name.upper()} = RULES_BY_NAME["{rule.name}"]\n')
    lines.append('''

class RuleMethods:
    """The rule-table methods of a tensor class; it supplies the two hooks."""

    __slots__ = ()

    def _unary_rule(self: _T, rule: Rule) -> _T:
        raise NotImplementedError

    def _binary_rule(self: _T, rule: Rule, other: Any, reflected: bool) -> _T:
        raise NotImplementedError
''')
    for rule in rules:
        const = f"_{rule.name.upper()}"
        see = rule.name if rule.generic else None
        lines.append(f"\n    # -- {rule.name}: {rule.value} --\n")
        if rule.arity == 1:
            also = f" (see ad.{see})" if see else ""
            lines.append(f"    def {rule.name}(self: _T) -> _T:\n"
                         + _docstring(f"{rule.doc}, elementwise{also}.")
                         + f"        return self._unary_rule({const})\n")
            names = [*rule.aliases] + ([f"__{rule.operator}__"] if rule.operator else [])
            for name in names:
                lines.append(f"\n    {name} = {rule.name}\n")
            continue
        also = f" (see ad.{see})" if see else ""
        doc = _docstring(f"{rule.doc}, elementwise with broadcasting{also}.")
        for name, reflected in ((rule.name, False), (f"_r{rule.name}", True)):
            lines.append(f"\n    def {name}(self: _T, other: Any) -> _T:\n{doc}"
                         f"        return self._binary_rule({const}, other, {reflected})\n")
        for alias in rule.aliases:
            lines.append(f"\n    {alias} = {rule.name}\n    _r{alias} = _r{rule.name}\n")
        if rule.operator:
            for name, reflected in ((f"__{rule.operator}__", False),
                                    (f"__r{rule.operator}__", True)):
                # pow(t, y, mod) passes a third argument: not for tensors
                extra, check = "", ""
                if rule.operator == "pow":
                    extra = ", mod: None = None"
                    check = ("        if mod is not None:\n"
                             "            return NotImplemented\n")
                lines.append(f"\n    def {name}(self: _T, other: Any{extra}) -> _T:\n{doc}"
                             f"{check}"
                             f"        return self._binary_rule({const}, other, {reflected})\n")
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not TARGET.is_file() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python tools/render_rule_methods.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

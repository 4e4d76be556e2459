"""Renders the tensor classes' rule methods (easyad/_generated/tensor_methods.py) from the
rule table (easyad/_rules.py).

The tensor classes (Tensor, TraceTensor) get one method per row of the table, per alias and
per operator, written out in a mixin so that mypy and IDEs see ``Tensor.sin``. Each method
only calls the class's hook (``_unary_rule`` / ``_binary_rule``), so the file needs nothing
but the table and can sit below both classes.
"""
from __future__ import annotations

import textwrap

from .table import load

rules, _ = load()


HEADER = '''\
# GENERATED from easyad/_rules.py by codegen/tensor_methods.py, do not edit
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
    lines = [HEADER]
    for rule in rules.RULES:
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
    for rule in rules.RULES:
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

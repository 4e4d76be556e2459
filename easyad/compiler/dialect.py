"""How a target language spells what every renderer writes, each said once: the dialects
the one renderer (``compiler.cstyle.CStyleRenderer`` and its subclasses) writes through.
``C`` (``CSpelling``) is the scalar tape's C and the base of ``compiler.program.cstyle.
CDialect``; ``OpenCLDialect`` is the tensor programs' OpenCL and, with double, the OpenCL
replay of a scalar tape (``compiler.tape.render_cl``).

A light module (tensor code imported only for an OpenCL preamble): the scalar renderer
loads it on the first compile.

- constants: ``literal`` (``easyad._csyntax.literal``, exact for inf and NaN, rounded as
  the language's real type reads them);
- the rule table's functions, the very ones the VM calls (``_rule_functions.h``):
  ``rule_value`` (``easyad_<rule>_value``), ``rule_partial`` (``_d<k>``), ``rule_tangent``
  (``_t<k>``);
- the strong zero (``_helpers.h``): ``mul0`` (0 times anything is 0: an adjoint of 0 does
  not turn inf or NaN partials into NaN; the rule table's own strings call ``mul0`` and
  ``div0`` by name, rendered by ``_expr``);
- the element types of memory (``types``) and of constants and accumulators (``real``);
- a table's qualifier at file scope (``table_qualifier``).

The hierarchy: ``Dialect`` -> ``CSpelling`` (``C``: the scalar tape's C) ->
``compiler.program.cstyle.CDialect`` (tensor C, its vector math), and ``Dialect`` ->
``OpenCLDialect`` (real_t, ``__constant``, its preamble). Each is what tinygrad calls a
renderer's dialect: a few dozen lines of spellings.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad._csyntax import literal


class Dialect:
    """What a target language spells differently (see the module's docstring); the
    renderers (``compiler.cstyle.CStyleRenderer`` and its subclasses) read these and
    nothing else of the language."""

    name = ""
    types: dict[Any, str] = {}     # numpy dtype -> element type in memory
    real = "double"                # constants and accumulators
    target = "c"                   # of _expr.render
    literal_type = "double"        # how _csyntax.literal rounds a constant
    table_qualifier = "static const"   # of a table at file scope

    def literal(self, value: float) -> str:
        """A constant (inf, NaN included) as this language reads it back exactly."""
        return literal(value, self.literal_type)

    def rule_value(self, rule: str) -> str:
        return f"easyad_{rule}_value"

    def rule_partial(self, rule: str, k: int) -> str:
        return f"easyad_{rule}_d{k}"

    def rule_tangent(self, rule: str, k: int) -> str:
        return f"easyad_{rule}_t{k}"

    def mul0(self, a: str, b: str) -> str:
        """``a * b`` with the strong zero (0 whatever the other factor)."""
        return f"mul0({a}, {b})"

    def zero_outside(self, inside: str, value: str, ctype: str) -> str:
        """``value`` where the int ``inside`` holds, else 0 of ``ctype``."""
        return f"({inside} ? {value} : ({ctype})0)"

    def exact_calls(self, tree: Any) -> Any:
        """An expression of ``plan.exact_math`` (a value a selection compares, or what it
        is made of) with builtins that are one function of their input in every loop,
        lane and remainder (``plan._selections``)."""
        return tree


class CSpelling(Dialect):
    """C for gcc: values in double, stored in their dtype."""

    name = "c"
    types = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
             np.dtype(np.bool_): "unsigned char"}


class OpenCLDialect(Dialect):
    """OpenCL C: values are ``real_t`` (double, or float for programs without float64
    values: float literals then), bools stored as uchar; vectors ``vreal_t``/``vbool_t``
    of ``_kernels.preamble`` (loads and stores through the ``*_mem`` types, aligned as
    their elements). A scalar loop's builtins are one function of their input already."""

    name = "opencl"
    types = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
             np.dtype(np.bool_): "uchar", np.dtype(np.uint8): "uchar"}
    real = "real_t"
    table_qualifier = "__constant"
    memory = {"vreal_t": "vreal_mem", "vbool_t": "vbool_mem"}

    def __init__(self, real: str = "double") -> None:
        self.real_name = real                 # what real_t is
        self.real_dtype = np.dtype(np.float64 if real == "double" else np.float32)
        self.target = "c" if real == "double" else "opencl-float"
        self.literal_type = real
        self.vector_types = {self.real_dtype: "vreal_t", np.dtype(np.bool_): "vbool_t",
                             np.dtype(np.uint8): "vbool_t"}      # bools, as stored

    def preamble(self, width: int = 0, lanewise: frozenset[str] = frozenset()) -> str:
        """The kernels' first lines (``tensor._kernels.preamble``: real_t, the helpers of
        _helpers.h, the vector helpers of ``width`` lanes)."""
        from easyad.tensor import _kernels
        return _kernels.preamble(self.real_name, width, lanewise)

    def header(self, width: int, lanewise: frozenset[str]) -> str:
        return self.preamble(width, lanewise).replace(
            "//CL// easyad tensor kernels",
            "//CL// GENERATED by easyad/compiler/program/cstyle.py from a recorded tensor "
            "program")


C = CSpelling()

"""Line loops of the running ops (``ops/_prod_ops.py``: prod, cumprod, recurrence;
``ops/_builtin.py``: cumsum) for generated code (``Op.loop``):
a C-contiguous operand cut into independent lines along some axes, each line run in
order by one iteration (C: one function of a fused program's library; the body is the
syntax C99 and OpenCL C share).

A line is an index over the other axes (``line``, in C order: the flat index of a
reduction's result), an element of it an index over the line's axes (``k``, in C order);
their offsets are written with the shape's sizes and strides as literals, adjacent axes
merged (one multiply where the axes are consecutive in memory).
"""
from __future__ import annotations

import math

from easyad.ops._table import Loop


def _runs(shape: tuple[int, ...], dims: tuple[int, ...]) -> list[tuple[int, int]]:
    """(size, stride) of ``dims`` of a C-contiguous ``shape``, in order, each run of dims
    that are one stride apart in memory merged into one."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    runs: list[tuple[int, int]] = []
    for d in dims:
        if shape[d] == 1:
            continue
        if runs and runs[-1][1] == shape[d] * strides[d]:
            runs[-1] = (runs[-1][0] * shape[d], strides[d])
        else:
            runs.append((shape[d], strides[d]))
    return runs


def _offset(runs: list[tuple[int, int]], index: str) -> str:
    """The element offset of flat index ``index`` over ``runs`` (C order)."""
    terms, inner = [], 1
    for k, (size, stride) in enumerate(reversed(runs)):
        idx = index if inner == 1 else f"({index} / {inner}L)"
        if k < len(runs) - 1:           # the outermost run needs no modulo
            idx = f"({idx} % {size}L)"
        terms.append(idx if stride == 1 else f"{idx} * {stride}L")
        inner *= size
    return " + ".join(reversed(terms)) or "0"


def axis_lines(shape: tuple[int, ...], axes: tuple[int, ...], t: str, kind: str) -> Loop:
    """``kind`` ("prod", "cumprod", "cumsum", "recurrence") of an operand of ``shape`` along
    ``axes`` (cumprod and recurrence: one), element type ``t``. prod writes y[line];
    the others y at their operands' places. Each starts from the line's first element
    (not 1 * x_0: numpy's reduce and accumulate copy it), the loop in the element type."""
    kept = tuple(d for d in range(len(shape)) if d not in axes)
    n = math.prod(shape[d] for d in axes)
    count = math.prod(shape[d] for d in kept)
    base = f"const long base = {_offset(_runs(shape, kept), 'line')};\n"
    at = _offset(_runs(shape, axes), "k")
    if kind == "prod":
        if n == 0:
            return Loop(count, f"y[line] = ({t})1;\n")
        return Loop(count, base + f"{t} total = x0[base];\n"
                    f"for (long k = 1; k < {n}L; k++) total *= x0[base + {at}];\n"
                    "y[line] = total;\n")
    if n == 0:
        return Loop(0, "")
    if kind in ("cumprod", "cumsum"):
        step = "*" if kind == "cumprod" else "+"
        return Loop(count, base + f"{t} total = x0[base];\ny[base] = total;\n"
                    f"for (long k = 1; k < {n}L; k++) {{\n"
                    f"    const long at = base + {at};\n"
                    f"    total {step}= x0[at];\n    y[at] = total;\n}}\n")
    if kind == "recurrence":        # o_k = a_k o_(k-1) + b_k, o_0 = b_0
        return Loop(count, base + f"{t} o = x1[base];\ny[base] = o;\n"
                    f"for (long k = 1; k < {n}L; k++) {{\n"
                    f"    const long at = base + {at};\n"
                    "    o = x0[at] * o + x1[at];\n    y[at] = o;\n}\n")
    raise ValueError(f"axis_lines: no line loop {kind!r} (prod, cumprod, cumsum, "
                     f"recurrence)")

"""``linear`` and ``linear_vjp`` steps of a fused numpy program, prepared once.

``_program.step`` runs them through the backend (``be.linear``: a new array per product,
five Python calls deep). A replayed training step calls them every time with the same
shapes, so here each becomes one closure that writes numpy's BLAS products (``np.matmul``
with ``out=``, the same BLAS call and bits as ``be.linear``) into buffers made once, and
adds the bias / sums the bias's gradient in place. Only values that stay inside the call
get a planned buffer: a program output keeps a new array per call (the caller holds it).
Where easyad's own kernels would compute a product (``_blas.own_kernels``), or an operand
is not a plain 2-d slot of one float dtype, the step stays the backend's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.tensor import _blas
from easyad.tensor._program import Instruction

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _plain(plan: Any, slots: tuple[Any, ...]) -> bool:
    p = plan.program
    dtypes = {p.dtypes[s] for s in slots if type(s) is int}
    return all(s is None or (type(s) is int and len(p.shapes[s]) in (1, 2)
                             and s not in p.constants) for s in slots) \
        and len(dtypes) == 1 and dtypes <= set(_FLOATS)


def prepare(ins: Instruction, plan: Any, outputs: set[int]) -> tuple[Any, dict[int, Any]] | None:
    """(the step as a function of the slot list, the buffers it writes: slot -> array) or
    None (the backend's step). ``outputs``: the roots of the program's outputs."""
    p = plan.program
    if ins.op not in ("linear", "linear_vjp") or not _plain(plan, ins.ins + ins.outs) \
            or any(plan.r(o) != o or o in outputs for o in ins.outs):
        return None
    buffers = {o: np.empty(p.shapes[o], dtype=p.dtypes[o]) for o in ins.outs}
    if ins.op == "linear":
        x, w, b = ins.ins
        (o,) = ins.outs
        m, k = p.shapes[x] if len(p.shapes[x]) == 2 else (0, 0)
        if len(p.shapes[x]) != 2 or len(p.shapes[w]) != 2 \
                or _blas.own_kernels(m, k, p.shapes[w][0]):
            return None
        out = buffers[o]

        def run_linear(s: list[Any]) -> None:
            np.matmul(s[x], s[w].T, out=out)
            if b is not None:
                np.add(out, s[b], out=out)
            s[o] = out
        return run_linear, buffers
    g, x, w = ins.ins
    needs = ins.params.needs
    if len(p.shapes[g]) != 2:
        return None
    m, n = p.shapes[g]
    kx = p.shapes[x][1] if x is not None and len(p.shapes[x]) == 2 else 0
    kw = p.shapes[w][1] if w is not None and len(p.shapes[w]) == 2 else 0
    if (needs[0] and (w is None or len(p.shapes[w]) != 2 or _blas.own_kernels(m, n, kw))) \
            or (needs[1] and (x is None or len(p.shapes[x]) != 2
                              or _blas.own_kernels(n, m, kx))):
        return None
    outs = iter(ins.outs)
    gx = buffers[next(outs)] if needs[0] else None
    gw = buffers[next(outs)] if needs[1] else None
    gb = buffers[next(outs)] if needs[2] else None
    slots = ins.outs

    def run_linear_vjp(s: list[Any]) -> None:
        made = []
        if gx is not None:
            made.append(np.matmul(s[g], s[w], out=gx))
        if gw is not None:
            made.append(np.matmul(s[g].T, s[x], out=gw))
        if gb is not None:
            made.append(np.add.reduce(s[g], axis=0, out=gb))
        for k, a in zip(slots, made):
            s[k] = a
    return run_linear_vjp, buffers

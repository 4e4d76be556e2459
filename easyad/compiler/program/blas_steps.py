"""``linear``, ``linear_vjp`` and (1, m, k) @ (1, k, n) ``matmul`` steps of a fused numpy
program, prepared once.

``_program.step`` runs them through the backend (``be.linear``: a new array per product,
five Python calls deep). A replayed training step calls them every time with the same
shapes, so here each becomes one closure that writes numpy's BLAS products (``np.matmul``
with ``out=``, the same BLAS call and bits as ``be.linear``) into buffers made once, and
adds the bias / sums the bias's gradient in place. Only values that stay inside the call
get a planned buffer: a program output keeps a new array per call (the caller holds it).
Where easyad's own kernels would compute a product (``_blas.own_kernels``), or an operand
is not a plain 2-d slot of one float dtype, the step stays the backend's.

**The descent step folded into the weight's gradient product** (``fold_updates``): where
a program's update ``w - g * lr`` (``sgd_step``'s map, written in place into w) takes
the weight gradient ``g = gz.T @ x`` of a ``linear_vjp`` and nothing else reads ``g``,
or reads ``w`` after that product, the product is OpenBLAS's GEMM with alpha = -lr and
beta = 1 into w itself, and the C loop of the update is not rendered: the 128x784
weight of the MLP step is then read and written once, inside the product, instead of
the gradient written, read again and w read and written by a loop (~20 us of a
~360 us float32 step). It rounds differently: the new w is fl(w + fl(-lr * acc)) (lr
rounded to the dtype, OpenBLAS's beta = 1 path) instead of fl(w - fl64(lr * fl(acc)))
(the update in double, rounded once), ``acc`` the same product: the two differ by at
most one rounding of the update term and of lr, |difference| <= ulp(w') + 2 ulp(lr *
|g|) per element (``tests/test_replay_sgd_prepared.py``), as torch's ``p.add_(g,
alpha=-lr)`` rounds. Only where numpy's BLAS is an OpenBLAS whose ``cblas_?gemm`` it can
call (``_blas.cblas_gemm``: numpy's matmul calls the same), for contiguous operands.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad.tensor import _blas
from easyad.tensor._program import Instruction

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# weights of fewer elements are not folded: their loop costs less than the ctypes call
# (~3 us) of the GEMM that would replace numpy's matmul
FOLD_FROM = 1 << 14


def _matmul(ins: Instruction, plan: Any, outputs: set[int]
            ) -> tuple[Any, dict[int, Any]] | None:
    """A (1, m, k) @ (1, k, n) ``matmul`` step (a batched Jacobian's products) into a
    buffer made once: np.matmul with ``out=``, the BLAS call ``be.matmul`` makes (which
    allocates, and checks the kernels, every call); None where easyad's own kernels, or
    numpy's k = 1 broadcast, would compute it, or the result leaves the call."""
    p = plan.program
    a, b = ins.ins
    (o,) = ins.outs
    if type(a) is not int or type(b) is not int or plan.r(o) != o or o in outputs:
        return None
    sa, sb, so = tuple(p.shapes[a]), tuple(p.shapes[b]), tuple(p.shapes[o])
    dtypes = {p.dtypes[a], p.dtypes[b], p.dtypes[o]}
    if len(dtypes) != 1 or not dtypes <= set(_FLOATS) or len(sa) != 3 or len(sb) != 3 \
            or sa[0] != 1 or sb[0] != 1:
        return None
    ta, tb = ins.params.transpose_a, ins.params.transpose_b
    m, k = (sa[2], sa[1]) if ta else (sa[1], sa[2])
    n = sb[1] if tb else sb[2]
    if k == 1 or (sb[2] if tb else sb[1]) != k or so != (1, m, n) or \
            _blas.own_kernels(m, k, n):
        return None
    out = np.empty(so, dtype=p.dtypes[o])

    def run_matmul(s: list[Any]) -> None:
        x, y = s[a], s[b]
        np.matmul(x.swapaxes(-1, -2) if ta else x, y.swapaxes(-1, -2) if tb else y, out=out)
        s[o] = out
    return run_matmul, {o: out}


def _plain(plan: Any, slots: tuple[Any, ...]) -> bool:
    p = plan.program
    dtypes = {p.dtypes[s] for s in slots if type(s) is int}
    return all(s is None or (type(s) is int and len(p.shapes[s]) in (1, 2)
                             and s not in p.constants) for s in slots) \
        and len(dtypes) == 1 and dtypes <= set(_FLOATS)


def prepare(ins: Instruction, plan: Any, outputs: set[int],
            folded: dict[int, tuple[int, int]] | None = None
            ) -> tuple[Any, dict[int, Any]] | None:
    """(the step as a function of the slot list, the buffers it writes: slot -> array) or
    None (the backend's step). ``outputs``: the roots of the program's outputs;
    ``folded``: ``fold_updates``'s answer (the weight gradient then updates w instead)."""
    p = plan.program
    if ins.op == "matmul":
        return _matmul(ins, plan, outputs)
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
    fold = (folded or {}).get(id(ins))
    if fold is not None:
        return _folded_step(ins, fold, gx, gb, p.dtypes[g], (m, n, kx)), buffers

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


def _folded_step(ins: Instruction, fold: tuple[int, int], gx: Any, gb: Any, dtype: Any,
                 sizes: tuple[int, int, int]) -> Any:
    """linear_vjp's step with its weight gradient folded into w's update (see the module
    docstring): gx first (it reads w), then w += -lr * gz.T @ x, then the bias's."""
    g, x, w = ins.ins
    target, lr = fold
    m, n, k = sizes
    gemm = _blas.cblas_gemm(dtype)
    gx_slot = ins.outs[0] if gx is not None else None        # (outs: the needed ones)
    gb_slot = ins.outs[-1] if gb is not None else None

    def run_linear_vjp_folded(s: list[Any]) -> None:
        if gx is not None:
            s[gx_slot] = np.matmul(s[g], s[w], out=gx)
        a, b, c = s[g], s[x], s[target]
        if not (a.flags.c_contiguous and b.flags.c_contiguous and c.flags.c_contiguous):
            raise ValueError("a folded descent step needs C-contiguous operands; "
                             "this is a bug of easyad (blas_steps.fold_updates)")
        # row-major C (n, k) = -lr * A.T @ B + C: A (m, n) transposed, B (m, k)
        gemm(101, 112, 111, n, k, m, -s[lr].item(), a.ctypes.data, n, b.ctypes.data, k,
             1.0, c.ctypes.data, k)
        if gb is not None:
            s[gb_slot] = np.add.reduce(a, axis=0, out=gb)
    return run_linear_vjp_folded


def fold_updates(plan: Any) -> dict[int, tuple[int, int]]:
    """The linear_vjp steps whose weight gradient is folded into a descent step (see the
    module docstring): id(step) -> (w, the learning rate's slot), and the update maps it
    replaces as ``plan.folded`` (their outputs are w, written in place)."""
    p = plan.program
    order = [(pos, ins) for pos, (kind, item) in enumerate(plan.schedule)
             for ins in (item if kind == "c" else [item])]
    made_by = {o: (pos, ins) for pos, ins in order for o in ins.outs}
    fresh = {plan.r(o) for o in plan.outputs}      # as FusedProgram prepares its steps
    found: dict[int, tuple[int, int]] = {}
    plan.folded = []
    for _, update in order:
        if update.op != "map" or update.params.label != "sgd_step" \
                or update.params.exprs != ("x - g * lr",) or len(update.outs) != 1 \
                or not all(type(i) is int for i in update.ins):
            continue
        w, grad, lr = update.ins
        (new,) = update.outs
        pos, vjp = made_by.get(grad, (None, None))
        if vjp is None or vjp.op != "linear_vjp" or p.in_place.get(new) != w \
                or new not in plan.outputs or w not in p.inputs or lr not in p.inputs \
                or p.shapes[lr] != () or id(vjp) in found \
                or math.prod(p.shapes[w]) < FOLD_FROM \
                or prepare(vjp, plan, fresh) is None:
            continue
        g, x, _ = vjp.ins
        needs = vjp.params.needs
        dtype = p.dtypes[w]
        if not needs[1] or vjp.outs[int(needs[0])] != grad or p.dtypes[grad] != dtype \
                or p.shapes[w] != p.shapes[grad] or x is None or _blas.cblas_gemm(dtype) is None:
            continue
        # nothing but the update reads the gradient, nor w from the product on (the
        # step's own gx product reads it first), and no guard follows (w would already
        # be updated when a replay found a branch changed and ran again)
        guarded = any(ins.op.startswith("guard") and at >= pos for at, ins in order)
        reread = any(ins is not update and any(plan.r(grad) in plan.memory_reads(i)
                                               for i in ins.ins if type(i) is int)
                     for _, ins in order) or any(
            ins is not update and ins is not vjp and at >= pos
            and any(w in plan.memory_reads(i) for i in ins.ins if type(i) is int)
            for at, ins in order)
        if guarded or reread:
            continue
        found[id(vjp)] = (w, lr)
        plan.folded.append(update)
    return found

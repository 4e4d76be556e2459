"""``cross_entropy`` and ``cross_entropy_vjp`` as generated C on the numpy device.

``_program.step`` runs them as numpy (a dozen small ufunc calls, a few arrays made per
call: ~100 us of the replayed MLP step, whose products take ~260). Here each becomes one C
function of the fused program's library, called from its pointer table like a segment:

- the forward pass takes each row's maximum (NaN-propagating, as numpy's), 0 where that is
  not finite (as the numpy kernel), writes ``exp(z - m)`` and the row's sum into a saved
  workspace (double), and the mean loss into the 0-d output;
- the vjp reads that workspace: ``(e / s - onehot(target)) * scale``, rounded when stored.

The computation is in double whatever z's dtype (the fused C's rule: "computed in double and
rounded when stored"), so a float32 program's loss and gradient can differ from the numpy
kernel's float32 arithmetic in the last bits (tests/test_replay_softmax_c.py: 1e-6
relative), and sums add in loop order. The targets live in an int64 buffer of the pointer
table (not in the source: programs that differ only in labels share one compiled library).
Only where every target is a class index of z is the step lowered; other steps stay numpy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.compiler.program.cstyle import CDialect
from easyad.tensor._program import Instruction, Program


class Lowered:
    """One lowered step: its C function's text (named ``name``), the slots it writes, and
    the buffers it needs beyond the program's slots (the targets, the saved workspace),
    as (key, array) pairs the fused program puts in its pointer table."""

    def __init__(self, name: str, text: str, writes: tuple[int, ...],
                 extra: dict[str, np.ndarray]) -> None:
        self.name, self.text, self.writes, self.extra = name, text, writes, extra


def _ctype(dtype: Any) -> str:
    return CDialect.types[np.dtype(dtype)]


def lowerable(ins: Instruction, p: Program) -> bool:
    """Whether ``ins`` is a cross-entropy step this module renders: z a 2-d float32 or
    float64 slot, every target in ``range(z.shape[1])``."""
    if ins.op not in ("cross_entropy", "cross_entropy_vjp"):
        return False
    z = ins.ins[0]
    shape = p.shapes[z] if type(z) is int else None
    target = np.asarray(ins.params.target)
    if ins.op == "cross_entropy":
        if shape is None or len(shape) != 2 or p.dtypes[z] not in CDialect.types \
                or p.dtypes[ins.outs[0]] not in CDialect.types:
            return False
        classes = shape[1]
    else:
        o = ins.outs[0]
        if len(p.shapes[o]) != 2 or p.dtypes[o] not in CDialect.types:
            return False
        classes = p.shapes[o][1]
        scale = ins.ins[1]
        if type(scale) is int and (p.shapes[scale] not in ((), (1,))
                                   or p.dtypes[scale] not in CDialect.types):
            return False
    return classes >= 1 and target.ndim == 1 and target.dtype.kind in "iu" and (
        target.size == 0 or (int(target.min()) >= 0 and int(target.max()) < classes))


# the one constant printer (exact for NaN, inf and negative numbers: the old repr() gave
# C that does not compile for NaN or inf)
_literal = CDialect().literal


def render_forward(ins: Instruction, p: Program, number: int, target_slot: int) -> Lowered:
    """C for ``loss, saved = cross_entropy(z)``; the saved slot's pointer-table entry is a
    workspace of n * c + n doubles, ``target_slot``'s the int64 targets."""
    z, (loss, saved_slot) = ins.ins[0], ins.outs
    n, c = p.shapes[z]
    name = f"easyad_ce_{number}"
    text = f"""
void {name}(void** P) {{
    const {_ctype(p.dtypes[z])}* const z = (const {_ctype(p.dtypes[z])}*)P[{z}];
    {_ctype(p.dtypes[loss])}* const loss = ({_ctype(p.dtypes[loss])}*)P[{loss}];
    double* const e = (double*)P[{saved_slot}];
    double* const s = e + {n * c}L;
    const long long* const t = (const long long*)P[{target_slot}];
    double total = 0.0;
    for (long r = 0; r < {n}L; r++) {{
        const {_ctype(p.dtypes[z])}* const row = z + r * {c}L;
        double m = row[0];
        for (long j = 1; j < {c}L; j++) {{
            const double v = row[j];
            if (v > m || v != v) m = v;   /* NaN wins, as numpy's max */
            if (m != m) break;
        }}
        if (!isfinite(m)) m = 0.0;
        double sum = 0.0;
        for (long j = 0; j < {c}L; j++) {{
            const double x = exp((double)row[j] - m);
            e[r * {c}L + j] = x;
            sum += x;
        }}
        s[r] = sum;
        total += (log(sum) + m) - (double)row[t[r]];
    }}
    loss[0] = ({_ctype(p.dtypes[loss])})(total / {_literal(ins.params.divisor)});
}}
"""
    target = np.ascontiguousarray(ins.params.target, dtype=np.int64)
    return Lowered(name, text, (loss,), {"target": target,
                                         "saved": np.zeros(n * c + n, dtype=np.float64)})


def render_vjp(ins: Instruction, p: Program, number: int, target_slot: int) -> Lowered:
    """C for ``g = cross_entropy_vjp(saved, scale)`` reading the forward's workspace."""
    saved_slot, scale, g = ins.ins[0], ins.ins[1], ins.outs[0]
    n, c = p.shapes[g]
    ctype = _ctype(p.dtypes[g])
    read_scale = (f"(double)(({_ctype(p.dtypes[scale])}*)P[{scale}])[0]"
                  if type(scale) is int else _literal(scale))
    name = f"easyad_ce_vjp_{number}"
    text = f"""
void {name}(void** P) {{
    const double* const e = (const double*)P[{saved_slot}];
    const double* const s = e + {n * c}L;
    const long long* const t = (const long long*)P[{target_slot}];
    {ctype}* const g = ({ctype}*)P[{g}];
    const double scale = {read_scale};
    for (long r = 0; r < {n}L; r++) {{
        for (long j = 0; j < {c}L; j++) {{
            const double q = e[r * {c}L + j] / s[r] - (j == t[r] ? 1.0 : 0.0);
            g[r * {c}L + j] = ({ctype})(q * scale);
        }}
    }}
}}
"""
    target = np.ascontiguousarray(ins.params.target, dtype=np.int64)
    return Lowered(name, text, (g,), {"target": target})


def lower(plan: Any, first_extra: int) -> tuple[dict[int, Lowered], list[np.ndarray]]:
    """The plan's Python steps rendered here (by ``id`` of the instruction) and the extra
    pointer-table buffers they read, numbered from ``first_extra``. A forward step is
    lowered only where every reader of its saved state is a vjp lowered with it (the numpy
    vjp reads numpy's saved parts, not this workspace), and that state is no output."""
    p = plan.program
    readers: dict[int, list[Instruction]] = {}
    for kind, item in plan.schedule:
        for ins in (item if kind == "c" else [item]):
            for i in ins.ins:
                if type(i) is int:
                    readers.setdefault(i, []).append(ins)
    outputs = {plan.r(o) for o in plan.outputs}
    lowered: dict[int, Lowered] = {}
    extra: list[np.ndarray] = []
    for kind, ins in plan.schedule:
        if kind != "py" or ins.op != "cross_entropy" or not lowerable(ins, p):
            continue
        saved = ins.outs[1]
        vjps = readers.get(saved, [])
        shape = p.shapes[ins.ins[0]]
        if saved in outputs or not all(r.op == "cross_entropy_vjp" and r.ins[0] == saved
                                       and lowerable(r, p) and p.shapes[r.outs[0]] == shape
                                       for r in vjps):
            continue
        for step in [ins] + vjps:
            render = render_forward if step is ins else render_vjp
            done = render(step, p, len(lowered), first_extra + len(extra))
            extra.append(done.extra["target"])
            lowered[id(step)] = done
    return lowered, extra

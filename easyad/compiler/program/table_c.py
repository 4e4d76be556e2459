"""The op table's ops with a line loop (``Op.loop``: prod, cumprod, recurrence) as
generated C on the numpy device: each such ``op`` step of a fused program becomes one C
function of its library, called from the pointer table like a segment, so a program
with them has no Python step on their account and batches in one C loop
(``FusedProgram.run_batch``; with other Python steps, ``batch_np`` runs them with the C).

The function reads its operands and writes its result through the pointer table (the
slots the fused program keeps in memory: workspace, inputs, constants, fresh outputs), so
at many points each point's slots are simply pointed at. Only steps whose operands are
slots of the result's dtype (float64 or float32, as the op's casts make them) are
lowered; the loop runs in that dtype, as the op's eager kernels do.
"""
from __future__ import annotations

from typing import Any

from easyad.compiler.program.cstyle import CDialect
from easyad.compiler.program.softmax_c import Lowered
from easyad.tensor._program import Instruction


def lowerable(ins: Instruction, p: Any) -> bool:
    """Whether ``ins`` is an op-table step this module renders."""
    if ins.op != "op" or getattr(ins.params.op, "loop", None) is None or len(ins.outs) != 1:
        return False
    if not all(type(i) is int for i in ins.ins):
        return False
    dtype = p.dtypes[ins.outs[0]]
    return dtype in CDialect.types and all(p.dtypes[i] == dtype for i in ins.ins) \
        and all(p.shapes[i] is not None for i in ins.ins)


def render(ins: Instruction, plan: Any, number: int) -> Lowered:
    """The C function ``easyad_op_<number>`` of step ``ins``."""
    p = plan.program
    out = ins.outs[0]
    t = CDialect.types[p.dtypes[out]]
    loop = ins.params.op.loop(ins.params.params, [tuple(p.shapes[i]) for i in ins.ins], t)
    name = f"easyad_op_{number}"
    reads = "".join(f"    const {t}* const x{k} = (const {t}*)P[{plan.r(i)}];\n"
                    for k, i in enumerate(ins.ins))
    body = "".join(f"        {line}\n" for line in loop.body.splitlines())
    text = (f"\n/* {ins.params.op.name} {ins.params.params} */\n"
            f"void {name}(void** P) {{\n{reads}"
            f"    {t}* const y = ({t}*)P[{plan.r(out)}];\n"
            f"    for (long line = 0; line < {loop.lines}L; line++) {{\n{body}    }}\n}}\n")
    return Lowered(name, text, (plan.r(out),), {})


def lower(plan: Any) -> dict[int, Lowered]:
    """The plan's op-table steps rendered here, by ``id`` of the instruction."""
    lowered: dict[int, Lowered] = {}
    for kind, ins in plan.schedule:
        if kind == "py" and lowerable(ins, plan.program):
            lowered[id(ins)] = render(ins, plan, len(lowered))
    return lowered

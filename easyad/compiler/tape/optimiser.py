"""The tape rewritten once (``F.compile(optimise=True)``, and the OpenCL replay's
program) by the program compiler's one optimiser (``easyad.compiler.optimiser``, on the
IR of ``easyad.compiler.ir``): constants folded to their recorded values, common
subexpressions shared, identities that hold bit for bit (``x * 1``, ``x / 1``,
``x - 0``, ``x + -0``, ``x ** 1``, ``--x``), dead entries dropped (guards and what they
read kept). The result is an ordinary WengertList, laid out by the VM's scheduler: its
values are the recorded program's bit for bit, its gradients to rounding (a shared entry
sums its adjoints before they are multiplied by its partials, and another layout adds
contributions in another order). ``live_entries`` and ``rebuild_tape`` serve the
second-order builder, which writes tapes of its own."""
from __future__ import annotations

import gc
from typing import Any

import numpy as np

from easyad import _core, _tapeview
from easyad.compiler import ir
from easyad.compiler import optimiser as passes
from easyad.compiler.tape.opcodes import GUARD_OPS, SELECT_OP


def optimise(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...]
             ) -> tuple[Any, list[int], list[int]] | None:
    """The tape rewritten (see the module's docstring) as a new WengertList with its
    inputs and outputs, or None where it holds user primitives or tensor nodes. Replaying
    it gives the same values, bit for bit, and the same derivatives to rounding, at every
    point where the original raises nothing (errors and changed branches are the VM's to
    report, on the original tape). Tape -> IR -> the optimiser's passes -> tape."""
    # a node per entry: the cyclic collector would walk them all again and again
    collecting = gc.isenabled()
    gc.disable()
    try:
        made = ir.from_tape(tape, inputs, outputs)
        if made is None:
            return None
        graph, outs = passes.optimise(*made)
        return ir.to_tape(graph, outs)
    finally:
        if collecting:
            gc.enable()


def live_entries(ops: list[int], args: tuple[list[int], list[int]], outs: list[int],
          ins: list[int]) -> list[bool]:
    """Entries an output or a guard reads (guards are always checked), and the inputs."""
    live = [False] * len(ops)
    for i in (*outs, *ins):
        live[i] = True
    for i, op in enumerate(ops):
        if op in GUARD_OPS:
            live[i] = True
    for i in range(len(ops) - 1, -1, -1):
        if not live[i]:
            continue
        for k in (0, 1):
            if args[k][i] >= 0:
                live[args[k][i]] = True
        if ops[i] == SELECT_OP:
            live[_tapeview.select_condition(i)] = True
    return live


def rebuild_tape(keep: list[bool], ops: list[int], args: tuple[list[int], list[int]],
             values: list[float], partials: tuple[list[float], list[float]], ins: list[int],
             outs: list[int]) -> tuple[Any, list[int], list[int]]:
    index = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    a0, a1 = (np.asarray(args[k], dtype=np.int64)[kept] for k in (0, 1))
    a0 = np.where(a0 >= 0, index[np.maximum(a0, 0)], -1)
    a1 = np.where(a1 >= 0, index[np.maximum(a1, 0)], -1)
    parts = (np.asarray(values)[kept].astype("<f8").tobytes(),
             np.asarray(partials[0])[kept].astype("<f8").tobytes(),
             np.asarray(partials[1])[kept].astype("<f8").tobytes(),
             a0.astype("<i4").tobytes(), a1.astype("<i4").tobytes(),
             np.asarray(ops, dtype=np.uint8)[kept].tobytes())
    tape = _core._rebuild_wengert_list(len(kept), parts, {}, None, None, None,
                                       source="optimised program")
    return tape, [int(index[i]) for i in ins], [int(index[o]) for o in outs]

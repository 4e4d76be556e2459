"""The scalar tape's compiler (``Function.compile``): replay at compiled speed, a recorded
program optimised once, rendered to C, compiled with the C compiler present at run time,
cached on disk and called without the GIL.

Sits between the compiled core and ``replay.py`` (``Function.compile`` calls
``native(tape, inputs, outputs)``); it reads tapes through ``_tapeview`` and the core's
replay layout (``_Replayer._layout``), and the rule table's C through the generated
``_rule_functions.h``: the compiled code calls the very functions the VM calls
(``easyad_<rule>_value``, ``_d0``, ``_d1``, the helpers of ``_helpers.h``; not the whole
of ``_ops.h``, the sweeps' dispatch, which gcc would parse for every program), so its
numbers are the VM's bit for bit. The modules, in order:

- ``optimiser`` (``optimise``, only with ``F.compile(optimise=True)``): the tape rewritten once
  (constants folded, common subexpressions shared, exact identities, dead entries
  dropped) as an ordinary WengertList: tape -> ``compiler.ir`` -> ``compiler.optimiser``
  (the passes tensor programs go through too) -> tape.
- ``second_order``: the Hessian's nonzeros as a program of their own
  (``second_order_program``), compiled like any other tape.
- ``layout``, ``renderer``, ``adjoints``, ``second_order_renderer``: the VM's layout to C
  (spelled through ``compiler.dialect.C``: constants, rule functions, the strong zero), a
  straight-line program: values run by run (affine segments as loops, the rest one
  statement per entry with constants as literals), then the adjoints in the VM's order (so
  sums round alike), partials written inline from the table's C; the statements cut into
  functions of ``layout.CHUNK`` (compile time grows faster than a function's size).
  Tighter than the VM where no bit changes: adjoints known when rendering (the output's 1
  copied down sums, times constants) are literals, not stores; long runs that are not
  affine are loops over index tables (a chain's running value in a register), so gcc's
  time no longer grows with them; a gradient asked for without its value (``out`` NULL)
  skips the sums only the value reads, as the VM does; pow's constant exponents other than
  0, 1, 2 are kept out of gcc's sight (it would call sqrt for 0.5). Each point returns
  flags: bit 0 a guard's outcome changed, bit 1 an entry with an error policy has a
  non-finite value (an error, or a value of inf or NaN operands: the VM tells them apart). A
  flagged point is the VM's to handle (it raises only for live entries, re-records or
  masks), so the compiled code never answers differently. ``render_second`` appends
  the Hessian's and HVP's forward-over-reverse sweeps.
- ``prelude``: what the C starts with: the rule functions it calls, copied from
  ``_rule_functions.h``, and libm's functions declared (not ``<math.h>``): a small
  program's compile is mostly gcc's start and parsing.
- ``library``: compile, cache, verify and load (``build``, ``load``, ``compiler``), shared
  with the tensor program's compiler.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from easyad import _core
from easyad.compiler.tape import library
from easyad.compiler.tape.library import build, compiler, load
from easyad.compiler.tape.optimiser import optimise
from easyad.compiler.tape.renderer import render
from easyad.compiler.tape.second_order import second_order_program
from easyad.compiler.tape.second_order_renderer import render_second, second_work_size


def native(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...], *,
           optimised: bool = False, seeds: np.ndarray | None = None,
           gradient: bool = True, hvp: bool = False) -> Any:
    """A ``_core._Native`` calling the compiled program of the tape, or None where it
    cannot be compiled (user primitives, tensor nodes: silently; no compiler: warned).
    With seeds (n, K: the Hessian's directions) the Hessian and the HVP are compiled
    too, into the same shared object."""
    if tape._customs_count():
        return None
    if optimised:
        made = optimise(tape, inputs, outputs)
        if made is None:
            return None
        tape, new_inputs, new_outputs = made
        inputs, outputs = tuple(new_inputs), tuple(new_outputs)
    layout = _core._Replayer(tape, list(inputs), list(outputs))._layout()
    try:
        source = render(layout, f"{len(inputs)} inputs, {len(outputs)} outputs", seeds,
                        gradient, hvp)
    except ValueError:
        return None
    # read through the module, so a test's monkeypatch of library.build/load reaches here
    path = library.build(source, int(layout["length"]))
    loaded = None if path is None else library.load(path)
    if loaded is None:
        return None

    def address(name: str) -> int:
        return int(ctypes.cast(getattr(loaded, name), ctypes.c_void_p).value or 0)

    K = 1 if seeds is None else int(seeds.shape[1])
    second = {} if seeds is None and not hvp else dict(
        hessian=address("easyad_native_hessian"), hvp=address("easyad_native_hvp"),
        colours=K, second_work_size=second_work_size(layout, max(1, K)))
    return _core._Native(loaded, address("easyad_native_value"),
                         address("easyad_native_gradient"), len(inputs), len(outputs),
                         2 * int(layout["length"]) + 1, **second)


__all__ = ["optimise", "second_order_program", "render", "render_second", "second_work_size",
           "build", "load", "compiler", "native"]

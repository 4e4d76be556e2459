"""Replay at compiled speed: a recorded program optimised once, rendered to C, compiled
with the C compiler present at run time, cached on disk and called without the GIL.

Sits between the compiled core and ``replay.py`` (``Function.compile`` calls
``native(tape, inputs, outputs)``); it reads tapes through ``_tapeview`` and the core's
replay layout (``_Replayer._layout``), and the rule table's C through the generated
``_ops.h``: the compiled code calls the very functions the VM calls
(``easyad_<rule>_value``, ``_d0``, ``_d1``, ``easyad_rule_status``, the helpers of
``_helpers.h``), so its numbers are the VM's bit for bit. Three steps:

- ``optimise`` (only with ``F.compile(optimise=True)``): the tape rewritten once
  (constants folded to their recorded values, common subexpressions shared, identities
  that hold bit for bit: ``x * 1``, ``x / 1``, ``x - 0``, ``x + -0``, ``x ** 1``,
  ``--x``; dead entries dropped, guards and what they read kept). The result is an
  ordinary WengertList, laid out by the VM's scheduler: its values are the recorded
  program's bit for bit, its gradients to rounding (a shared entry sums its adjoints
  before they are multiplied by its partials, and another layout adds contributions in
  another order).
- ``render``: the VM's layout to C, a straight-line program: values run by run (affine
  segments as loops, the rest one statement per entry with constants as literals), then
  the adjoints in the VM's order (so sums round alike), partials written inline from the
  table's C; the statements cut into functions of ``_CHUNK`` (compile time grows faster
  than a function's size). Tighter than the VM where no bit changes: adjoints known when
  rendering (the output's 1 copied down sums, times constants) are literals, not stores;
  long runs that are not affine are loops over index tables (a chain's running value in
  a register), so gcc's time no longer grows with them; a gradient asked for without its
  value (``out`` NULL) skips the sums only the value reads, as the VM does; pow's constant
  exponents other than 0, 1, 2 are kept out of gcc's sight (it would call sqrt for 0.5).
  Each point returns flags: bit 0 a guard's outcome changed,
  bit 1 an entry with an error policy failed. A flagged point is the VM's to handle (it
  raises only for live entries, re-records or masks), so the compiled code never answers
  differently.
- ``build``: compile (``$CC`` or Python's compiler; -O3 -march=native, -O1 from
  ``_BIG`` entries or ``_BIG_SOURCE`` bytes of C on) into the cache
  (``$EASYAD_CACHE_DIR/compiled`` or ``~/.cache/easyad/compiled``: a private folder,
  checked by ``_cache``), keyed by a hash of all that changes the binary (the source, the
  headers it includes, easyad's version, the compiler's command and ``--version``, the
  flags, the CPU). Each shared object is written atomically with its sha256 beside it and
  loaded only when the two agree, so a damaged, truncated or planted file is compiled
  again, never loaded; a second process loads it without compiling. The compiler runs with
  a timeout and a memory limit, a long compile is announced first (the ``easyad`` logger),
  a program too big is not compiled. Anything that fails (no compiler, a bad $CC, the
  compiler, the cache): one ``CompilerWarning`` and the VM (or unfused tensor replay)
  goes on.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import re
import shlex
import shutil
import struct
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from typing import Any

import numpy as np

from easyad import _cache, _core, _expr, _rules, _tapeview
from easyad._csyntax import is_literal, literal
from easyad._version import __version__
from easyad.errors import CompilerWarning

_FORMAT = 2                       # bump when the rendered C changes meaning
# No flag changes a result: no fused multiply-adds (-ffp-contract=off), no reassociation;
# vector instructions round as scalar ones do, and libm is called as the VM calls it.
# -march=native: AVX2/AVX-512 loops (2x faster than SSE2 here); the cache key then holds
# the CPU's flags, and where the compiler refuses it the build is tried without.
_FLAGS = ("-fPIC", "-shared", "-fno-trapping-math", "-fno-math-errno", "-ffp-contract=off",
          "-fno-tree-slp-vectorize", "-std=gnu99", "-w")
_NATIVE = "-march=native"
_BIG = 30_000                     # entries from which -O1 (compile time) replaces -O3
_CHUNK = 400                      # statements per C function (compile time grows faster
                                  # than linearly with a function's size)
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_loaded: dict[str, Any] = {}      # shared object path -> ctypes library (one per process)
_warned: set[str] = set()

_OP = _rules.OPCODES
_S = _rules.STRUCTURAL_OPCODES
_SELECT = _S["select"]
_COMPARE = {_S[f"compare_{c}"]: _rules.COMPARISON_SYMBOLS[c] for c in _rules.COMPARISONS}
_GUARD = {_S[f"guard_{c}"]: _rules.COMPARISON_SYMBOLS[c] for c in _rules.COMPARISONS}
_RULE_OF = {code: _rules.RULES_BY_NAME[name] for name, code in _OP.items()}


def _warn_once(reason: str, text: str) -> None:
    """One CompilerWarning per reason and process, shown at the user's line (the first
    frame outside easyad)."""
    if reason in _warned:
        return
    _warned.add(reason)
    package = os.path.dirname(_HERE) + os.sep + "easyad" + os.sep
    level, frame = 2, sys._getframe(1)     # 2: _warn_once's caller
    while frame is not None and frame.f_code.co_filename.startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(text, CompilerWarning, stacklevel=level)


# ---- optimise: the tape rewritten once ----

def optimise(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...]
             ) -> tuple[Any, list[int], list[int]] | None:
    """The tape rewritten (see the module's docstring) as a new WengertList with its
    inputs and outputs, or None where it holds user primitives or tensor nodes. Replaying
    it gives the same values, bit for bit, and the same derivatives to rounding, at every
    point where the original raises nothing (errors and changed branches are the VM's to
    report, on the original tape)."""
    view = _tapeview.TapeView(tape)
    ops = view.ops.tolist()
    if any(_tapeview.KINDS[op] in (_tapeview.CUSTOM, _tapeview.NODE) for op in ops):
        return None
    arg = (view.arg0.tolist(), view.arg1.tolist())
    recorded = view.values.tolist()
    partial = (view.partial0.tolist(), view.partial1.tolist())
    input_set = set(inputs)
    # rep[e]: ("e", new index) or ("c", value)
    rep: list[tuple[str, Any]] = []
    new_ops: list[int] = []
    new_arg: tuple[list[int], list[int]] = ([], [])
    new_values: list[float] = []
    new_partial: tuple[list[float], list[float]] = ([], [])
    seen: dict[tuple[Any, ...], int] = {}
    neg, mul, div, sub, add, pow_ = (_OP[k] for k in ("neg", "mul", "div", "sub", "add", "pow"))

    def emit(op: int, a: tuple[str, Any], b: tuple[str, Any], value: float,
             p: tuple[float, float]) -> int:
        for k, (kind, x) in enumerate((a, b)):
            new_arg[k].append(x if kind == "e" else -1)
            new_partial[k].append(p[k] if kind == "e" else x)
        new_ops.append(op)
        new_values.append(value)
        return len(new_ops) - 1

    def key(r: tuple[str, Any]) -> tuple[str, Any]:
        return r if r[0] == "e" else ("c", np.float64(r[1]).tobytes())

    none = ("c", 0.0)
    for e, op in enumerate(ops):
        kind = _tapeview.KINDS[op]
        if kind in (_tapeview.VARIABLE, _tapeview.CONSTANT):
            if e in input_set:
                rep.append(("e", emit(op, none, none, recorded[e], (0.0, 0.0))))
            else:
                rep.append(("c", recorded[e]))
            continue
        arity = _RULE_OF[op].arity if kind == _tapeview.RULE else 2
        operands = []
        for k in range(2):
            if k >= arity:
                operands.append(none)
            elif arg[k][e] >= 0:
                operands.append(rep[arg[k][e]])
            else:
                operands.append(("c", partial[k][e]))
        a, b = operands
        p = (partial[0][e], partial[1][e])
        if kind != _tapeview.RULE:     # comparisons, guards and selects stay as they are
            if kind == _tapeview.GUARD and a[0] == "c" and b[0] == "c":
                rep.append(("c", recorded[e]))     # of constants: it never changes
                continue
            if kind in (_tapeview.GUARD, _tapeview.COMPARE) and a[0] == "c":
                # a comparison reads an entry first: the constant as a fixed variable
                a = ("e", emit(_rules.OP_VARIABLE, none, none, a[1], (0.0, 0.0)))
            rep.append(("e", emit(op, a, b, recorded[e], p)))
            continue
        if all(r[0] == "c" for r in operands[:arity]):
            rep.append(("c", recorded[e]))      # constant: the value it was recorded with
            continue
        same = _identity(op, a, b, neg, mul, div, sub, add, pow_, new_ops, new_arg)
        if same is not None:
            rep.append(same)
            continue
        k2 = (op, key(a), key(b))
        if k2 in seen:
            rep.append(("e", seen[k2]))
            continue
        seen[k2] = emit(op, a, b, recorded[e], p)
        rep.append(("e", seen[k2]))
    outs = []
    for o in outputs:
        r = rep[o]
        outs.append(r[1] if r[0] == "e" else
                    emit(_rules.OP_VARIABLE, none, none, r[1], (0.0, 0.0)))
    ins = [rep[i][1] for i in inputs]
    keep = _live(new_ops, new_arg, outs, ins)
    return _rebuild(keep, new_ops, new_arg, new_values, new_partial, ins, outs)


def _identity(op: int, a: tuple[str, Any], b: tuple[str, Any], neg: int, mul: int, div: int,
              sub: int, add: int, pow_: int, ops: list[int],
              args: tuple[list[int], list[int]]) -> tuple[str, Any] | None:
    """The operand an entry equals bit for bit (value and derivative), or None."""
    def const(r: tuple[str, Any], v: float) -> bool:
        return r[0] == "c" and np.float64(r[1]).tobytes() == np.float64(v).tobytes()

    if op == mul:
        if const(b, 1.0) and a[0] == "e":
            return a
        if const(a, 1.0) and b[0] == "e":
            return b
    elif (op == div and const(b, 1.0)) or (op == sub and const(b, 0.0)) \
            or (op == add and const(b, -0.0)) or (op == pow_ and const(b, 1.0)):
        return a if a[0] == "e" else None
    elif op == add and const(a, -0.0):
        return b if b[0] == "e" else None
    elif op == neg and a[0] == "e" and ops[a[1]] == neg and args[0][a[1]] >= 0:
        return ("e", args[0][a[1]])
    return None


def _live(ops: list[int], args: tuple[list[int], list[int]], outs: list[int],
          ins: list[int]) -> list[bool]:
    """Entries an output or a guard reads (guards are always checked), and the inputs."""
    live = [False] * len(ops)
    for i in (*outs, *ins):
        live[i] = True
    for i, op in enumerate(ops):
        if op in _GUARD:
            live[i] = True
    for i in range(len(ops) - 1, -1, -1):
        if not live[i]:
            continue
        for k in (0, 1):
            if args[k][i] >= 0:
                live[args[k][i]] = True
        if ops[i] == _SELECT:
            live[_tapeview.select_condition(i)] = True
    return live


def _rebuild(keep: list[bool], ops: list[int], args: tuple[list[int], list[int]],
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


# ---- second order: the Hessian's nonzeros as a program of their own ----

_SECOND_LIMIT = 60_000     # colours x entries above which no second-order program is built
_UNSUPPORTED = frozenset({"sign", "heaviside"})   # helpers with no tape op (abs, max, min)


@functools.lru_cache(maxsize=None)
def _partial_tree(op: int, k: int) -> Any:
    return _expr.parse(_RULE_OF[op].partials[k])


@functools.lru_cache(maxsize=None)
def _tangent_tree(op: int, k: int) -> Any:
    return _expr.partial_tangent(_RULE_OF[op], k)


class _Emitter:
    """A tape written entry by entry, operands as refs: ("e", index) or ("c", value).
    Equal entries are shared (common subexpressions), constants folded, and the products
    of derivative code (``mul0``) keep the strong zero: a factor 0 gives 0 whatever the
    other is. Values of the emitted entries are not known (0.0), except for guards."""

    def __init__(self) -> None:
        self.ops: list[int] = []
        self.args: tuple[list[int], list[int]] = ([], [])
        self.values: list[float] = []
        self.partials: tuple[list[float], list[float]] = ([], [])
        self.seen: dict[tuple[Any, ...], tuple[str, Any]] = {}

    def raw(self, op: int, a: tuple[str, Any], b: tuple[str, Any], value: float = 0.0) -> int:
        for k, (kind, x) in enumerate((a, b)):
            self.args[k].append(x if kind == "e" else -1)
            self.partials[k].append(0.0 if kind == "e" else x)
        self.ops.append(op)
        self.values.append(value)
        return len(self.ops) - 1

    @staticmethod
    def key(r: tuple[str, Any]) -> tuple[str, Any]:
        return r if r[0] == "e" else ("c", np.float64(r[1]).tobytes())

    def entry(self, r: tuple[str, Any]) -> tuple[str, Any]:
        """r as an entry: a constant becomes a fixed variable (not an input) holding it,
        for the places a tape needs an entry (a unary rule's or a comparison's first
        operand, a rule that has one operand at least)."""
        if r[0] == "e":
            return r
        k = (_rules.OP_VARIABLE, self.key(r))
        if k not in self.seen:
            self.seen[k] = ("e", self.raw(_rules.OP_VARIABLE, ("c", 0.0), ("c", 0.0), r[1]))
        return self.seen[k]

    def rule(self, name: str, a: tuple[str, Any], b: tuple[str, Any] = ("c", 0.0), *,
             exact: bool = False) -> tuple[str, Any]:
        """The rule ``name`` of a (and b): folded on constants, shared when seen before.
        Every rewrite keeps the value bit for bit (so the program rounds and overflows
        where the sweeps do); ``exact``: the sign of a zero too (values, which a later
        atan2 or 1/x may read; derivative code drops ``+ 0``)."""
        rule = _rules.RULES_BY_NAME[name]
        if rule.arity == 1:
            b = ("c", 0.0)
        if a[0] == "c" and b[0] == "c":
            folded = _fold(name, a[1], b[1])
            if folded is not None:
                return ("c", folded)
            a = self.entry(a)         # computed at run time, by the VM's function
        if not exact:
            if name in ("add", "sub") and b[0] == "c" and b[1] == 0.0:
                return a            # u + 0 = u - 0 = u (but for the sign of a zero)
            if name == "add" and a[0] == "c" and a[1] == 0.0:
                return b
            if name == "sub" and a[0] == "c" and a[1] == 0.0 and b[0] == "e":
                return self.neg(b)
        if name == "pow" and b[0] == "c" and a[0] == "e":
            if b[1] == 1.0:     # the table's pow: x for the exponent 1, 1 for 0, exactly
                return a
            if b[1] == 0.0:
                return ("c", 1.0)
        if name in ("add", "mul") and b[0] == "e" and (a[0] == "c" or b[1] < a[1]):
            a, b = b, a     # commutative: one order, so equal sums are shared
        if name == "mul" and a[0] == "e" and b[0] == "c":
            if b[1] == 1.0:
                return a
            if b[1] == -1.0:
                return self.neg(a)
            inner = self._negated(a)
            if inner is not None:              # (-u) * c = u * (-c), exactly
                return self.rule("mul", inner, ("c", -b[1]), exact=exact)
            inner_constant = self.partials[1][a[1]]
            if self.ops[a[1]] == _OP["mul"] and self.args[1][a[1]] < 0 \
                    and _rescales_exactly(inner_constant, b[1]):
                # (u * c1) * c2 = u * (c1 * c2), here bit for bit (Rosenbrock's 100 * 2u)
                return self.rule("mul", ("e", self.args[0][a[1]]),
                                 ("c", inner_constant * b[1]), exact=exact)
        if name == "add" and a[0] == "e" and b[0] == "e":
            for u, w in ((a, b), (b, a)):
                inner = self._negated(w)
                if inner is not None:          # u + (-w) = u - w, exactly
                    return self.rule("sub", u, inner, exact=exact)
        if name == "sub" and b[0] == "e":
            inner = self._negated(b)
            if inner is not None:              # u - (-w) = u + w, exactly
                return self.rule("add", a, inner, exact=exact)
        op = _OP[name]
        k = (op, self.key(a), self.key(b))
        if k not in self.seen:
            self.seen[k] = ("e", self.raw(op, a, b))
        return self.seen[k]

    def _negated(self, r: tuple[str, Any]) -> tuple[str, Any] | None:
        """u where r is the entry -u, else None."""
        if r[0] == "e" and self.ops[r[1]] == _OP["neg"] and self.args[0][r[1]] >= 0:
            return ("e", self.args[0][r[1]])
        return None

    @staticmethod
    def zero(r: tuple[str, Any] | None) -> bool:
        return r is None or (r[0] == "c" and r[1] == 0.0)

    def add(self, a: tuple[str, Any] | None, b: tuple[str, Any] | None) -> tuple[str, Any]:
        if self.zero(a):
            return ("c", 0.0) if b is None else b
        if self.zero(b):
            return a  # type: ignore[return-value]
        return self.rule("add", a, b)   # type: ignore[arg-type]

    def mul0(self, a: tuple[str, Any] | None, b: tuple[str, Any] | None) -> tuple[str, Any]:
        """A product of derivative code: the strong zero (0 * inf = 0) folded here; at run
        time a plain product (0 * inf = NaN there, which the caller treats as a point to
        hand to the sweeps)."""
        if self.zero(a) or self.zero(b):
            return ("c", 0.0)
        assert a is not None and b is not None
        for one, other in ((a, b), (b, a)):
            if one[0] == "c" and one[1] == 1.0:
                return other
            if one[0] == "c" and one[1] == -1.0:
                return self.neg(other)
        return self.rule("mul", a, b)

    def neg(self, a: tuple[str, Any]) -> tuple[str, Any]:
        if a[0] == "c":
            return ("c", -a[1])
        if self.ops[a[1]] == _OP["neg"] and self.args[0][a[1]] >= 0:
            return ("e", self.args[0][a[1]])
        return self.rule("neg", a)

    def expression(self, node: Any, env: dict[str, tuple[str, Any] | None]) -> tuple[str, Any]:
        """An expression tree of the rule table (``_expr``) over refs: the table's
        helpers as entries (``mul0``, ``tmul`` with their zeros, ``div0`` as a quotient);
        raises _Decline on a helper that has no entry (sign, heaviside)."""
        if isinstance(node, _expr.Num):
            return ("c", float(node.value))
        if isinstance(node, _expr.Var):
            r = env[node.name]
            return ("c", 0.0) if r is None else r
        if isinstance(node, _expr.Neg):
            return self.neg(self.expression(node.operand, env))
        if isinstance(node, _expr.Bin):
            a = self.expression(node.left, env)
            b = self.expression(node.right, env)
            if node.op == "+":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] + b[1])
                return self.rule("add", a, b)
            if node.op == "-":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] - b[1])
                return self.rule("sub", a, b)
            if node.op == "*":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] * b[1])
                return self.rule("mul", a, b)
            if node.op == "/":
                return self.rule("div", a, b)
            raise _Decline(node.op)
        name, args = node.name, node.args
        if name in ("mul0", "tmul"):
            t = self.expression(args[0], env)
            if self.zero(t):        # lazy, as the C macro: the factor is not computed
                return ("c", 0.0)
            return self.mul0(t, self.expression(args[1], env))
        if name == "div0":
            a = self.expression(args[0], env)
            if self.zero(a):
                return ("c", 0.0)
            return self.rule("div", a, self.expression(args[1], env))
        if name in _UNSUPPORTED or name not in _rules.RULES_BY_NAME:
            raise _Decline(name)
        refs = [self.expression(arg, env) for arg in args]
        return self.rule(name, *refs)


def _fold(name: str, x: float, y: float) -> float | None:
    """A rule on constants, as the VM computes it (None: left to the VM, which also flags
    an error there)."""
    import operator

    arithmetic = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                  "div": operator.truediv,
                  "neg": lambda a, _: -a}
    function = arithmetic.get(name) or getattr(math, name, None)   # the C library's
    if function is None or name == "pow":
        return None
    arity = 2 if name in arithmetic else _rules.RULES_BY_NAME[name].arity
    try:
        return float(function(x) if arity == 1 else function(x, y))
    except (ArithmeticError, ValueError):
        # outside the domain, or overflow: Python raises where C returns NaN or an
        # infinity, which is what the derivative code (never checked) computes there
        numpy_function = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                          "div": np.divide, "neg": np.negative}.get(name) \
            or getattr(np, name, None)
        if numpy_function is None:
            return None
        with np.errstate(all="ignore"):
            result = float(numpy_function(x) if _rules.RULES_BY_NAME[name].arity == 1
                           else numpy_function(x, y))
        return None if math.isfinite(result) else result


def _rescales_exactly(c1: float, c2: float) -> bool:
    """Whether (u * c1) * c2 is u * (c1 * c2) bit for bit at every u: c1 a power of two
    of magnitude 1 at least (u * c1 exact, or an overflow that u * (c1 * c2) has too)
    and |c2| >= 1 (so no overflow of u * c1 that the other form escapes). Otherwise the
    two round, and overflow, at other points, and the program would not be the sweeps'."""
    mantissa, _ = math.frexp(c1)
    return abs(mantissa) == 0.5 and abs(c1) >= 1.0 and abs(c2) >= 1.0 \
        and math.isfinite(c1 * c2)


class _Decline(Exception):
    """The program holds something the second-order program does not express."""


def second_order_program(tape: Any, inputs: tuple[int, ...], output: int,
                         rows: np.ndarray, cols: np.ndarray, colour: np.ndarray,
                         order: Any = None) -> tuple[Any, list[int], list[int]] | None:
    """The Hessian's nonzeros as a program of their own, built once: a WengertList whose
    outputs are H[rows[t], cols[t]] for each t with rows[t] <= cols[t] (the upper triangle
    in the pattern's order: the Hessian is symmetric), then the values of the entries with
    an error policy (log, pow...) that f reads but the nonzeros do not. It is
    forward-over-reverse done symbolically, over the tape: the adjoints of the reverse
    sweep and, per colour k of the columns (``colour``: no row has two columns of one
    colour), the tangents of values, partials and adjoints along the colour's seed (the
    sum of its unit vectors); entries are shared when equal, constants folded (the
    adjoints of sums are 1 and vanish from the program), products with a zero tangent
    dropped, and only what the nonzeros read kept. The partials and their tangents are the
    rule table's expressions (``_expr``), as the sweeps compute them, and every rewrite
    keeps values bit for bit; ``order`` (the tape's entries in the VM's layout order,
    ``_Replayer._layout()["original"]``) makes the adjoints and their tangents summed in
    the sweeps' order. So, replayed by the VM (values only) or compiled, it gives the
    sweeps' numbers for H[r, c], r <= c (the sweeps mirror that triangle too) wherever its
    outputs are finite, but for the sign of a zero (at run time its products are plain
    ones: a 0 * inf the sweeps' strong zero makes 0 shows as NaN here, and the caller
    then runs the sweeps). Guards are kept, so a changed branch is flagged. None where the
    Hessian has no nonzero, or the tape holds selects, comparisons feeding arithmetic,
    user primitives, tensor nodes, abs/maximum/minimum (whose partials are piecewise
    helpers), or is too large (``_SECOND_LIMIT``)."""
    view = _tapeview.TapeView(tape)
    ops = view.ops.tolist()
    K = int(colour.max()) + 1 if len(colour) else 1
    if (output + 1) * K > _SECOND_LIMIT:
        return None
    kinds = [_tapeview.KINDS[op] for op in ops]
    if any(k in (_tapeview.CUSTOM, _tapeview.NODE, _tapeview.SELECT, _tapeview.COMPARE)
           for k in kinds):
        return None
    arg = (view.arg0.tolist(), view.arg1.tolist())
    recorded = view.values.tolist()
    partial = (view.partial0.tolist(), view.partial1.tolist())
    E = _Emitter()
    value: list[tuple[str, Any]] = []
    position = {e: j for j, e in enumerate(inputs)}
    ins = [0] * len(inputs)
    try:
        # values (and guards, wherever recorded)
        for e, op in enumerate(ops):
            kind = kinds[e]
            if kind in (_tapeview.VARIABLE, _tapeview.CONSTANT):
                if e in position:
                    value.append(("e", E.raw(op, ("c", 0.0), ("c", 0.0), recorded[e])))
                    ins[position[e]] = value[-1][1]
                else:
                    value.append(("c", recorded[e]))
                continue
            refs = [value[arg[k][e]] if arg[k][e] >= 0 else ("c", partial[k][e])
                    for k in (0, 1)]
            if kind == _tapeview.GUARD:
                if refs[0][0] == "e" or refs[1][0] == "e":    # else it never changes
                    E.raw(op, E.entry(refs[0]), refs[1], recorded[e])
                value.append(("c", recorded[e]))     # a guard's value feeds nothing
                continue
            rule = _RULE_OF[op]
            if rule.name in ("abs", "maximum", "minimum"):
                raise _Decline(rule.name)
            if all(r[0] == "c" for r in refs[:rule.arity]):
                value.append(("c", recorded[e]))
                continue
            value.append(E.rule(rule.name, refs[0], refs[1], exact=True))
        # partials of the output's ancestors, and the adjoints
        live = [False] * (output + 1)
        live[output] = True
        for e in range(output, -1, -1):
            if live[e] and kinds[e] == _tapeview.RULE:
                for k in (0, 1):
                    if arg[k][e] >= 0:
                        live[arg[k][e]] = True
        parts: dict[int, list[tuple[str, Any] | None]] = {}
        env_of: dict[int, dict[str, tuple[str, Any] | None]] = {}
        for e in range(output + 1):
            if not (live[e] and kinds[e] == _tapeview.RULE):
                continue
            rule = _RULE_OF[ops[e]]
            env = {"x": value[arg[0][e]] if arg[0][e] >= 0 else ("c", partial[0][e]),
                   "y": (value[arg[1][e]] if arg[1][e] >= 0 else ("c", partial[1][e]))
                   if rule.arity > 1 else ("c", 0.0),
                   "z": value[e]}
            env_of[e] = env
            parts[e] = [E.expression(_partial_tree(ops[e], k), env)
                        if k < rule.arity and arg[k][e] >= 0 else None for k in (0, 1)]
        # the sweeps' order: reverse layout position (the tape's where no layout is given)
        rank = {} if order is None else {int(e): p for p, e in enumerate(order)}
        backward = sorted(parts, key=rank.__getitem__, reverse=True) \
            if all(e in rank for e in parts) else sorted(parts, reverse=True)
        adjoint: list[tuple[str, Any] | None] = [None] * (output + 1)
        adjoint[output] = ("c", 1.0)
        for e in backward:
            g = adjoint[e]
            if E.zero(g):
                continue
            for k in (0, 1):
                if parts[e][k] is not None:
                    a = arg[k][e]
                    adjoint[a] = E.add(adjoint[a], E.mul0(parts[e][k], g))
        # per colour: tangents forward, then the adjoints' tangents
        n = len(inputs)
        result: list[list[tuple[str, Any]]] = []
        for c in range(K):
            tangent: list[tuple[str, Any] | None] = [None] * (output + 1)
            for j, e in enumerate(inputs):
                if e <= output and colour[j] == c:
                    tangent[e] = ("c", 1.0)
            dparts: dict[int, list[tuple[str, Any] | None]] = {}
            for e in range(output + 1):
                if e not in parts:
                    continue
                d = [tangent[arg[k][e]] if arg[k][e] >= 0 else None for k in (0, 1)]
                if E.zero(d[0]) and E.zero(d[1]):
                    continue
                dz = E.add(E.mul0(parts[e][0], d[0]), E.mul0(parts[e][1], d[1]))
                tangent[e] = dz
                env = dict(env_of[e], dx=d[0], dy=d[1], dz=dz)
                dparts[e] = [E.expression(_tangent_tree(ops[e], k), env)
                             if parts[e][k] is not None else None for k in (0, 1)]
            dadj: list[tuple[str, Any] | None] = [None] * (output + 1)
            for e in backward:
                g, q = adjoint[e], dadj[e]
                if E.zero(q) and e not in dparts:
                    continue
                for k in (0, 1):
                    if parts[e][k] is None:
                        continue
                    term = E.add(E.mul0(dparts[e][k], g) if e in dparts else None,
                                 E.mul0(parts[e][k], q))
                    a = arg[k][e]
                    dadj[a] = E.add(dadj[a], term)
            result.append([dadj[e] if e <= output and dadj[e] is not None else ("c", 0.0)
                           for e in inputs])
    except _Decline:
        return None
    outs = []
    upper = [result[int(colour[cc])][int(rr)]
             for rr, cc in zip(rows.tolist(), cols.tolist()) if rr <= cc]
    if not upper:
        return None      # a linear function: the sweeps' zeros (and checks) are cheap
    for r in upper:
        outs.append(r[1] if r[0] == "e" else E.raw(_rules.OP_VARIABLE, ("c", 0.0), ("c", 0.0),
                                                   r[1]))
    assert len(ins) == n
    keep = _live(E.ops, E.args, outs, ins)
    # entries with an error policy that f reads and the nonzeros do not: outputs too, so
    # the program fails (and hands the point to the sweeps) wherever f's replay would
    for e in range(output + 1):
        if live[e] and kinds[e] == _tapeview.RULE and value[e][0] == "e" \
                and _RULE_OF[ops[e]].errors != _rules.NO_CHECK and not keep[value[e][1]]:
            outs.append(value[e][1])
    if len(outs) > len(upper):
        keep = _live(E.ops, E.args, outs, ins)
    return _rebuild(keep, E.ops, E.args, E.values, E.partials, ins, outs)


# ---- render: the layout as C ----

_literal = literal     # the one constant printer of the C-family targets (_csyntax)


class _Program:
    """The layout of a _Replayer with what rendering asks of it."""

    def __init__(self, layout: dict[str, Any]) -> None:
        self.__dict__.update(layout)
        self.L = int(self.length)
        self.input_set = set(self.inputs.tolist())
        self.decls: list[str] = []       # file-scope tables the statements read

    def __getattr__(self, name: str) -> Any:
        # the layout's arrays, set in __init__ (this tells type checkers they exist)
        raise AttributeError(f"the replay layout has no {name!r}")

    def operand(self, s: int) -> str:
        """The C expression of a slot: v[p] or a constant's literal."""
        return f"v[{s}]" if s < self.L else _literal(float(self.constants[s - self.L]))

    def strided(self, base: int, stride: int, need: bool) -> str:
        if base < self.L:
            return f"v[{base} + j]" if stride else f"v[{base}]"
        if stride:
            return f"K[{base - self.L} + j]"
        return _literal(float(self.constants[base - self.L]))


def render(layout: dict[str, Any], origin: str, seeds: np.ndarray | None = None,
           gradient: bool = True, hvp: bool = False) -> str:
    """C source of the program laid out by the VM (``_Replayer._layout()``); with seeds
    (n, K), the Hessian and HVP too (``render_second``); with gradient=False values only
    (the gradient function then flags every point, bit 2, for the VM: a shorter compile);
    hvp without seeds: the HVP alone (``render_second``)."""
    P = _Program(layout)
    L = P.L
    runs = list(zip(P.run_start[:-1].tolist(), P.run_start[1:].tolist(), P.run_op.tolist(),
                    P.run_need.tolist(), P.run_affine.tolist(), P.run_base0.tolist(),
                    P.run_base1.tolist()))
    dead = _dead_runs(P, runs)
    # the runs only the output's value reads (sums) are skipped by a gradient asked for
    # without its value (out NULL), as the VM skips its run_dead; in place (an entry
    # nothing wants of a run that is kept may still read them)
    forward: list[str] = []
    for r, run in enumerate(runs):
        lines = _forward_run(P, run)
        forward += [f"    if (all) {{\n{''.join(lines)}    }}\n"] if dead[r] else lines
    ancestors = _ancestors(P, int(P.outputs[0]))
    adjoints = _Adjoints(P, int(P.outputs[0]))
    if gradient:
        for run in reversed(runs):
            _reverse_run(P, run, ancestors, adjoints)
        # read from memory after: the inputs' (the gradient), every one for second order
        adjoints.settle(sorted(adjoints.known) if seeds is not None or hvp else
                        [int(p) for p in P.inputs if int(p) in adjoints.known])
    else:
        adjoints.lines = []
    n, m = len(P.inputs), len(P.outputs)
    out = [f"/* GENERATED by easyad/_compile.py from a recorded easyad.Function ({origin}; "
           f"{L} entries laid out by the replay VM), do not edit.\n"
           " * Values, then adjoints, as straight-line C; the math is the rule table's, from\n"
           " * _ops.h and _helpers.h, the functions the VM calls. */\n",
           "#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n",
           '#include "_ops.h"\n\n',
           "#if defined(__GNUC__)\n#define EASYAD_CUT __attribute__((noinline))\n#else\n"
           "#define EASYAD_CUT\n#endif\n", _KEEP]
    out.append(f"static const double K[{max(1, len(P.constants))}] = "
               f"{{{', '.join(_literal(float(c)) for c in P.constants) or '0.0'}}};\n")
    out += P.decls
    inputs = [int(p) for p in P.inputs]
    taken = set(inputs)
    fixed = [p for p in range(int(P.first)) if p not in taken]
    setup = [f"    v[{p}] = {_literal(float(P.values[p]))};\n" for p in fixed]
    setup += _gather("v", inputs, "x")
    fparts = _chunks(setup + forward)
    rparts = _chunks(adjoints.lines)
    cut = "EASYAD_CUT " if len(fparts) + len(rparts) > 2 else ""
    for k, body in enumerate(fparts):
        out.append(f"static {cut}int fwd{k}(const double* restrict x, double* restrict v, "
                   f"int all) {{\n    int flags = 0; long j; (void)j; (void)x; (void)all;\n"
                   f"{body}    return flags;\n}}\n")
    for k, body in enumerate(rparts):
        out.append(f"static {cut}void rev{k}(const double* restrict v, double* restrict a) {{\n"
                   f"    long j; (void)j; (void)v;\n{body}}}\n")
    calls_f = "".join(f"    flags |= fwd{k}(x, v, all);\n" for k in range(len(fparts)))
    calls_r = "".join(f"    rev{k}(v, a);\n" for k in range(len(rparts)))
    get_out = "".join(f"    out[{k}] = v[{int(p)}];\n" for k, p in enumerate(P.outputs))
    if inputs == list(range(inputs[0] if inputs else 0, (inputs[0] if inputs else 0) + n)) \
            and adjoints.written[inputs[0] if inputs else 0:(inputs[0] if inputs else 0) + n].all():
        get_g = f"    for (j = 0; j < {n}; j++) g[j] = 0.0 + a[{inputs[0] if inputs else 0} + j];\n"
    else:
        get_g = "".join(f"    g[{k}] = {f'0.0 + a[{p}]' if adjoints.written[p] else '0.0'};\n"
                        for k, p in enumerate(inputs))
    gradient_body = (f"    double* v = work;\n    double* a = work + {L};\n    long j; (void)j;\n"
                     f"    int flags = sweep(x, v, out != NULL);\n"
                     f"    if (out != NULL) {{\n    {get_out.strip()}\n    }}\n"
                     f"    if (flags) return flags;\n"
                     f"    (void)a;\n{calls_r}{get_g}    return 0;\n")
    if not gradient:      # values only: a gradient is the VM's (flag 4, every point)
        gradient_body = "    (void)x; (void)out; (void)g; (void)work;\n    return 4;\n"
    out.append(f"""
static inline int sweep(const double* restrict x, double* restrict v, int all) {{
    int flags = 0;
{calls_f}    return flags;
}}

static inline int forward(const double* restrict x, double* restrict v) {{
    return sweep(x, v, 1);
}}

int easyad_native_value(const double* restrict x, double* restrict out, double* g,
                        double* restrict work) {{
    double* v = work;
    int flags = forward(x, v);
    (void)g;
{get_out}    return flags;
}}

int easyad_native_gradient(const double* restrict x, double* restrict out,
                           double* restrict g, double* restrict work) {{
{gradient_body}}}

int64_t easyad_native_rows(int gradient, int64_t r0, int64_t r1, const double* X,
                           double* out, double* G, uint8_t* flags) {{
    int64_t r, bad = 0;
    double* work = (double*)malloc({2 * L + 1} * sizeof(double));
    if (work == NULL) return -1;
    for (r = r0; r < r1; r++) {{
        int f = gradient
            ? easyad_native_gradient(X + r * {n}, out ? out + r * {m} : NULL, G + r * {n}, work)
            : easyad_native_value(X + r * {n}, out + r * {m}, NULL, work);
        flags[r] = (uint8_t)f;
        bad += f != 0;
    }}
    free(work);
    return bad;
}}
""")
    if seeds is not None or hvp:
        out.append(render_second(layout, seeds, len(rparts)))
    return "".join(out)


# ---- render: second order (forward-over-reverse), the VM's _second_order_row ----

def render_second(layout: dict[str, Any], seeds: np.ndarray | None, n_rev: int) -> str:
    """C of the Hessian and the HVP, appended to ``render``'s source (which defines
    ``forward``, ``rev*`` and includes the headers): the VM's forward-over-reverse sweep
    (``_second_order_row``, ``easyad_rule_tangents_run``) as straight-line code. Tangents
    of values and partials in K directions, entry by entry in the layout's order, the
    adjoints' tangents in reverse position order, each from the same per-rule functions
    (``easyad_<rule>_d0``, ``_t0``, ``_t1``, ``mul0``): the VM's numbers bit for bit.
    ``easyad_native_hessian`` runs K = seeds.shape[1] directions with the seeds (n, K)
    compiled in (a colouring of the columns, or the identity); ``easyad_native_hvp`` one
    direction given per call. Only ancestors of output 0 are visited: the VM's entries
    elsewhere have adjoint 0 and tangent-adjoint 0, whose contributions (strong zeros) it
    skips; adding them would add +0.0 to sums that start at +0.0, so skipping changes no
    bit either."""
    P = _Program(layout)
    L = P.L
    output = int(P.outputs[0])
    Lo = output + 1 if output < L else 0
    ancestors = _ancestors(P, output)
    inputs = [int(p) for p in P.inputs]
    runs = list(zip(P.run_start[:-1].tolist(), P.run_start[1:].tolist(), P.run_op.tolist(),
                    P.run_need.tolist(), P.run_affine.tolist(), P.run_base0.tolist(),
                    P.run_base1.tolist()))
    # seeds None: the HVP alone (the Hessian is the second-order program's,
    # second_order_program; easyad_native_hessian then hands every point to the VM)
    sweep = seeds is not None
    if seeds is None:
        seeds = np.zeros((len(inputs), 1))
    n, K = len(inputs), int(seeds.shape[1])
    # (-O1 for these functions alone, by attribute, was tried: gcc then inlines none of
    # _ops.h's functions into them, 3x slower; -O1 for the whole file costs the gradient)
    out = [f"\n/* second order: {K} seed directions (Hessian), 1 given (HVP) */\n",
           f"static const double S[{max(1, n * K)}] = "
           f"{{{', '.join(_literal(float(c)) for c in seeds.ravel()) or '0.0'}}};\n"]
    for name, k_dirs in (("hessian", K), ("hvp", 1)):
        if name == "hessian" and not sweep:
            out.append("\nint easyad_native_hessian(const double* restrict x, const double* "
                       "restrict dir,\n    double* restrict result, double* restrict work) {\n"
                       "    (void)x; (void)dir; (void)result; (void)work;\n"
                       "    return 4;   /* not compiled: the VM's */\n}\n")
            continue
        lines: list[str] = []
        first = int(P.first)
        if Lo:
            lines.append(f"    memset(dv, 0, {min(first, Lo) * k_dirs} * sizeof(double));\n")
            lines.append(f"    memset(dadj, 0, {Lo * k_dirs} * sizeof(double));\n")
        for j, s in enumerate(inputs):
            if s < Lo:
                src = (f"S[{j * K} + k]" if name == "hessian" else f"dir[{j}]")
                lines.append(f"    for (k = 0; k < {k_dirs}; k++) dv[{s * k_dirs} + k] = {src};\n")
        for run in runs:
            if run[0] < Lo:
                lines += _tangent_run(P, run, Lo, ancestors, k_dirs)
        for run in reversed(runs):
            if run[0] < Lo:
                lines += _tangent_adjoint_run(P, run, Lo, ancestors, k_dirs)
        for j, s in enumerate(inputs):
            src = f"dadj[{s * k_dirs} + k]" if s < Lo else "0.0"
            lines.append(f"    for (k = 0; k < {k_dirs}; k++) result[{j * k_dirs} + k] = {src};\n")
        parts = _chunks(lines)
        base = [L, 2 * L + 1, 3 * L + 1, 4 * L + 1]
        wide = max(1, Lo * k_dirs)
        for part, body in enumerate(parts):
            out.append(
                f"static EASYAD_CUT void {name}{part}(const double* restrict dir, "
                f"double* restrict result, double* w) {{\n"
                f"    const double* restrict v = w; const double* restrict a = w + {base[0]};\n"
                f"    double* restrict p0 = w + {base[1]}; double* restrict p1 = w + {base[2]};\n"
                f"    double* restrict dv = w + {base[3]}; double* restrict dp0 = dv + {wide};\n"
                f"    double* restrict dp1 = dp0 + {wide}; double* restrict dadj = dp1 + {wide};\n"
                f"    long j, k; (void)j; (void)k; (void)v; (void)a; (void)p0; (void)p1; "
                f"(void)dp0; (void)dp1; (void)dir; (void)result;\n{body}}}\n")
        calls = "".join(f"    {name}{part}(dir, result, work);\n" for part in range(len(parts)))
        out.append(f"""
int easyad_native_{name}(const double* restrict x, const double* restrict dir,
                         double* restrict result, double* restrict work) {{
    double* v = work;
    double* a = work + {L};
    int flags = forward(x, v);
    if (flags) return flags;
    memset(a, 0, {L + 1} * sizeof(double));   /* the adjoints the gradient leaves unwritten */
{''.join(f"    rev{k}(v, a);" + chr(10) for k in range(n_rev))}{calls}    return 0;
}}
""")
    return "".join(out)


def second_work_size(layout: dict[str, Any], K: int) -> int:
    """Doubles of work space the second-order functions need with K directions."""
    L = int(layout["length"])
    output = int(layout["outputs"][0])
    Lo = output + 1 if output < L else 0
    return 4 * L + 1 + 4 * max(1, Lo * max(K, 1))


def _tan(P: _Program, s: int, k_dirs: int, stride: int = 0) -> str:
    """The tangent (direction k) of slot s (with stride: of slot s + j)."""
    if stride:
        return f"dv[({s} + j) * {k_dirs} + k]"
    if s >= P.L:
        return "0.0"
    if s < int(P.first) and s not in P.input_set:
        return "0.0"
    return f"dv[{s * k_dirs} + k]"


def _tangent_entry(P: _Program, rule: _rules.Rule | None, i: str, x: str, y: str,
                   need: int, dx: str, dy: str, k_dirs: int) -> str:
    """One entry's partials and tangents (value, partials) in k_dirs directions."""
    if rule is None:       # a select: x, y its operands' tangents' sources, condition in need
        return ""
    name = rule.name
    q = []
    for k in (0, 1):
        if not need >> k & 1 or k >= rule.arity:
            q.append("0.0")
            continue
        c = _expr.constant(rule.partials[k])
        q.append(_literal(c) if c is not None else f"easyad_{name}_d{k}(x, y, z)")
    t0 = f"easyad_{name}_t0(x, y, z, dx, dy, dz)" if need & 1 else "0.0"
    t1 = f"easyad_{name}_t1(x, y, z, dx, dy, dz)" if need & 2 and rule.arity > 1 else "0.0"
    return (f"{{ const double x = {x}, y = {y}, z = v[{i}]; (void)x; (void)y; (void)z; "
            f"const double q0 = {q[0]}, q1 = {q[1]}; p0[{i}] = q0; p1[{i}] = q1; "
            f"for (k = 0; k < {k_dirs}; k++) {{ const double dx = {dx if need & 1 else '0.0'}, "
            f"dy = {dy if need & 2 else '0.0'}; (void)dx; (void)dy; "
            f"const double dz = mul0(q0, dx) + mul0(q1, dy); dv[({i}) * {k_dirs} + k] = dz; "
            f"dp0[({i}) * {k_dirs} + k] = {t0}; dp1[({i}) * {k_dirs} + k] = {t1}; }} }}")


def _tangent_run(P: _Program, run: tuple[int, ...], Lo: int, ancestors: np.ndarray,
                 k_dirs: int) -> list[str]:
    lo, hi, op, need, affine, base0, base1 = run
    hi = min(hi, Lo)
    if not ancestors[lo:hi].any():
        return []
    if op == 0:
        lines = []
        for i in range(lo, hi):
            if not ancestors[i]:
                continue
            code = int(P.ops[i])
            if code == _SELECT:
                c = _tapeview.select_condition(i)
                a, b = int(P.arg0[i]), int(P.arg1[i])
                dx = _tan(P, a, k_dirs) if a >= 0 else "0.0"
                dy = _tan(P, b, k_dirs) if b >= 0 else "0.0"
                lines.append(
                    f"    {{ const double q0 = (v[{c}] != 0.0) ? 1.0 : 0.0, q1 = (v[{c}] != 0.0)"
                    f" ? 0.0 : 1.0; p0[{i}] = q0; p1[{i}] = q1; for (k = 0; k < {k_dirs}; k++)"
                    f" {{ const double dx = {dx}, dy = {dy}; const double dz = mul0(q0, dx) + "
                    f"mul0(q1, dy); dv[{i * k_dirs} + k] = dz; dp0[{i * k_dirs} + k] = 0.0; "
                    f"dp1[{i * k_dirs} + k] = 0.0; }} }}\n")
            else:                      # comparisons: no tangents, partials 0
                lines.append(f"    p0[{i}] = 0.0; p1[{i}] = 0.0; for (k = 0; k < {k_dirs}; "
                             f"k++) {{ dv[{i * k_dirs} + k] = 0.0; dp0[{i * k_dirs} + k] = 0.0; "
                             f"dp1[{i * k_dirs} + k] = 0.0; }}\n")
        return lines
    rule = _RULE_OF[op]
    if affine:
        s0, s1 = (affine >> 1) & 1, affine >> 2
        x = P.strided(base0, s0, bool(need & 1))
        y = _exponent(op, P.strided(base1, s1, bool(need & 2)))
        dx = _tan(P, base0, k_dirs, s0)
        dy = _tan(P, base1, k_dirs, s1)
        body = _tangent_entry(P, rule, f"{lo} + j", x, y, need, dx, dy, k_dirs)
        return [f"    for (j = 0; j < {hi - lo}; j++) {body}\n"]
    lines = []
    for i in range(lo, hi):
        if not ancestors[i]:
            continue
        s0, s1 = int(P.slot0[i]), int(P.slot1[i])
        lines.append("    " + _tangent_entry(P, rule, str(i), P.operand(s0),
                                             _exponent(op, P.operand(s1)),
                                             need, _tan(P, s0, k_dirs), _tan(P, s1, k_dirs),
                                             k_dirs) + "\n")
    return lines


def _tangent_adjoint_run(P: _Program, run: tuple[int, ...], Lo: int, ancestors: np.ndarray,
                         k_dirs: int) -> list[str]:
    """The adjoints' tangents of a run's entries, in reverse position order (the VM's)."""
    lo, hi, op, need, affine, base0, base1 = run
    hi = min(hi, Lo)
    if not ancestors[lo:hi].any():
        return []

    def body(i: str, a: str | None, b: str | None) -> str:
        adds = []
        for target, k in ((a, 0), (b, 1)):
            if target is not None:
                adds.append(f"dadj[({target}) * {k_dirs} + k] += mul0(dp{k}[({i}) * {k_dirs} + k],"
                            f" g) + mul0(q{k}, q);")
        if not adds:
            return ""
        return (f"{{ const double g = 0.0 + a[{i}], q0 = p0[{i}], q1 = p1[{i}]; (void)q0; "
                f"(void)q1; for (k = 0; k < {k_dirs}; k++) {{ const double q = "
                f"dadj[({i}) * {k_dirs} + k]; {' '.join(adds)} }} }}")

    if op != 0 and affine:
        s0, s1 = (affine >> 1) & 1, affine >> 2
        a = (f"{base0} + j" if s0 else str(base0)) if need & 1 else None
        b = (f"{base1} + j" if s1 else str(base1)) if need & 2 else None
        text = body(f"{lo} + j", a, b)
        return [f"    for (j = {hi - lo - 1}; j >= 0; j--) {text}\n"] if text else []
    lines = []
    for i in range(hi - 1, lo - 1, -1):
        if not ancestors[i]:
            continue
        if op == 0 and int(P.ops[i]) != _SELECT:
            continue                   # comparisons: adjoint and its tangent stay 0
        a0, a1 = int(P.arg0[i]), int(P.arg1[i])
        text = body(str(i), str(a0) if a0 >= 0 else None, str(a1) if a1 >= 0 else None)
        if text:
            lines.append(f"    {text}\n")
    return lines


def _gather(to: str, targets: list[int], frm: str, sources: list[int] | None = None
            ) -> list[str]:
    """to[targets[k]] = frm[sources[k]] (sources: 0, 1, ...), as one memcpy where both run
    in steps of one."""
    sources = list(range(len(targets))) if sources is None else sources
    if not targets:
        return []
    if targets == list(range(targets[0], targets[0] + len(targets))) and \
            sources == list(range(sources[0], sources[0] + len(sources))):
        return [f"    memcpy(&{to}[{targets[0]}], &{frm}[{sources[0]}], "
                f"{len(targets)} * sizeof(double));\n"]
    return [f"    {to}[{t}] = {frm}[{s}];\n" for t, s in zip(targets, sources)]


def _chunks(lines: list[str]) -> list[str]:
    """Statements grouped into functions of at most _CHUNK (one at least)."""
    return ["".join(lines[k:k + _CHUNK]) for k in range(0, max(1, len(lines)), _CHUNK)]


class _Adjoints:
    """The reverse sweep's statements, in the VM's order (so sums round alike). An adjoint
    slot's first contribution is stored (``a[t] = t``), later ones added (``a[t] += t``),
    so no memset is needed; an entry nothing has written to has adjoint 0 and is skipped,
    as the VM skips it. The VM adds the first contribution to a zeroed slot, which turns a
    -0.0 into +0.0: here a zero adjoint may keep its sign, which only ever reaches the
    sign of a zero (adjoints are multiplied by partials, through mul0, and summed), and the
    gradient is read out as ``0.0 + a[p]``, the VM's +0.0.

    Adjoints known when rendering (the output's 1.0, sums' and differences' copies of it,
    products with constants: Rosenbrock's running total and its 100 * ...) are not stored
    but kept here (``known``, computed in Python as the C would: IEEE doubles, the same
    operations in the same order) and written into the code as literals; a slot is stored
    (``settle``) only where code reads it from memory."""

    def __init__(self, P: _Program, output: int) -> None:
        self.written = np.zeros(P.L + 1, dtype=bool)
        self.known: dict[int, float] = {output: 1.0}
        self.lines: list[str] = []
        self.written[output] = True

    def g(self, i: int) -> str:
        """The adjoint of slot i as C: its literal where known."""
        return _literal(self.known[i]) if i in self.known else f"a[{i}]"

    def add(self, target: int, term: str, value: float | None = None) -> str:
        """target's adjoint grows by term (value: the term's number, where known)."""
        if target in self.known:
            if value is not None:
                self.known[target] = self.known[target] + value
                return ""
            return f"a[{target}] = {_literal(self.known.pop(target))} + {term};"
        if self.written[target]:
            return f"a[{target}] += {_literal(value) if value is not None else term};"
        self.written[target] = True
        if value is not None:
            self.known[target] = value
            return ""
        return f"a[{target}] = {term};"

    def settle(self, targets: range | list[int]) -> None:
        """Slots code reads or adds to in memory: stored (0 where not written yet)."""
        for t in targets:
            if t in self.known:
                self.lines.append(f"    a[{t}] = {_literal(self.known.pop(t))};\n")
            elif not self.written[t]:
                self.lines.append(f"    a[{t}] = 0.0;\n")
                self.written[t] = True

    zero = settle

    def segments(self, lo: int, hi: int, most: int = 8) -> list[tuple[int, int, float | None]]:
        """[lo, hi) cut into pieces, last first, of one known adjoint each (an unwritten
        slot's is 0) or none known (None: read from a[]); at most ``most`` pieces, else
        the whole span stored and read."""
        pieces: list[tuple[int, int, float | None]] = []
        for i in range(hi - 1, lo - 1, -1):
            c = self.known.get(i, None if self.written[i] else 0.0)
            bits = None if c is None else struct.pack("<d", c)
            if pieces and pieces[-1][2] == bits:
                pieces[-1] = (i, pieces[-1][1], bits)
            else:
                pieces.append((i, i + 1, bits))
        if len(pieces) > most:
            self.settle(range(lo, hi))
            return [(lo, hi, None)]
        self.settle([i for p in pieces if p[2] is None for i in range(p[0], p[1])])
        return [(s, e, None if b is None else struct.unpack("<d", b)[0]) for s, e, b in pieces]


_FREE = frozenset(_OP[k] for k in ("add", "sub", "neg"))


def _dead_runs(P: _Program, runs: list[tuple[int, ...]]) -> list[bool]:
    """The VM's run_dead (``_dead_runs`` of layout.pxi): runs of sums, differences and
    negations whose values nothing reads but other such entries (no partial, guard,
    select or comparison): a gradient without its value needs none of them, and their
    rules raise no errors."""
    ops, a0, a1 = P.ops.tolist(), P.arg0.tolist(), P.arg1.tolist()
    wanted = [False] * (P.L + 1)
    for i in range(P.L - 1, int(P.first) - 1, -1):
        if wanted[i] or ops[i] not in _FREE:
            if a0[i] >= 0:
                wanted[a0[i]] = True
            if a1[i] >= 0:
                wanted[a1[i]] = True
            if ops[i] == _SELECT:
                wanted[_tapeview.select_condition(i)] = True
    return [run[2] != 0 and all(ops[i] in _FREE and not wanted[i]
                                for i in range(run[0], run[1])) for run in runs]


def _ancestors(P: _Program, output: int) -> np.ndarray:
    """Positions the output reads (itself included): the reverse sweep visits only them."""
    live = np.zeros(P.L + 1, dtype=bool)
    if output < P.L:
        live[output] = True
    ops, a0, a1 = P.ops.tolist(), P.arg0.tolist(), P.arg1.tolist()
    for i in range(P.L - 1, -1, -1):
        if not live[i]:
            continue
        if a0[i] >= 0:
            live[a0[i]] = True
        if a1[i] >= 0:
            live[a1[i]] = True
        if ops[i] == _SELECT:
            live[_tapeview.select_condition(i)] = True
    return live


def _forward_run(P: _Program, run: tuple[int, ...]) -> list[str]:
    lo, hi, op, need, affine, base0, base1 = run
    if op == 0:
        return [_structural(P, i) for i in range(lo, hi)]
    rule = _RULE_OF[op]
    name = rule.name
    checked = rule.errors != _rules.NO_CHECK
    status = f"easyad_rule_status(EASYAD_OP_{name.upper()}, x, y, z)"
    indexed = None if affine or hi - lo < _INDEXED else _indexed(P, lo, hi)
    if affine or indexed:
        if indexed:
            x, y = indexed
        else:
            x = P.strided(base0, (affine >> 1) & 1, bool(need & 1))
            y = P.strided(base1, affine >> 2, bool(need & 2))
        y = _exponent(op, y)
        fast, start, chain = [x, y], "", ""
        for k, slots in enumerate((P.slot0[lo:hi], P.slot1[lo:hi]) if indexed else ()):
            if (slots[1:] == np.arange(lo, hi - 1)).all():
                # a chain (each entry reads the one before: s = s + t) keeps its running
                # value in a register, not a store and a load per entry
                start, chain = f"double run = {P.operand(int(slots[0]))}; ", " run = z;"
                fast[k] = "run"
                break
        check = " bad = (z - z == 0.0) ? bad : 1.0;" if checked else ""
        loop = (f"{start}for (j = 0; j < {hi - lo}; j++) {{ const double x = {fast[0]}, "
                f"y = {fast[1]}; (void)y; const double z = easyad_{name}_value(x, y); "
                f"v[{lo} + j] = z;{chain}{check} }}")
        if not checked:
            return [f"    {{ {loop} }}\n"]
        # errors show as non-finite values: their status is looked at only then
        return [f"    {{ double bad = 0.0; {loop}\n"
                f"      if (bad != 0.0) for (j = 0; j < {hi - lo}; j++) {{ const double x = {x},"
                f" y = {y}; (void)y; const double z = v[{lo} + j]; if (!isfinite(z) && "
                f"{status}) flags |= 2; }} }}\n"]
    lines = []
    for i in range(lo, hi):
        x = P.operand(int(P.slot0[i]))
        y = _exponent(op, P.operand(int(P.slot1[i])))
        line = f"    {{ const double x = {x}, y = {y}; (void)y; const double z = " \
               f"easyad_{name}_value(x, y); v[{i}] = z;"
        if checked:
            line += f" if (!isfinite(z) && {status}) flags |= 2;"
        lines.append(line + " }\n")
    return lines


# a number the C compiler cannot see through (an empty asm that may change it): it stays
# an argument of the call it is passed to
_KEEP = """#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define EASYAD_KEEP_IN "+x"
#elif defined(__GNUC__) && defined(__aarch64__)
#define EASYAD_KEEP_IN "+w"
#endif
static inline double easyad_keep(double v) {
#ifdef EASYAD_KEEP_IN
    __asm__("" : EASYAD_KEEP_IN(v));
#else
    volatile double k = v; v = k;
#endif
    return v;
}
"""
_EXACT_EXPONENTS = frozenset(_literal(c) for c in (0.0, 1.0, 2.0))


def _exponent(op: int, text: str) -> str:
    """pow's exponent as C: a constant other than 0, 1 and 2 (which the table's pow
    tests for and computes exactly) behind ``easyad_keep``, so gcc cannot rewrite the
    call (pow(x, 0.5) into sqrt(x), pow(x, -1) into 1 / x): those round differently
    from libm's pow, which the VM calls."""
    if op != _OP["pow"] or not _constant_text(text) or text in _EXACT_EXPONENTS:
        return text
    return f"easyad_keep({text})"


def _constant_text(text: str) -> bool:
    """Whether an operand's C is a constant: a literal or an entry of the constants
    table ``K[...]``."""
    return text.startswith("K[") or is_literal(text)


_INDEXED = 32     # entries from which a run that is not affine is a loop over index arrays


def _indexed(P: _Program, lo: int, hi: int) -> tuple[str, str] | None:
    """The operands of the entries [lo, hi) as C at ``j`` read through index arrays
    declared at file scope (``P.decls``), or None where an operand mixes entries and
    constants. A long run that is not affine (Rosenbrock's running sum) then compiles as
    one loop (its data a table) rather than a statement per entry: gcc's time grows with
    the statements, and the loop runs as fast (a chain waits on its sums either way)."""
    operands = []
    for slots in (P.slot0[lo:hi], P.slot1[lo:hi]):
        slots = [int(s) for s in slots]
        if all(s >= P.L for s in slots) and len(set(slots)) == 1:
            operands.append(_literal(float(P.constants[slots[0] - P.L])))
            continue
        if all(s < P.L for s in slots):
            array, offset = "v", 0
        elif all(s >= P.L for s in slots):
            array, offset = "K", P.L
        else:
            return None
        name = f"I{len(P.decls)}"
        P.decls.append(f"static const int32_t {name}[{len(slots)}] = "
                       f"{{{','.join(str(s - offset) for s in slots)}}};\n")
        operands.append(f"{array}[{name}[j]]")
    return operands[0], operands[1]


def _structural(P: _Program, i: int) -> str:
    op = int(P.ops[i])
    x = P.operand(int(P.slot0[i]))
    y = P.operand(int(P.slot1[i]))
    if op == _SELECT:
        c = _tapeview.select_condition(i)
        return f"    v[{i}] = (v[{c}] != 0.0) ? {x} : {y};\n"
    if op in _COMPARE:
        return f"    v[{i}] = ({x} {_COMPARE[op]} {y}) ? 1.0 : 0.0;\n"
    if op in _GUARD:
        was = "1.0" if P.values[i] != 0.0 else "0.0"
        return (f"    v[{i}] = ({x} {_GUARD[op]} {y}) ? 1.0 : 0.0; "
                f"if (v[{i}] != {was}) flags |= 1;\n")
    raise ValueError(f"entry {i} ({_rules.OPCODE_NAMES[op]}) cannot be compiled")


def _contribution(rule: _rules.Rule, k: int, call: str) -> str | None:
    """What operand k's adjoint grows by: the table's constant partial as written, any
    other through mul0 (the strong zero), None for a 0 partial."""
    c = _fixed_partial(rule.name, k)
    if c == 0.0:
        return None
    if c is None:
        return f"mul0({call}, g)"
    if c == 1.0:
        return "g"
    if c == -1.0:
        return "-g"
    return f"{_literal(c)} * g"


@functools.lru_cache(maxsize=None)
def _fixed_partial(name: str, k: int) -> float | None:
    """The table's partial k of a rule where it is a number (0 past its arity), else None."""
    rule = _rules.RULES_BY_NAME[name]
    return _expr.constant(rule.partials[k]) if k < rule.arity else 0.0


def _mul0(p: float, g: float) -> float:
    """mul0 of _helpers.h on numbers: C's double product, the strong zero first."""
    return 0.0 if p == 0.0 or g == 0.0 else p * g


def _known_term(rule: _rules.Rule, k: int, operands: tuple[float | None, float | None],
                g: float | None) -> float | None:
    """Operand k's contribution (``_contribution``) as a number, where the adjoint g is
    known and the partial is a constant of the table or an operand that is a constant
    (x * y's partials: y and x)."""
    if g is None or k >= rule.arity:
        return None
    c = _fixed_partial(rule.name, k)
    if c is not None:
        return g if c == 1.0 else -g if c == -1.0 else c * g
    name = rule.partials[k].strip()
    if name in ("x", "y") and operands["xy".index(name)] is not None:
        return _mul0(operands["xy".index(name)], g)   # type: ignore[arg-type]
    return None


def _reverse_run(P: _Program, run: tuple[int, ...], ancestors: np.ndarray,
                 A: _Adjoints) -> None:
    lo, hi, op, need, affine, base0, base1 = run
    if not ancestors[lo:hi].any() or not A.written[lo:hi].any():
        return
    if op == 0:
        for i in range(hi - 1, lo - 1, -1):
            if ancestors[i] and A.written[i] and int(P.ops[i]) == _SELECT:
                c = _tapeview.select_condition(i)
                a, b = int(P.arg0[i]), int(P.arg1[i])
                A.settle([i])
                A.settle(range(a, a + 1) if a >= 0 else range(0))
                A.settle(range(b, b + 1) if b >= 0 else range(0))
                take = [f"a[{a}] += a[{i}];" if a >= 0 else ";",
                        f"a[{b}] += a[{i}];" if b >= 0 else ";"]
                A.lines.append(f"    if (v[{c}] != 0.0) {{ {take[0]} }} else {{ {take[1]} }}\n")
        return
    rule = _RULE_OF[op]
    name = rule.name
    if affine:
        strides = ((affine >> 1) & 1, affine >> 2)
        fixed = tuple(None if strides[k] or base < P.L else float(P.constants[base - P.L])
                      for k, base in ((0, base0), (1, base1)))
        for start, stop, known in A.segments(lo, hi):
            shifted = (base0 + (start - lo) * strides[0], base1 + (start - lo) * strides[1])
            _reverse_affine(P, rule, name, need, strides, shifted, start, stop, fixed, known, A)
        return
    for i in range(hi - 1, lo - 1, -1):
        if not (ancestors[i] and A.written[i]):
            continue
        args = (int(P.arg0[i]), int(P.arg1[i]))
        slots = (int(P.slot0[i]), int(P.slot1[i]))
        x = P.operand(slots[0])
        y = _exponent(op, P.operand(slots[1]))
        fixed = tuple(float(P.constants[s - P.L]) if s >= P.L else None for s in slots)
        g = A.known.get(i)
        body = []
        for k in (0, 1):
            if args[k] < 0:
                continue
            t = _contribution(rule, k, f"easyad_{name}_d{k}({x}, {y}, v[{i}])")
            if t is not None:
                body.append(A.add(args[k], t, _known_term(rule, k, fixed, g)))
        body = [b for b in body if b]
        if body:
            A.lines.append(f"    {{ const double g = {A.g(i)}; {' '.join(body)} }}\n")


def _reverse_affine(P: _Program, rule: _rules.Rule, name: str, need: int,
                    strides: tuple[int, int], bases: tuple[int, int], lo: int, hi: int,
                    fixed: tuple[float | None, ...], known: float | None,
                    A: _Adjoints) -> None:
    """One piece [lo, hi) of an affine run's reverse loop, its adjoint read from a[] or
    (known) one literal; bases: the operands' first slots at this piece's start."""
    g = f"a[{lo} + j]" if known is None else _literal(known)
    terms = {k: _contribution(rule, k, f"easyad_{name}_d{k}(x, y, z)")
             for k in (0, 1) if need >> k & 1}
    values = {k: _known_term(rule, k, fixed, known) for k in terms}
    spans = {k: range(bases[k], bases[k] + (hi - lo)) if strides[k] else
             range(bases[k], bases[k] + 1)
             for k in (0, 1) if terms.get(k) is not None}
    apart = len(spans) < 2 or spans[0].stop <= spans[1].start \
        or spans[1].stop <= spans[0].start
    body = []
    for k in (0, 1):
        t = terms.get(k)
        if t is None:
            continue
        span = spans[k]
        fresh = not A.written[span.start:span.stop].any()
        if strides[k] and fresh and apart:
            if values[k] is not None:      # known: one number for the whole span
                for s in span:
                    A.add(s, t, values[k])
                continue
            body.append(f"a[{bases[k]} + j] = {t};")
            A.written[span.start:span.stop] = True
        else:
            A.settle(span)
            body.append(f"a[{bases[k]} + j] += {t};" if strides[k] else f"a[{bases[k]}] += {t};")
    if not body:
        return
    xs = P.strided(bases[0], strides[0], True)
    ys = _exponent(_OP[name], P.strided(bases[1], strides[1], True))
    A.lines.append(f"    for (j = {hi - lo - 1}; j >= 0; j--) {{ const double g = {g}, "
                   f"x = {xs}, y = {ys}, z = v[{lo} + j]; (void)g; (void)x; (void)y; "
                   f"(void)z; {' '.join(body)} }}\n")


# ---- build: compile, cache, load ----

_TIMEOUT_S = 300.0          # default EASYAD_COMPILE_TIMEOUT: a compile that runs longer
                            # is stopped and the VM goes on
_MAX_ENTRIES = 200_000      # default EASYAD_COMPILE_MAX_ENTRIES: bigger programs stay in
                            # the VM (gcc's time and memory grow too fast beyond)
_MEMORY_MB = 4096           # default EASYAD_COMPILE_MEMORY_MB: the compiler's address space
_NOTICE_S = 10.0            # compiles expected to take longer are announced first
_BIG_SOURCE = 4_000_000     # bytes of C from which -O1 too (second-order code is long)
# gcc's seconds per MB of C on one idle core (measured: gradients 10-11 at -O3, 6 at -O1,
# Hessians 15-36 at -O3, 9 at -O1): for the notice, an estimate
_SECONDS_PER_MB = {"-O3": 20.0, "-O1": 8.0}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)
_WHO = {"function": ("Function.compile()", "replay goes on in the VM"),
        "tensor": ("tensor replay (fused C)", "the program runs unfused, step by step")}
_log = logging.getLogger("easyad")


class _Refusal(Exception):
    """Why this compile cannot go on: a reason (one warning each per process) and the
    warning's text (without who and fallback)."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


def _setting(name: str, default: float) -> float:
    """A positive number from the environment, else the default (with a warning)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
        if value > 0 and math.isfinite(value):
            return value
    except ValueError:
        pass
    _warn_once(f"setting {name}={text}", f"${name}={text!r} is not a positive number; "
               f"using {default:g}. Set it to a number (or unset it).")
    return default


def _compiler_argv() -> tuple[list[str] | None, str]:
    """The compiler command, or None and why not (the warning's text)."""
    text = os.environ.get("CC")
    where = "$CC"
    if not text:
        text, where = sysconfig.get_config_var("CC") or "cc", "Python's build configuration"
    try:
        argv = shlex.split(text)
    except ValueError as error:
        return None, (f"the C compiler command {text!r} (from {where}) cannot be read "
                      f"({error}). Fix its quoting (e.g. CC=gcc, or CC=\"ccache gcc\") or "
                      f"unset CC.")
    if not argv or shutil.which(argv[0]) is None:
        return None, (f"no C compiler found (looked for {text!r}, from {where}). Install "
                      f"one (gcc or clang: apt install gcc, dnf install gcc, xcode-select "
                      f"--install) or point $CC at it.")
    return argv, ""


def compiler() -> list[str] | None:
    """The C compiler command: $CC, else the one Python was built with, else cc; None
    when it is not found on PATH or cannot be read (unbalanced quotes)."""
    return _compiler_argv()[0]


@functools.lru_cache(maxsize=16)
def _compiler_identity(argv: tuple[str, ...]) -> str:
    """What the compiler is (its resolved path and ``--version``), once per process: the
    cache key changes when the compiler does."""
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL, text=True, errors="replace")
        said = f"{done.stdout}\nexit {done.returncode}"
    except (OSError, subprocess.SubprocessError) as error:
        said = f"unknown ({type(error).__name__})"
    return f"{os.path.realpath(shutil.which(argv[0]) or argv[0])}\n{said}"


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """What -march=native means here: the CPU's model and flags (Linux), else the
    processor's name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            lines = {line for line in handle
                     if line.startswith(("flags", "model name", "Features"))}
        return "".join(sorted(lines))
    except OSError:
        return platform.processor()


def _header_folders() -> list[str]:
    """Where the headers the rendered C includes are: easyad's folder, its _generated."""
    return [_HERE, os.path.join(_HERE, "_generated")]


def _included(source: str) -> tuple[list[str], list[tuple[str, bytes]]]:
    """The -I flags and every header the source includes with quotes, followed through
    the headers' own includes (names and contents: the cache key covers them, so a
    changed rule gives a new shared object)."""
    folders = _header_folders()
    found: dict[str, bytes] = {}
    pending = _INCLUDE.findall(source)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        for folder in folders:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[name] = handle.read()
                break
        else:
            raise _Refusal("headers", f"easyad's C header {name} is not installed beside it "
                           f"(looked in {', '.join(folders)}). Reinstall easyad from its "
                           f"source.")
        pending += _INCLUDE.findall(found[name].decode("utf-8", "replace"))
    return [f"-I{folder}" for folder in folders], sorted(found.items())


def _key(source: str, headers: list[tuple[str, bytes]], argv: list[str], flags: list[str],
         native: bool) -> str:
    """The cache name: a hash of everything that changes the shared object."""
    digest = hashlib.sha256()
    for part in [str(_FORMAT), __version__, source, " ".join(argv),
                 _compiler_identity(tuple(argv)), " ".join(flags), platform.machine(),
                 _cpu() if native else "", sys.platform, sys.implementation.cache_tag or "",
                 *(os.environ.get(v, "") for v in ("CPATH", "C_INCLUDE_PATH",
                                                    "GCC_EXEC_PREFIX", "COMPILER_PATH"))]:
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for name, text in headers:
        digest.update(name.encode() + b"\0" + hashlib.sha256(text).digest())
    return "easyad-" + digest.hexdigest()[:32]


def _verified(folder: str, name: str) -> bool:
    """Whether folder/name.so is the shared object this user compiled: its sha256 and size
    as recorded beside it (name.sha256) when it was written. Anything else (missing,
    truncated, empty, damaged, planted, a link, another user's) is never loaded: the
    caller compiles it again, over it."""
    try:
        recorded = _cache.read_private(os.path.join(folder, name + ".sha256")).split()
        data = _cache.read_private(os.path.join(folder, name + ".so"))
    except OSError:
        return False
    return len(recorded) == 2 and len(data) > 0 and recorded[1] == str(len(data)).encode() \
        and recorded[0] == hashlib.sha256(data).hexdigest().encode()


def build(source: str, entries: int, extra: tuple[str, ...] = (), purpose: str = "function"
          ) -> str | None:
    """The path of the shared object compiled from source (from the cache when there and
    verified), or None, with one CompilerWarning, when it cannot be compiled or cached:
    no compiler, a $CC that cannot be read, a compiler that fails, runs out of memory or
    time, a program too big, a cache folder that is unsafe or cannot be written. Never
    raises for those. ``extra``: more flags (tried first; the build is tried again
    without them if the compiler refuses). ``purpose``: "function" or "tensor" (the
    warning's wording)."""
    who, fallback = _WHO[purpose]
    try:
        return _build(source, entries, extra, who)
    except _Refusal as refusal:
        reason, text = refusal.reason, str(refusal)
    except _cache.CacheError as error:
        reason, text = "cache", f"the compile cache is not used: {error}."
    except OSError as error:     # a folder or file of the cache that cannot be written
        place = getattr(error, "filename", None) or _cache.root()
        reason = "cache"
        text = (f"the compile cache cannot be used ({error.strerror or error}: {place}). "
                f"Make it writable, or point $EASYAD_CACHE_DIR at a folder of your own.")
    _warn_once(reason, f"{who}: {text} Meanwhile {fallback}.")
    return None


def _build(source: str, entries: int, extra: tuple[str, ...], who: str) -> str | None:
    argv, problem = _compiler_argv()
    if argv is None:
        raise _Refusal("compiler", problem)
    limit = _setting("EASYAD_COMPILE_MAX_ENTRIES", _MAX_ENTRIES)
    if entries > limit:
        raise _Refusal("size", f"the program has {entries:,} entries, more than "
                       f"$EASYAD_COMPILE_MAX_ENTRIES ({limit:,.0f}), above which the C "
                       f"compiler takes minutes and gigabytes. Raise the limit to compile it "
                       f"anyway.")
    includes, headers = _included(source)
    folder = _cache.private_directory("compiled")
    big = entries >= _BIG or len(source) >= _BIG_SOURCE
    level = ["-O1", "-ftree-loop-vectorize"] if big else ["-O3"]
    choices = []
    tries = [(True, extra)] + ([(True, ())] if extra else []) + [(False, ())]
    for native, more in tries:
        flags = [*level, *_FLAGS, *more, *([_NATIVE] if native else [])]
        name = _key(source, headers, argv, flags, native)
        target = os.path.join(folder, name + ".so")
        if target in _loaded or _verified(folder, name):
            return target
        choices.append((flags, name))
    timeout = _setting("EASYAD_COMPILE_TIMEOUT", _TIMEOUT_S)
    expected = len(source) / 1e6 * _SECONDS_PER_MB[level[0]]
    if expected >= _NOTICE_S:
        _log.warning("easyad: %s compiles a program of %s entries to C: about %.0f s on one "
                     "core (stopped after $EASYAD_COMPILE_TIMEOUT = %g s; cached for next "
                     "time) ...", who, f"{entries:,}", expected, timeout)
    refused: list[str] = []
    deadline = time.monotonic() + timeout   # for all tries together
    for flags, name in choices:
        if _compile(argv, flags, includes, source, folder, name, timeout, deadline, refused):
            return os.path.join(folder, name + ".so")
        if refused[-1] == "ran":     # the compiler could not run at all, or timed out
            break
    raise _Refusal("failed", refused[0])


def _run(command: list[str], cwd: str, timeout: float) -> tuple[int, str]:
    """Run the compiler in a session of its own, its address space bounded
    (EASYAD_COMPILE_MEMORY_MB, by the shell's ulimit, so no Python runs between fork and
    exec), the whole group killed at the timeout (gcc's cc1 is a grandchild)."""
    memory = int(_setting("EASYAD_COMPILE_MEMORY_MB", _MEMORY_MB))
    if os.name == "posix" and os.path.exists("/bin/sh"):
        command = ["/bin/sh", "-c", 'ulimit -v "$1" 2>/dev/null; shift; exec "$@"', "sh",
                   str(memory * 1024), *command]
    process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", start_new_session=os.name == "posix")
    try:
        _, said = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if os.name == "posix":
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
        process.kill()
        process.communicate()
        raise
    return process.returncode, said


def _compile(argv: list[str], flags: list[str], includes: list[str], source: str,
             folder: str, name: str, timeout: float, deadline: float,
             refused: list[str]) -> bool:
    """Compile source into folder/name.so, with its sha256 beside it (each written to a
    temporary name, flushed and renamed: another process finds the whole file or none);
    False, with the reason added to refused, if the compiler fails ("ran" last where it
    could not run or ran out of time)."""
    work = tempfile.mkdtemp(prefix=".build-", dir=folder)
    try:
        with open(os.path.join(work, "program.c"), "w", encoding="utf-8") as handle:
            handle.write(source)
        # relative names: the object holds no temporary path, so builds are identical
        command = [*argv, *flags, *includes, "program.c", "-o", "program.so", "-lm"]
        try:
            code, said = _run(command, work, max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            refused += [f"the C compiler {argv[0]!r} did not finish within {timeout:g} s "
                        f"(the program is too big to compile in that time). Raise "
                        f"$EASYAD_COMPILE_TIMEOUT to let it finish.", "ran"]
            return False
        except (OSError, subprocess.SubprocessError) as error:
            refused += [f"the C compiler {argv[0]!r} could not run ({error}). Install gcc "
                        f"or clang, or point $CC at a working one.", "ran"]
            return False
        built = os.path.join(work, "program.so")
        if code != 0 or not os.path.isfile(built):
            how = f"exit {code}"
            if code < 0:
                how = f"killed by {signal.Signals(-code).name}" \
                    if -code in signal.valid_signals() else f"killed by signal {-code}"
            if code == -signal.SIGKILL or "memory" in said or "Killed signal" in said:
                how += "; out of memory? raise $EASYAD_COMPILE_MEMORY_MB"
            said = f": {said.strip()[:500]}" if said.strip() else ""
            refused.append(f"the C compiler {argv[0]!r} failed ({how}){said}. Install a "
                           f"working gcc or clang, or point $CC at one.")
            return False
        with open(built, "rb") as handle:
            data = handle.read()
        _cache.write_atomic(folder, name + ".c", source.encode("utf-8"))  # for reading
        _cache.write_atomic(folder, name + ".so", data, mode=0o700)
        _cache.write_atomic(folder, name + ".sha256",
                            f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode())
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load(path: str, purpose: str = "function") -> Any:
    """The shared object at path (a path ``build`` returned), loaded once per process; None,
    with one CompilerWarning, where the loader refuses it."""
    with _lock:
        library = _loaded.get(path)
        if library is None:
            try:
                library = _loaded[path] = ctypes.CDLL(path)
            except OSError as error:
                who, fallback = _WHO[purpose]
                _warn_once("load", f"{who}: the compiled program {path} cannot be loaded "
                           f"({error}). Delete the folder to clear the cache. Meanwhile "
                           f"{fallback}.")
                return None
        return library


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
    path = build(source, int(layout["length"]))
    library = None if path is None else load(path)
    if library is None:
        return None

    def address(name: str) -> int:
        return int(ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0)

    K = 1 if seeds is None else int(seeds.shape[1])
    second = {} if seeds is None and not hvp else dict(
        hessian=address("easyad_native_hessian"), hvp=address("easyad_native_hvp"),
        colours=K, second_work_size=second_work_size(layout, max(1, K)))
    return _core._Native(library, address("easyad_native_value"),
                         address("easyad_native_gradient"), address("easyad_native_rows"),
                         len(inputs), len(outputs), 2 * int(layout["length"]) + 1, **second)


__all__ = ["optimise", "second_order_program", "render", "render_second", "second_work_size",
           "build", "load", "compiler", "native"]

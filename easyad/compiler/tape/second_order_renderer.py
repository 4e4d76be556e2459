"""Second order as C (``render_second``): the VM's forward-over-reverse sweep
(``_second_order_row``), appended to ``render``'s source: the tangents entry by entry, a
call each to one step function per (rule, operands needed), and the adjoints' tangents as
loops over tables of rows. gcc's time grows with the statements: a ~340-entry program as a
statement and a K-direction loop per entry took 12-18 s of gcc at -O3, ~2 s so, and its
Hessian runs as fast (the rows' loops vectorized). The HVP (one direction) of a program
with few entries outside affine runs (``INLINE_HVP``) is written entry by entry instead:
a step call and a row-table load per entry cost it ~1.3x per call at n = 10."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _expr, _rules, _tapeview
from easyad.compiler.cstyle import CStyleRenderer
from easyad.compiler.dialect import C, Dialect
from easyad.compiler.tape.layout import Layout, chunks, output_ancestors, pow_exponent
from easyad.compiler.tape.opcodes import RULE_OF, SELECT_OP


# entries (outside affine runs) up to which the HVP is written entry by entry, inline (as
# before the steps and row loops, which cost it a call per entry); gcc's time grows with
# the statements (a 330-entry random program: 2.9 -> 7.6 s), so bigger programs keep them
INLINE_HVP = 32


class SecondOrderRenderer(CStyleRenderer):
    """The Hessian's and HVP's C (``render_second``), written through the one renderer's
    statements and its dialect; the functions below are its parts, given it as ``r``."""

    def render_second(self, layout: dict[str, Any], seeds: np.ndarray | None,
                      n_rev: int) -> str:
        return _render_second(self, layout, seeds, n_rev)


def render_second(layout: dict[str, Any], seeds: np.ndarray | None, n_rev: int,
                  dialect: Dialect = C) -> str:
    """``SecondOrderRenderer(dialect).render_second``: see ``_render_second``."""
    return SecondOrderRenderer(dialect).render_second(layout, seeds, n_rev)


def _render_second(r: CStyleRenderer, layout: dict[str, Any], seeds: np.ndarray | None,
                   n_rev: int) -> str:
    """C of the Hessian and the HVP, appended to ``render``'s source (which defines
    ``forward``, ``rev*`` and includes the headers): the VM's forward-over-reverse sweep
    (``_second_order_row``, ``easyad_rule_tangents_run``) as C (``Steps``, ``_row_loops``;
    affine runs as loops). Tangents
    of values and partials in K directions, entry by entry in the layout's order, the
    adjoints' tangents in reverse position order, each from the same per-rule functions
    (``easyad_<rule>_d0``, ``_t0``, ``_t1``, ``mul0``): the VM's numbers bit for bit.
    ``easyad_native_hessian`` runs K = seeds.shape[1] directions with the seeds (n, K)
    compiled in (a colouring of the columns, or the identity); ``easyad_native_hvp`` one
    direction given per call. Only ancestors of output 0 are visited: the VM's entries
    elsewhere have adjoint 0 and tangent-adjoint 0, whose contributions (strong zeros) it
    skips; adding them would add +0.0 to sums that start at +0.0, so skipping changes no
    bit either."""
    P = Layout(layout)
    L = P.L
    output = int(P.outputs[0])
    Lo = output + 1 if output < L else 0
    ancestors = output_ancestors(P, output)
    inputs = [int(p) for p in P.inputs]
    runs = list(zip(P.run_start[:-1].tolist(), P.run_start[1:].tolist(), P.run_op.tolist(),
                    P.run_need.tolist(), P.run_affine.tolist(), P.run_base0.tolist(),
                    P.run_base1.tolist()))
    # seeds None: the HVP alone (the Hessian is the second-order program's,
    # second_order_program; easyad_native_hessian then hands every point to the VM)
    sweep = seeds is not None
    if seeds is None:
        seeds = np.zeros((len(inputs), 1))
    K = int(seeds.shape[1])
    # (-O1 for these functions alone, by attribute, was tried: gcc then inlines none of
    # _ops.h's functions into them, 3x slower; -O1 for the whole file costs the gradient)
    out = [f"\n/* second order: {K} seed directions (Hessian), 1 given (HVP) */\n",
           r.table("double", "S", (r.literal(float(c)) for c in seeds.ravel()), "0.0"),
           f"static const double Z[{max(1, K)}] = {{0.0}};   /* a constant's tangents */\n"]
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
                lines.append(f"    {r.loop(k_dirs, 'k')} dv[{s * k_dirs} + k] = {src};\n")
        # a small program's HVP entry by entry, inline (no call per entry, no row table:
        # ~1.5x faster per call), a big one's through the steps and row loops (gcc's time)
        inline = name == "hvp" and _stepped(P, runs, Lo, ancestors) <= INLINE_HVP
        steps, tables = Steps(r, P, name, max(1, Lo * k_dirs)), len(P.decls)
        for run in runs:
            if run[0] < Lo:
                lines += _tangent_run(r, P, run, Lo, ancestors, k_dirs,
                                      None if inline else steps)
        items: list[str | tuple[int, int, int]] = []
        for run in reversed(runs):
            if run[0] < Lo:
                items += _tangent_adjoint_run(r, P, run, Lo, ancestors, k_dirs, inline)
        lines += _row_loops(r, P, items, k_dirs)
        out += P.decls[tables:] + steps.defs
        for j, s in enumerate(inputs):
            src = f"dadj[{s * k_dirs} + k]" if s < Lo else "0.0"
            lines.append(f"    {r.loop(k_dirs, 'k')} result[{j * k_dirs} + k] = {src};\n")
        parts = chunks(lines)
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


def _stepped(P: Layout, runs: list[tuple[int, ...]], Lo: int, ancestors: np.ndarray) -> int:
    """The entries whose tangents are a step call each (not a run's loop): the
    statements an inline HVP adds."""
    return sum(int(ancestors[lo:min(hi, Lo)].sum())
               for lo, hi, op, _, affine, _, _ in runs if lo < Lo and op != 0 and not affine)


def second_work_size(layout: dict[str, Any], K: int) -> int:
    """Doubles of work space the second-order functions need with K directions."""
    L = int(layout["length"])
    output = int(layout["outputs"][0])
    Lo = output + 1 if output < L else 0
    return 4 * L + 1 + 4 * max(1, Lo * max(K, 1)) + max(K, 1)   # + the spare row


def _tan(P: Layout, s: int, k_dirs: int, stride: int = 0) -> str:
    """The tangent (direction k) of slot s (with stride: of slot s + j)."""
    if stride:
        return f"dv[({s} + j) * {k_dirs} + k]"
    if s >= P.L:
        return "0.0"
    if s < int(P.first) and s not in P.input_set:
        return "0.0"
    return f"dv[{s * k_dirs} + k]"


def _tangent_entry(r: CStyleRenderer, P: Layout, rule: _rules.Rule | None, i: str, x: str, y: str,
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
        q.append(r.literal(c) if c is not None else f"{r.rule_partial(name, k)}(x, y, z)")
    t0 = f"{r.rule_tangent(name, 0)}(x, y, z, dx, dy, dz)" if need & 1 else "0.0"
    t1 = f"{r.rule_tangent(name, 1)}(x, y, z, dx, dy, dz)" if need & 2 and rule.arity > 1 \
        else "0.0"
    return (f"{{ const double x = {x}, y = {y}, z = v[{i}]; (void)x; (void)y; (void)z; "
            f"const double q0 = {q[0]}, q1 = {q[1]}; p0[{i}] = q0; p1[{i}] = q1; "
            f"for (k = 0; k < {k_dirs}; k++) {{ const double dx = {dx if need & 1 else '0.0'}, "
            f"dy = {dy if need & 2 else '0.0'}; (void)dx; (void)dy; "
            f"const double dz = {r.mul0('q0', 'dx')} + {r.mul0('q1', 'dy')}; "
            f"dv[({i}) * {k_dirs} + k] = dz; "
            f"dp0[({i}) * {k_dirs} + k] = {t0}; dp1[({i}) * {k_dirs} + k] = {t1}; }} }}")


def _tangent_run(r: CStyleRenderer, P: Layout, run: tuple[int, ...], Lo: int, ancestors: np.ndarray,
                 k_dirs: int, steps: Steps | None) -> list[str]:
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
            if code == SELECT_OP:
                c = _tapeview.select_condition(i)
                a, b = int(P.arg0[i]), int(P.arg1[i])
                dx = _tan(P, a, k_dirs) if a >= 0 else "0.0"
                dy = _tan(P, b, k_dirs) if b >= 0 else "0.0"
                lines.append(
                    f"    {{ const double q0 = (v[{c}] != 0.0) ? 1.0 : 0.0, q1 = (v[{c}] != 0.0)"
                    f" ? 0.0 : 1.0; p0[{i}] = q0; p1[{i}] = q1; for (k = 0; k < {k_dirs}; k++)"
                    f" {{ const double dx = {dx}, dy = {dy}; const double dz = "
                    f"{r.mul0('q0', 'dx')} + {r.mul0('q1', 'dy')}; dv[{i * k_dirs} + k] = dz; "
                    f"dp0[{i * k_dirs} + k] = 0.0; "
                    f"dp1[{i * k_dirs} + k] = 0.0; }} }}\n")
            else:                      # comparisons: no tangents, partials 0
                lines.append(f"    p0[{i}] = 0.0; p1[{i}] = 0.0; for (k = 0; k < {k_dirs}; "
                             f"k++) {{ dv[{i * k_dirs} + k] = 0.0; dp0[{i * k_dirs} + k] = 0.0; "
                             f"dp1[{i * k_dirs} + k] = 0.0; }}\n")
        return lines
    rule = RULE_OF[op]
    if affine:
        s0, s1 = (affine >> 1) & 1, affine >> 2
        x = P.strided(base0, s0, bool(need & 1))
        y = pow_exponent(op, P.strided(base1, s1, bool(need & 2)))
        dx = _tan(P, base0, k_dirs, s0)
        dy = _tan(P, base1, k_dirs, s1)
        body = _tangent_entry(r, P, rule, f"{lo} + j", x, y, need, dx, dy, k_dirs)
        return [f"    {r.loop(hi - lo)} {body}\n"]
    lines = []
    if steps is None:            # inline: the entry's statements themselves
        for i in range(lo, hi):
            if ancestors[i]:
                s0, s1 = int(P.slot0[i]), int(P.slot1[i])
                lines.append("    " + _tangent_entry(
                    r, P, rule, str(i), P.operand(s0), pow_exponent(op, P.operand(s1)), need,
                    _tan(P, s0, k_dirs), _tan(P, s1, k_dirs), k_dirs) + "\n")
        return lines
    step = steps.get(op, need, k_dirs)
    for i in range(lo, hi):
        if not ancestors[i]:
            continue
        s0, s1 = int(P.slot0[i]), int(P.slot1[i])
        lines.append(f"    {step}(dv + {i * k_dirs}, p0 + {i}, {P.operand(s0)}, "
                     f"{pow_exponent(op, P.operand(s1))}, v[{i}], "
                     f"{_source(P, s0, k_dirs, need & 1)}, "
                     f"{_source(P, s1, k_dirs, need & 2)});\n")
    return lines


def _source(P: Layout, s: int, k_dirs: int, needed: int) -> str:
    """Where a step reads an operand's k_dirs tangents: dv's row, or Z (zeros) for a
    constant, a fixed variable or an operand whose partial is not needed."""
    text = _tan(P, s, k_dirs) if needed else "0.0"
    return "Z" if text == "0.0" else f"dv + {s * k_dirs}"


class Steps:
    """The tangent step of one (rule, need) in k_dirs directions as a function of its own
    (``easyad_<rule>_t0``... inlined once there), called once per entry: gcc compiles
    each rule's code once rather than once per entry (compile time), and the program is
    a few bytes per entry (a smaller, faster Hessian). The same expressions, in the same
    order, as the per-entry statements: the VM's bits."""

    def __init__(self, r: CStyleRenderer, P: Layout, prefix: str, wide: int) -> None:
        self.r, self.P, self.prefix, self.wide = r, P, prefix, wide
        self.made: dict[tuple[int, int], str] = {}
        self.defs: list[str] = []

    def get(self, op: int, need: int, k_dirs: int) -> str:
        name = f"{self.prefix}_t{op}_{need}"
        if (op, need) not in self.made:
            self.made[op, need] = name
            body = _tangent_entry(self.r, self.P, RULE_OF[op], "0", "x0", "y0", need, "dxs[k]",
                                  "dys[k]", k_dirs)
            # _tangent_entry's statements, with p0/p1/dv/dp0/dp1 rebased on this entry
            body = (body.replace("x = x0, y = y0, z = v[0]", "x = x0, y = y0, z = z0")
                    .replace("p0[0] = q0; p1[0] = q1;", f"p[0] = q0; p[{self.P.L}] = q1;")
                    .replace(f"dv[(0) * {k_dirs} + k]", "o[k]")
                    .replace(f"dp0[(0) * {k_dirs} + k]", f"o[{self.wide} + k]")
                    .replace(f"dp1[(0) * {k_dirs} + k]", f"o[{2 * self.wide} + k]"))
            self.defs.append(
                f"static EASYAD_CUT void {name}(double* restrict o, double* restrict p, "
                f"const double x0, const double y0, const double z0, "
                f"const double* restrict dxs, const double* restrict dys) {{\n"
                f"    long k; (void)dxs; (void)dys;\n    {body}\n}}\n")
        return name


def _tangent_adjoint_run(r: CStyleRenderer, P: Layout, run: tuple[int, ...], Lo: int,
                         ancestors: np.ndarray, k_dirs: int, inline: bool = False
                         ) -> list[str | tuple[int, int, int]]:
    """The adjoints' tangents of a run's entries, in reverse position order (the VM's):
    an affine run's loop, the others' rows (entry, operand, operand) for ``_row_loops``
    (inline: a statement per entry instead)."""
    lo, hi, op, need, affine, base0, base1 = run
    hi = min(hi, Lo)
    if not ancestors[lo:hi].any():
        return []

    def body(i: str, a: str | None, b: str | None) -> str:
        adds = []
        for target, k in ((a, 0), (b, 1)):
            if target is not None:
                adds.append(f"dadj[({target}) * {k_dirs} + k] += "
                            f"{r.mul0(f'dp{k}[({i}) * {k_dirs} + k]', 'g')} + "
                            f"{r.mul0(f'q{k}', 'q')};")
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
        return [f"    {r.loop(hi - lo, down=True)} {text}\n"] if text else []
    rows: list[str | tuple[int, int, int]] = []
    for i in range(hi - 1, lo - 1, -1):
        if not ancestors[i]:
            continue
        if op == 0 and int(P.ops[i]) != SELECT_OP:
            continue                   # comparisons: adjoint and its tangent stay 0
        a0, a1 = int(P.arg0[i]), int(P.arg1[i])
        if inline:
            text = body(str(i), str(a0) if a0 >= 0 else None, str(a1) if a1 >= 0 else None)
            rows += [f"    {text}\n"] if text else []
        elif a0 >= 0 or a1 >= 0:       # a missing operand's terms go to the spare row Lo
            rows.append((i, a0 if a0 >= 0 else Lo, a1 if a1 >= 0 else Lo))
    return rows


# The k loops of a row: kept as loops (not unrolled, which comes before vectorizing) and
# vectorized (ivdep: a loop's stores never meet its loads); as scalar code the table loop
# ran 1.6x slower than a statement per row
IVDEP = '_Pragma("GCC ivdep") _Pragma("GCC unroll 1") '


def _row_loops(r: CStyleRenderer, P: Layout, items: list[str | tuple[int, int, int]],
               k_dirs: int) -> list[str]:
    """The reverse sweep's statements, its entries' rows (i, a, b) run as loops over tables
    (``P.decls``), in order: the same sums in the same order as a statement per entry,
    compiled once (the terms of a missing operand are added to the spare row, Lo)."""
    lines: list[str] = []
    k = 0
    while k < len(items):
        if isinstance(items[k], str):
            lines.append(items[k])     # type: ignore[arg-type]
            k += 1
            continue
        rows = []
        while k < len(items) and not isinstance(items[k], str):
            rows.append(items[k])
            k += 1
        name = f"R{len(P.decls)}"
        P.decls.append(r.table("int32_t", name, (x for row in rows for x in row), sep=","))
        # the terms first (into t0, t1), then added: loops gcc vectorizes (no store may
        # alias a load), the same sums in the same order (no term reads dadj[ta], dadj[tb])
        lines.append(
            f"    {r.loop(len(rows))} {{ const long i = {name}[3 * j], "
            f"ta = {name}[3 * j + 1], tb = {name}[3 * j + 2]; const double g = 0.0 + a[i], "
            f"q0 = p0[i], q1 = p1[i]; double t0[{k_dirs}], t1[{k_dirs}]; "
            f"{IVDEP}for (k = 0; k < {k_dirs}; k++) {{ const double q = dadj[i * {k_dirs} + k]; "
            f"t0[k] = {r.mul0(f'dp0[i * {k_dirs} + k]', 'g')} + {r.mul0('q0', 'q')}; "
            f"t1[k] = {r.mul0(f'dp1[i * {k_dirs} + k]', 'g')} + {r.mul0('q1', 'q')}; }} "
            f"{IVDEP}for (k = 0; k < {k_dirs}; k++) dadj[ta * {k_dirs} + k] += t0[k]; "
            f"{IVDEP}for (k = 0; k < {k_dirs}; k++) dadj[tb * {k_dirs} + k] += t1[k]; }}\n")
    return lines

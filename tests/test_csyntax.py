"""The one constant printer and the one strong zero of the C-family targets.

- ``_csyntax.literal``, and each renderer that prints numbers through it (``_expr.render``
  for C and float OpenCL, the compiler's, the fused programs' and the OpenCL replay's),
  gives back every value bit for bit once the C compiler (``-Werror``) or PoCL builds it:
  NaN, +-inf, +-0, subnormals, the extremes, numbers needing all 17 digits, float32
  values, ties between two float32 values;
- every spelling of mul0 and div0 (the helpers header's scalar ones in C and OpenCL,
  OpenCL's vector ones, the fused C programs' bit masks, the numpy ufunc loops) gives the
  same bits as the definition written out here, on a grid of operands with 0, -0, inf,
  NaN, tiny and huge numbers. (The Python namespace's mul0 is the plain product where no
  inf or NaN meets a zero, so that higher-order sweeps differentiate it: its zeros may be
  -0.0; tests/test_helpers.py checks its values.)
"""
from __future__ import annotations

import math
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import easyad as ad
from easyad import _core, _csyntax, _expr
from easyad.compiler import tape as tape_compiler
from easyad.compiler.program import cstyle
from easyad.compiler.tape import renderer
from easyad.compiler.tape import render_cl
from easyad.tensor import _kernels

ROOT = Path(__file__).resolve().parent.parent
CC = tape_compiler.compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler on this machine")

F32_MAX = float(np.finfo(np.float32).max)
DOUBLES = [
    0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 1 / 3, -2 / 3, math.pi, -math.e,
    0.30000000000000004, 1.0000000000000002, 0.9999999999999999, 123456789.12345679,
    9007199254740993.0, 2.0 ** 52 + 0.5,
    5e-324, -5e-324, 2.225073858507201e-308, 2.2250738585072014e-308, 1.5e-323,
    1.7976931348623157e308, -1.7976931348623157e308, 1e300, 1e-300,
    math.inf, -math.inf, math.nan, -math.nan,
]
# numbers of float32 (and doubles a float kernel rounds): its subnormals and extremes,
# ties between two float32 values (1 + 2**-24 lies halfway between 1 and the next: the
# decimal printed for the double would round up, numpy's tie rounds to even), values past
# its range (inf) or below it (+-0)
FLOATS = [
    *DOUBLES, 1.401298464324817e-45, -1.401298464324817e-45, 1.1754943508222875e-38,
    1.1754942106924411e-38, F32_MAX, -F32_MAX, F32_MAX * (1 + 2.0 ** -25),
    1.0 + 2.0 ** -24, 1.0 + 3 * 2.0 ** -24, -(1.0 + 2.0 ** -24), 2.0 ** -149 * 1.5,
    0.6931471805599453, 1e-8, 1e-50, -1e-50, 3.4028235677973366e38,
]


def _bits64(values) -> list[int]:
    return [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]


def _bits32(values) -> list[int]:
    with np.errstate(over="ignore"):
        return [int(b) for b in np.asarray(values, dtype=np.float64).astype(np.float32)
                .view(np.uint32)]


def _run_c(source: str, tmp_path: Path) -> bytes:
    """Compile (-Werror: a constant out of range fails) and run a C program; what it
    wrote."""
    path = tmp_path / "p.c"
    path.write_text(source)
    exe = tmp_path / "p"
    subprocess.run([*CC, "-std=c99", "-O2", "-Wall", "-Werror", "-ffp-contract=off",
                    "-o", str(exe), str(path), "-lm"], check=True, capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True).stdout


def _program(decls: str, arrays: list[tuple[str, str]]) -> str:
    writes = "\n".join(f"    fwrite({name}, sizeof({name}[0]), sizeof({name}) / "
                       f"sizeof({name}[0]), stdout);" for name, _ in arrays)
    return ("#include <math.h>\n#include <stdio.h>\n#include <stdint.h>\n"
            "#include <string.h>\n" + decls + "\nint main(void) {\n" + writes
            + "\n    return 0;\n}\n")


# ---- the constant printer ----

def test_literal_spelling():
    assert _csyntax.literal(0.5) == "0.5" and _csyntax.literal(-0.5) == "(-0.5)"
    assert _csyntax.literal(-0.0) == "(-0.0)" and _csyntax.literal(0.5, "float") == "0.5f"
    assert _csyntax.literal(math.nan) == "NAN" and _csyntax.literal(-math.nan) == "(-NAN)"
    assert _csyntax.literal(-math.inf, "float") == "(-INFINITY)"
    assert _csyntax.literal(1e300, "float") == "INFINITY"      # past float32's range
    assert _csyntax.literal(-1e-50, "float") == "(-0.0f)"      # below it
    assert _csyntax.literal(1.0 + 2.0 ** -24, "float") == "1.0f"   # the tie, to even
    assert _csyntax.literal(np.float32(0.1), "float") == "0.10000000149011612f"
    with pytest.raises(ValueError, match="no C literal"):
        _csyntax.literal(1.0, "half")


@needs_cc
def test_literals_round_trip_through_the_c_compiler(tmp_path):
    d = ", ".join(_csyntax.literal(v) for v in DOUBLES)
    # negated: a negative literal must stand after a unary minus (no "--x")
    n = ", ".join(f"-{_csyntax.literal(v)}" for v in DOUBLES)
    f = ", ".join(_csyntax.literal(v, "float") for v in FLOATS)
    source = _program(f"static const double D[] = {{{d}}};\nstatic const double N[] = "
                      f"{{{n}}};\nstatic const float F[] = {{{f}}};",
                      [("D", "double"), ("N", "double"), ("F", "float")])
    out = _run_c(source, tmp_path)
    k = len(DOUBLES)
    got_d = np.frombuffer(out[:8 * k], np.uint64)
    got_n = np.frombuffer(out[8 * k:16 * k], np.uint64)
    got_f = np.frombuffer(out[16 * k:], np.uint32)
    assert got_d.tolist() == _bits64(DOUBLES)
    assert got_n.tolist() == _bits64([-v for v in DOUBLES])
    assert got_f.tolist() == _bits32(FLOATS)


def _opencl_build(opencl_device, source: str):
    import pyopencl as cl
    be = ad.Tensor.constant(np.zeros(1), device=opencl_device)._backend
    from easyad.tensor import _probe
    # built as the library builds its programs (float division correctly rounded)
    program = cl.Program(be.context, source).build(_probe.build_options(cl, be.context.devices))
    log = program.get_build_info(be.context.devices[0], cl.program_build_info.LOG)
    return be, program, log


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_literals_round_trip_through_opencl(opencl_device):
    import pyopencl as cl
    d = "\n".join(f"    D[{i}] = {_csyntax.literal(v)}; N[{i}] = -{_csyntax.literal(v)};"
                  for i, v in enumerate(DOUBLES))
    f = "\n".join(f"    F[{i}] = {_csyntax.literal(v, 'float')};" for i, v in enumerate(FLOATS))
    source = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
              "__kernel void k(__global double* D, __global double* N, __global float* F) {\n"
              f"{d}\n{f}\n}}\n")
    be, program, log = _opencl_build(opencl_device, source)
    assert "constant" not in log.lower(), log      # no literal out of range or inexact
    D, N = np.empty(len(DOUBLES)), np.empty(len(DOUBLES))
    F = np.empty(len(FLOATS), np.float32)
    mf = cl.mem_flags
    bufs = [cl.Buffer(be.context, mf.WRITE_ONLY, a.nbytes) for a in (D, N, F)]
    program.k(be.queue, (1,), None, *bufs)
    for a, b in zip((D, N, F), bufs):
        cl.enqueue_copy(be.queue, a, b)
    # OpenCL's NAN carries its driver's payload (PoCL's: all ones): NaN with its sign
    for got, want in ((D, DOUBLES), (N, [-v for v in DOUBLES]), (F, FLOATS)):
        want = np.asarray(want, got.dtype) if got.dtype == np.float64 else \
            np.asarray(want).astype(np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(np.signbit(got), np.signbit(want))
        _assert_bits(got, want, "OpenCL literals")


def test_every_renderer_prints_through_the_one_printer():
    finite = [v for v in FLOATS if math.isfinite(v)]
    for v in finite:
        # the expression renderer: Python's text, C's double, OpenCL's float
        assert _expr.render(_expr.Num(abs(v)), "c") == _csyntax.literal(abs(v))
        assert _expr.render(_expr.Num(abs(v)), "opencl-float") == \
            _csyntax.literal(abs(v), "float")
        assert float(_expr.render(_expr.Num(abs(v)), "python")) == abs(v)
    for v in DOUBLES:
        # every renderer prints through its dialect: the scalar C, tensor C, OpenCL replay
        assert renderer.C.literal(v) == cstyle.CDialect().literal(v) \
            == render_cl.ReplayRenderer().literal(v) == _csyntax.literal(v)
    with pytest.raises(ValueError, match="no literal"):
        _expr.render(_expr.Num(math.inf), "c")    # a macro would read back as a variable


@needs_cc
def test_the_compiled_function_keeps_its_constants(tmp_path):
    # a recorded constant of every kind, through compile(): value and gradient exact
    consts = [-2.5, 0.1, 1e-300, 5e-324, -0.0, 1.7976931348623157e308]

    def f(x):
        out = x[0] * 0.0
        for c in consts:
            out = out + ad.maximum(x[0], c) * 3.0 - c * x[1]
        return out

    F = ad.record(f, np.array([1.0, 2.0]))
    F.compile()
    for x in (-3.0, 0.05, 2.0):
        want = 0.0
        for c in consts:
            want = want + max(x, c) * 3.0 - c * 0.5
        assert F(np.array([x, 0.5])) == want
        assert F.gradient(np.array([x, 0.5])).tolist() == [
            3.0 * sum(x >= c for c in consts), -sum(consts)]


# ---- the strong zero ----

GRID = [0.0, -0.0, 1.0, -2.5, 3.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324,
        2.2250738585072014e-308, 1e-200, 1.7976931348623157e308, -1e200]
GRID32 = [0.0, -0.0, 1.0, -2.5, 3.0, math.inf, -math.inf, math.nan, 1.401298464324817e-45,
          -1.401298464324817e-45, 1.1754943508222875e-38, 1e-30, F32_MAX, -1e30]


def _operands(grid, dtype):
    a, b = np.meshgrid(np.asarray(grid, dtype), np.asarray(grid, dtype), indexing="ij")
    return a.ravel(), b.ravel()


def _truth(name, a, b):
    """mul0/div0 as documented (_rules.HELPER_DOCS), element by element: +0.0 where the
    strong zero applies, else the IEEE product/quotient of numpy."""
    with np.errstate(all="ignore"):
        if name == "mul0":
            return np.where((a == 0) | (b == 0), a.dtype.type(0), a * b)
        return np.where(a == 0, a.dtype.type(0), a / b)


def _assert_bits(got, want, where):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, where
    u = np.uint64 if want.dtype == np.float64 else np.uint32
    # NaN as NaN (which operand's payload a NaN product carries is the compiler's choice)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), where
    bad = np.flatnonzero(~nan & (got.view(u) != want.view(u)))
    assert bad.size == 0, f"{where}: first differences at {bad[:5]}: {got[bad[:5]]} " \
                          f"!= {want[bad[:5]]}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["mul0", "div0"])
def test_strong_zero_numpy_ufuncs(name, dtype):
    a, b = _operands(GRID if dtype == np.float64 else GRID32, dtype)
    want = _truth(name, a, b)
    ufunc = {"mul0": _core._mul0_ufunc, "div0": _core._div0_ufunc}[name]
    with np.errstate(all="ignore"):
        _assert_bits(ufunc(a, b), want, "ufunc, contiguous")
        _assert_bits(ufunc(a[::-1], b[::-1])[::-1], want, "ufunc, strided")
        g = np.asarray(GRID if dtype == np.float64 else GRID32, dtype)
        for x in g:             # one operand a scalar: the loops' broadcast branches
            xs = np.full_like(g, x)
            _assert_bits(ufunc(x, g), _truth(name, xs, g), "ufunc, a scalar")
            _assert_bits(ufunc(g, x), _truth(name, g, xs), "ufunc, b scalar")


@needs_cc
@pytest.mark.parametrize("name", ["mul0", "div0"])
def test_strong_zero_in_c(name, tmp_path):
    """The header's scalar helper and the fused programs' bit-mask one, compiled."""
    a, b = _operands(GRID, np.float64)
    av = ", ".join(_csyntax.literal(v) for v in a)
    bv = ", ".join(_csyntax.literal(v) for v in b)
    n = len(a)
    decls = (f'#include "{ROOT / "easyad" / "_helpers.h"}"\n{cstyle.STRONG_ZERO}\n'
             f"static double A[] = {{{av}}};\nstatic double B[] = {{{bv}}};\n"
             f"static double S[{n}], M[{n}];\n"
             f"static void fill(void) {{ for (int i = 0; i < {n}; i++) {{ "
             f"S[i] = easyad_fn_{name}(A[i], B[i]); M[i] = easyad_v_{name}(A[i], B[i]); }} }}")
    source = _program(decls, [("S", "double"), ("M", "double")]).replace(
        "int main(void) {\n", "int main(void) {\n    fill();\n")
    out = np.frombuffer(_run_c(source, tmp_path), np.float64)
    want = _truth(name, a, b)
    _assert_bits(out[:n], want, "_helpers.h in C")
    _assert_bits(out[n:], want, "cstyle.STRONG_ZERO")


@pytest.mark.parametrize("real", ["double", "float"])
@pytest.mark.parametrize("name", ["mul0", "div0"])
def test_strong_zero_in_opencl(name, real, opencl_device):
    """The header's scalar helper and _kernels.vector_helpers' vector one, on the device."""
    import pyopencl as cl
    dtype = np.float64 if real == "double" else np.float32
    a, b = _operands(GRID if real == "double" else GRID32, dtype)
    n = len(a) - len(a) % 4
    a, b = a[:n], b[:n]
    source = (_kernels.preamble(real, 4) +
              "__kernel void k(__global const real_t* A, __global const real_t* B,"
              " __global real_t* S, __global real_t* V) {\n"
              "    size_t i = get_global_id(0);\n"
              "    for (int j = 4 * i; j < 4 * i + 4; j++)\n"
              f"        S[j] = {name}(A[j], B[j]);\n"
              f"    vstore4(easyad_v_{name}(vload4(i, A), vload4(i, B)), i, V);\n}}\n")
    be, program, _ = _opencl_build(opencl_device, source)
    mf = cl.mem_flags
    A = cl.Buffer(be.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
    B = cl.Buffer(be.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(b))
    S, V = np.empty(n, dtype), np.empty(n, dtype)
    outs = [cl.Buffer(be.context, mf.WRITE_ONLY, S.nbytes) for _ in range(2)]
    program.k(be.queue, (n // 4,), None, A, B, *outs)
    for host, dev in zip((S, V), outs):
        cl.enqueue_copy(be.queue, host, dev)
    want = _truth(name, a, b)
    _assert_bits(S, want, f"_helpers.h in OpenCL ({real})")
    _assert_bits(V, want, f"_kernels.vector_helpers ({real}4)")


def test_one_definition_of_the_strong_zero():
    """Every C spelling expands the header's macros: changing them changes all."""
    header = (ROOT / "easyad" / "_helpers.h").read_text()
    ufuncs = (ROOT / "easyad" / "_engine" / "ufuncs.pxi").read_text()
    vector = _kernels.vector_helpers("double", 4)
    for name, macro in (("mul0", "EASYAD_MUL0"), ("div0", "EASYAD_DIV0")):
        assert f"#define {macro}(T, a, b)" in header
        assert f"easyad_fn_{name}(real_t a, real_t b) {{ return {macro}(real_t, a, b); }}" \
            in header
        assert f"{macro}(vreal_t, a, b)" in vector
        assert f"{macro}_ZERO(double, a, b)" in cstyle.STRONG_ZERO
        for t in ("double", "float"):
            assert f"{macro}({t}, a, b)" in ufuncs


def test_every_literal_is_recognised_as_one():
    """is_literal is literal's inverse test (the compiler hides constant pow exponents
    from gcc by it): every printed constant is one, no C expression of an entry is."""
    values = [0.5, -2.5, 2.0, 0.0, -0.0, 1e-300, 5e-324, 1.7976931348623157e308,
              float("nan"), float("inf"), float("-inf"), 0.1]
    for real in ("double", "float"):
        for v in values:
            text = _csyntax.literal(v, real)
            assert _csyntax.is_literal(text), (v, real, text)
    for text in ("v[3]", "v[12 + j]", "v[I0[j]]", "x", "a[1]", "K[2]", "easyad_keep(0.5)"):
        assert not _csyntax.is_literal(text), text


def _marked(base):
    """A dialect spelling constants and the strong zero with marks (taken off again by
    ``_unmarked``): what a renderer writes past its dialect stays unmarked."""
    class Marked(base):
        def literal(self, value):
            return f"MARK_{super().literal(value)}_KRAM"

        def mul0(self, a, b):
            return f"MARK_MUL0({a}, {b})"
    return Marked


def _unmarked(text):
    return text.replace("MARK_MUL0(", "mul0(").replace("MARK_", "").replace("_KRAM", "")


def test_every_renderer_writes_constants_and_strong_zeros_through_its_dialect():
    from easyad.compiler import dialect
    from easyad.compiler.tape import render_cl

    def f(x):
        y = ad.where(x[0] > 0.25, ad.sin(x[0]) * x[1], -2.5 * x[1])
        return y + 2.5 * ad.exp(x[1]) * ad.tanh(x[0] * x[1]) + ad.log1p(x[0] * x[0])
    F = ad.record(f, np.array([0.3, 0.4]))
    tape, inputs, outputs = tape_compiler.optimise(F.tape, F.inputs, F.outputs)
    layout = _core._Replayer(tape, list(inputs), list(outputs))._layout()
    # the scalar C (with its Hessian and HVP): the marked dialect's text, unmarked, is the
    # plain text (after the prelude, which the marks' unknown names change)
    marked = renderer.TapeRenderer(_marked(dialect.CSpelling)()).render(
        layout, "t", np.eye(2))
    plain = renderer.render(layout, "t", np.eye(2))
    assert "MARK_MUL0(" in marked and "MARK_2.5_KRAM" in marked
    assert "MARK_(-2.5)_KRAM" in marked or "MARK_0.25_KRAM" in marked
    start = plain.index("static const double K[")
    assert _unmarked(marked[marked.index("static const double K["):]) == plain[start:]
    # the OpenCL replay kernel
    marked = render_cl.ReplayRenderer(_marked(dialect.OpenCLDialect)("double")).render(
        tape._arrays(), list(inputs), int(outputs[0]))
    plain = render_cl.render_replay_kernel(tape._arrays(), list(inputs), int(outputs[0]))
    assert "MARK_MUL0(" in marked and "_KRAM" in marked
    assert _unmarked(marked) == plain

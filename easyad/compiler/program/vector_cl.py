"""Which vector widths and builtins the fused OpenCL kernels use on a device: the width
asked (``vector_width``), the widest proven in a child process (``fused_width``,
``easyad.tensor._proofs``), and the builtins whose vector versions disagree with the
scalar ones there (``check_vector_math`` in the proof's child, ``untrusted_vector_math``
here): those are computed lane by lane (``_kernels.lanewise_math``).
"""
from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import numpy as np

from easyad.errors import KernelFallbackWarning
from easyad.tensor import _kernels

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

# the vector loops (CPU devices): see vector_width and OpenCLRenderer._vector_expr
VECTOR_ENV = "EASYAD_OPENCL_VECTOR"     # "0": scalar kernels only; 2, 4, 8, 16: that width
# OpenCL builtins the rule table's expressions call, each defined on vectors too
VECTOR_MATH = frozenset({"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                          "asinh", "acosh", "atanh", "exp", "exp2", "expm1", "log", "log2",
                          "log10", "log1p", "sqrt", "cbrt", "fabs", "erf", "atan2", "hypot"})
LANE_NAMES = "0123456789abcdef"


def untrusted_vector_math(be: OpenCLBackend, real: str, width: int) -> frozenset[str]:
    """The math builtins whose vector versions (``width`` lanes of ``real``) give other
    values than the scalar ones on this device, lane by lane, at zeros, infinities, NaN,
    subnormal, huge and ordinary values mixed in one vector (PoCL 3.1's double8 pow got
    lanes wrong next to a zero: other drivers and CPUs may have other such bugs). Found by
    ``check_vector_math`` in the child process that proves the width (``_proofs``: the
    check is a kernel too, never built here first), kept per backend; those found are
    computed lane by lane (``_kernels.lanewise_math``). A width not proven: all of them."""
    kept = be.__dict__.setdefault("_untrusted_vector_math", {})
    key = (real, width)
    if key not in kept:
        from easyad.tensor import _proofs
        verdict = _proofs.verdicts(be.device._handle, [f"fused:{real}:{width}"])
        found = next(iter(verdict.values())).get("lanewise")
        ok = isinstance(found, list) and all(name in VECTOR_MATH for name in found)
        kept[key] = frozenset(found) if ok else VECTOR_MATH
    return kept[key]


# tiny values share vectors with huge ones: PoCL's (3.0 and 3.1) float8/float16 sin, cos
# and tan reduce every lane the slow way when one lane is huge, and give sin(1e-8) =
# sin(1e-8 * 2**20) there (tests/test_conformance.py found it; the lanes alone are right)
_CHECK_VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 0.75, 1e-310, -1e-310, 1e300, -1e300,
                 np.inf, -np.inf, np.nan, 710.0, -750.0, 2.0, 1e-5, -0.3, 100.0, 7.25, -9.5,
                 0.1, 1e-8, -3e-7, 1e30, 1e-20, -2e-38, 1e-40, -3e38, 1e-30]


def check_vector_math(be: OpenCLBackend, real: str, width: int) -> frozenset[str]:
    # each check: (the builtin it vouches for, the vector result, the scalar builtin); the
    # fused kernels also take sin and cos from one vector sincos (used only where both
    # are trusted, so a wrong sincos makes both untrusted)
    checks = [(name, f"{name}(vx, vy)" if name in _kernels.BINARY_MATH else f"{name}(vx)",
               name) for name in sorted(VECTOR_MATH)]
    checks += [("sin", "sincos(vx, &c)", "sin"), ("cos", "c", "cos")]
    dtype = np.float64 if real == "double" else np.float32
    with np.errstate(over="ignore"):      # 1e300 is inf in float32: also a value to try
        values = np.array(_CHECK_VALUES, dtype=dtype)
    x = np.concatenate([values, values[::-1], np.roll(values, 5)])
    x = x[:len(x) // width * width]
    y = np.roll(x, 3)
    n = len(x)
    lanes = LANE_NAMES[:width]

    def vector(p: str) -> str:
        return "(vreal_t)(" + ", ".join(f"{p}[i + {k}]" for k in range(width)) + ")"
    lines = []
    for k, (_, expr, name) in enumerate(checks):
        scalar = "X[i + {j}], Y[i + {j}]" if name in _kernels.BINARY_MATH else "X[i + {j}]"
        lines.append(f"        {{ const vreal_t r = {expr};")
        lines += [f"          V[{k * n} + i + {j}] = r.s{lane}; "
                  f"S[{k * n} + i + {j}] = {name}({scalar.format(j=j)});"
                  for j, lane in enumerate(lanes)]
        lines.append("        }")
    source = (_kernels.preamble(real, width) + "__kernel void easyad_vector_check("
              "__global const real_t* X, __global const real_t* Y, __global real_t* V, "
              "__global real_t* S, const long n) {\n"
              f"    for (long i = 0; i < n; i += {width}) {{\n"
              f"        const vreal_t vx = {vector('X')}, vy = {vector('Y')};\n"
              "        vreal_t c;\n"
              + "\n".join(lines) + "\n    }\n}\n")
    kernel = be.kernel(source, "easyad_vector_check", [None, None, None, None, np.int64])
    bx, by = be.asarray(x, dtype), be.asarray(y, dtype)
    bv, bs = be.allocate((len(checks) * n,), dtype), be.allocate((len(checks) * n,), dtype)
    kernel(be.queue, (1,), (1,), bx.data, by.data, bv.data, bs.data, n)
    v = be.to_numpy(bv).reshape(len(checks), n)
    s = be.to_numpy(bs).reshape(len(checks), n)
    # the same to a few units in the last place (subnormal results: to the smallest normal)
    info = np.finfo(dtype)
    with np.errstate(all="ignore"):
        same = (v == s) | (np.isnan(v) & np.isnan(s)) | \
            (np.abs(v - s) <= 4 * info.eps * np.abs(s) + info.tiny)
    return frozenset(name for (name, _, _), row in zip(checks, same) if not row.all())



def vector_width(be: OpenCLBackend, real: str) -> int:
    """The lanes asked for the vector loops of fused kernels on ``be``'s device: the
    width EASYAD_OPENCL_VECTOR gives (0: scalar kernels), on any device; unset, 0 on a
    GPU (a work-item per element: its lanes are the vectors) and on a device that prefers
    no vectors, else the device's preferred vector width of ``real`` (PoCL: its target's
    vector register, 8 doubles with AVX-512, 4 with AVX2). What is built is
    ``fused_width``: the widest of these that passed its proof."""
    setting = os.environ.get(VECTOR_ENV, "").strip()
    if be.device.is_gpu and not setting:
        return 0
    try:
        width = int(setting) if setting else int(
            getattr(be.device._handle, f"preferred_vector_width_{real}"))
    except Exception:       # a driver that does not answer: scalar kernels
        return 0
    return width if width in (2, 4, 8, 16) else 0


# set only in a proof's child (_proofs): the width being proven there, and its lanewise math
forced: dict[str, tuple[int, frozenset[str]]] = {}


def fused_width(be: OpenCLBackend, real: str) -> int | None:
    """The vector width the fused kernels of ``real`` are built with on ``be``'s device:
    the widest of ``vector_width``'s and the narrower ones (halving to 2), then 0 (scalar
    kernels), whose kind passed its proof in a child process (``_proofs``: a driver that
    crashes on a kind crashes there, not here); None when no kind passed (no fused
    kernels: one kernel per instruction). A width other than the one asked for comes with
    one ``KernelFallbackWarning`` per device and precision in a process."""
    if real in forced:
        width, lanewise = forced[real]
        be.__dict__.setdefault("_untrusted_vector_math", {})[(real, width)] = lanewise
        return width
    asked = vector_width(be, real)
    chosen = be.__dict__.setdefault("_fused_width", {})
    if (real, asked) in chosen:
        return chosen[real, asked]
    from easyad.tensor import _proofs
    widths = [w for w in (16, 8, 4, 2) if w <= asked] + [0]
    failed: list[str] = []
    width = None
    for w in widths:
        v = _proofs.verdicts(be.device._handle, [f"fused:{real}:{w}"])[f"fused:{real}:{w}"]
        if v["ok"]:
            width = w
            break
        failed.append(f"{_width_name(w)} ({v['problem']})")
    if failed:
        instead = ("no fused kernels: each instruction runs as its own kernel" if width is None
                   else f"{_width_name(width)} instead")
        warnings.warn(
            f"OpenCL device {be.device.name} ({be.device.description}): fused "
            f"{_proofs.REALS[real]} kernels failed their proof with {'; '.join(failed)}; "
            f"recorded programs use {instead} (every kind of kernel is built and run in a "
            f"child process first, so a driver that crashes takes only that one down). "
            f"Override: {VECTOR_ENV}=N picks the widest width to try (0: scalar kernels); a "
            f"driver that builds them all: {_PROOF_FIX}; verdicts are kept in "
            f"{_proofs.cache_path()} (delete it to prove again)",
            KernelFallbackWarning, stacklevel=_proofs.caller_stacklevel())
    chosen[real, asked] = width
    return width


_PROOF_FIX = ("on Debian/Ubuntu `sudo apt-get install pocl-opencl-icd` (the system's PoCL; "
              "PyPI's PoCL 3.0 crashes on its widest vectors on some AVX-512 AMD CPUs)")


def proven(be: OpenCLBackend, real: str, width: int) -> bool:
    if real in forced:
        return forced[real][0] == width
    from easyad.tensor import _proofs
    return bool(_proofs.verdicts(be.device._handle, [f"fused:{real}:{width}"])
                [f"fused:{real}:{width}"]["ok"])


def _width_name(width: int) -> str:
    return f"{width}-lane vectors" if width else "scalar loops"

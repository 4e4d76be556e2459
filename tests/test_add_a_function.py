"""Adding a function is one row of the rule table (plus one helper where C lacks it).

docs/internals.md ("How to add a function") promises it; this test does it. It copies the
sources (easyad/, codegen/, setup.py, pyproject.toml and the README the metadata names) to a
temporary folder, adds ONE row to the copy's easyad/_rules.py, ``sinc(x) = sin(x) / x``
(unnormalised: numpy's and torch's sinc are sin(pi x)/(pi x), hence numpy=None and torch's
spelling as an expression), and ONE helper to the copy's easyad/_helpers.h (C has no sinc),
builds the copy, and checks in a child process importing it that ``ad.sinc`` works
everywhere: floats, Trace, Record, numpy arrays, numpy and OpenCL tensors (every working
OpenCL device), ``ad.record`` replay (values, gradients, Hessians) and ``compile()``,
``ad.record(tensor=True)`` replayed (fused kernels) on numpy and OpenCL, TraceTensor,
NestedTrace (forward over forward), Taylor mode and second order by create_graph,
against sympy's derivatives of sin(x)/x and finite differences.
Nothing else is edited: a function that needed more would fail here.

It builds the core (~30-45 s on 2 cores): ``pytest -m "not build"`` leaves it out.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import easyad as ad

ROOT = Path(__file__).resolve().parent.parent

ROW = '''\
    # unnormalised sinc; sinc'(0) = 0 (div0: 0/0 counts as 0)
    Rule("sinc", "sinc(x)", ("div0(cos(x) - z, x)",), NO_CHECK, doc="sin(x) / x, 1 at 0",
         numpy=None, torch="sin(x) / x", sympy="sinc"),
'''

HELPER = '''\
/* sin(x) / x, 1 at 0 (the rule sinc) */
static inline real_t easyad_fn_sinc(real_t x) {
    return x == (real_t)0 ? (real_t)1 : sin(x) / x;
}
#define sinc easyad_fn_sinc

'''

CHECK = r'''
import json, math, sys
import numpy as np
import sympy
import easyad as ad

assert ad.__file__.startswith(sys.argv[1]), ad.__file__   # the copy, not the checkout
s = sympy.Symbol("s")
SINC = sympy.sin(s) / s


def ref(x, n=0):  # the n-th derivative of sin(x)/x, by sympy (the limit at 0)
    e = sympy.diff(SINC, s, n)
    return float(sympy.limit(e, s, 0) if x == 0 else e.subs(s, x).evalf(30))


def close(a, b, rel=1e-12, what=""):
    assert abs(a - b) <= rel * max(1.0, abs(b)), (what, a, b)


def fd(f, x, h=1e-5):
    return (f(x + h) - f(x - h)) / (2 * h)


points = [0.7, -2.5, 10.0, 1e-3]
# floats, Trace (forward), Record (reverse): value, derivative vs sympy and vs differences
assert ad.sinc(0.0) == 1.0 and ad.sinc(0) == 1.0
for x in points:
    close(ad.sinc(x), math.sin(x) / x, 1e-15, "float")
    t = ad.sinc(ad.Trace.variable(x))
    close(t.number, ref(x), 1e-15, "trace value")
    close(t.derivative, ref(x, 1), 1e-9 if x < 0.01 else 1e-13, "trace derivative")
    close(t.derivative, fd(ad.sinc, x), 1e-8, "trace vs differences")
    lst = ad.WengertList()
    v = lst.variable(x)
    r = ad.sinc(v) * v              # sinc(x) x = sin(x)
    close(r.number, math.sin(x), 1e-15, "record value")
    close(r.derivatives()[v], math.cos(x), 1e-9 if x < 0.01 else 1e-13, "record derivative")
assert ad.sinc(ad.Trace.variable(0.0)).derivative == 0.0           # div0: 0/0 is 0
assert ad.Trace.variable(0.7).sinc().number == ad.sinc(0.7)        # the method too

# numpy arrays: easyad's sinc elementwise, not numpy's normalised one
a = np.array([0.0, 0.7, -2.5, 10.0])
got = ad.sinc(a)
assert isinstance(got, np.ndarray)
np.testing.assert_allclose(got, [ref(x) for x in a], rtol=1e-15)
assert not np.allclose(got, np.sinc(a))

# tensors on every device (numpy, then each working OpenCL device)
devices = []
for dev in ad.devices():
    lst = ad.WengertList()
    T = ad.Tensor.variable(a, lst, device=dev.name)
    y = ad.sinc(T)
    loss = ad.sum(y * 2.0) + ad.sum(T.sinc())
    rtol = 1e-15 if dev.kind == "numpy" else 1e-12
    np.testing.assert_allclose(y.value, [ref(x) for x in a], rtol=rtol, err_msg=dev.name)
    np.testing.assert_allclose(loss.derivatives()[T], [3 * ref(x, 1) for x in a],
                               rtol=1e-12, atol=1e-15, err_msg=dev.name)
    devices.append(dev.name)

# record once, replay at other points: values, gradients and Hessians in the C sweeps
F = ad.record(lambda v: ad.sinc(v[0]) * v[1] + ad.sinc(v[0] * v[1]), [0.7, 2.0])
for p in ([1.3, 0.5], [-2.0, 3.0]):
    x0, x1 = p
    close(float(F(p)), ref(x0) * x1 + ref(x0 * x1), 1e-14, "replay value")
    g = F.gradient(p)
    close(g[0], ref(x0, 1) * x1 + ref(x0 * x1, 1) * x1, 1e-12, "replay d/dx0")
    close(g[1], ref(x0) + ref(x0 * x1, 1) * x0, 1e-12, "replay d/dx1")
    H = F.hessian(p)
    close(H[0, 0], ref(x0, 2) * x1 + ref(x0 * x1, 2) * x1 * x1, 1e-10, "replay H00")
    close(H[0, 1], ref(x0, 1) + ref(x0 * x1, 2) * x0 * x1 + ref(x0 * x1, 1), 1e-10, "H01")
    close(H[1, 1], ref(x0 * x1, 2) * x0 * x0, 1e-10, "replay H11")

# Taylor mode: derivatives of order 0..5 at a point
for x in (0.7, -2.5):
    c = ad.taylor(ad.sinc, x, 5)
    for n in range(6):
        close(c[n], ref(x, n), 1e-10, f"taylor order {n}")

# second order: ad.hessian (record + replay) and create_graph (reverse over reverse)
for x in (0.7, 3.0):
    close(ad.hessian(lambda v: ad.sinc(v[0]))([x])[0, 0], ref(x, 2), 1e-10, "ad.hessian")
    lst = ad.WengertList()
    v = lst.variable(x)
    d1 = ad.sinc(v).derivatives(create_graph=True)[v]
    close(d1.number, ref(x, 1), 1e-13, "create_graph d1")
    d2 = d1.derivatives(create_graph=True)[v]
    close(d2.number, ref(x, 2), 1e-10, "create_graph d2")
    close(d2.derivatives()[v], ref(x, 3), 1e-9, "create_graph d3")

# compiled C (Function.compile; the VM where no compiler is found): value and gradient
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ad.CompilerWarning)
    C = F.compile()
for p in ([1.3, 0.5], [-2.0, 3.0]):
    x0, x1 = p
    close(float(C(p)), ref(x0) * x1 + ref(x0 * x1), 1e-14, "compiled value")
    g = C.gradient(p)
    close(g[0], ref(x0, 1) * x1 + ref(x0 * x1, 1) * x1, 1e-12, "compiled d/dx0")
    close(g[1], ref(x0) + ref(x0 * x1, 1) * x0, 1e-12, "compiled d/dx1")

# forward mode on arrays (TraceTensor) and forward over forward (NestedTrace): f, f', f''
for x in (0.7, -2.5):
    tt = ad.sinc(ad.TraceTensor.variable(np.array([x, 2 * x])))
    np.testing.assert_allclose(tt.tangent, [ref(x, 1), ref(2 * x, 1)], rtol=1e-12)
    n = ad.sinc(ad.Trace(ad.Trace(x, 1.0), ad.Trace(1.0, 0.0)))
    close(n.number.number, ref(x), 1e-15, "nested value")
    close(n.derivative.number, ref(x, 1), 1e-12, "nested f'")
    close(n.derivative.derivative, ref(x, 2), 1e-10, "nested f''")

# tensor code recorded once (fused kernels) and replayed on numpy and one OpenCL device (the
# copy's renderers hash anew: each device proves its fused kernels in child processes)
for dev in devices[:2]:
    T = ad.record(lambda v: ad.sum(ad.sinc(v) * v), a, tensor=True, device=dev)
    b = np.array([0.3, -1.7, 4.0, 0.0])
    close(float(T(b)), sum(ref(x) * x for x in b), 1e-12, "tensor replay " + dev)
    np.testing.assert_allclose(T.gradient(b), [ref(x, 1) * x + ref(x) for x in b],
                               rtol=1e-12, atol=1e-15, err_msg="tensor replay " + dev)
print(json.dumps({"devices": devices}))
'''


def _copy_sources(dest: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "_generated", "_core.pyi",
                                  "*.html")
    shutil.copytree(ROOT / "easyad", dest / "easyad", ignore=skip)
    shutil.copytree(ROOT / "codegen", dest / "codegen", ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)


def _add(path: Path, anchor: str, text: str) -> None:
    """Insert text before the (one) occurrence of anchor."""
    source = path.read_text()
    assert source.count(anchor) == 1, f"{anchor!r} in {path}"
    path.write_text(source.replace(anchor, text + anchor))


@pytest.mark.build
def test_one_row_and_one_helper_add_a_function(tmp_path):
    _copy_sources(tmp_path)
    _add(tmp_path / "easyad" / "_rules.py", ")\n\nBINARY_RULES", ROW)
    header = tmp_path / "easyad" / "_helpers.h"
    source = header.read_text()
    cut = source.rindex("#endif")          # the include guard's end: the helper goes before
    header.write_text(source[:cut] + HELPER + source[cut:])

    # -O0: the build itself is under test, not the copy's speed (5 s of gcc instead of ~40)
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=900,
                           env={**os.environ, "EASYAD_BUILD_OPT": "-O0"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]

    (tmp_path / "check_sinc.py").write_text(textwrap.dedent(CHECK))
    check = subprocess.run([sys.executable, "check_sinc.py", str(tmp_path)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-5000:]
    checked = json.loads(check.stdout.strip().splitlines()[-1])["devices"]
    # every device this checkout sees was checked, OpenCL ones included
    assert checked == [d.name for d in ad.devices()]

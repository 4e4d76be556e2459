"""The child side of the kernel proofs (``_proofs``): build, run and check each kind.

Run only as ``python -c "from easyad.tensor._proof_child import main; main()"`` by
``_proofs._prove_in_child`` (the request on stdin, one JSON verdict per line on stdout);
nothing in the package imports it, so it may import the whole package (it is above every
layer, as a user's program is).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from easyad.tensor import _probe
from easyad.tensor._proofs import CRASH_ENV, REALS

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

def _close(name: str, got: Any, want: Any, real: str) -> str | None:
    """None if ``got`` equals ``want`` to the precision's tolerance (NaN where NaN), else
    what differs."""
    import numpy as np
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.size != want.size:      # (a reduction to one number: () or (1,) by backend)
        return f"{name}: shape {got.shape} instead of {want.shape}"
    got, want = got.reshape(-1), want.reshape(-1)
    rtol = 1e-9 if real == "double" else 2e-4
    with np.errstate(all="ignore"):
        scale = np.nanmax(np.abs(want[np.isfinite(want)]), initial=0.0)
        good = np.isclose(got, want, rtol=rtol, atol=rtol * 1e-3 * scale, equal_nan=True)
    if good.all():
        return None
    k = int(np.argmin(good))
    return f"{name} computed wrong numbers ({float(got[k])!r} instead of {float(want[k])!r})"


def _eager_cases(be: Backend, host: Any, dtype: Any) -> list[tuple[str, Any, Any]]:
    """(what, device result, host result) of each eager kernel kind, on ``be`` and on the
    numpy backend ``host``."""
    import numpy as np

    from easyad import _rules
    from easyad.tensor._base import BOOL
    rng = np.random.default_rng(24)
    x = rng.uniform(0.15, 0.85, (7, 13)).astype(dtype)
    y = rng.uniform(0.2, 0.9, (13,)).astype(dtype)
    y2, z = (rng.uniform(0.2, 0.9, (7, 13)).astype(dtype) for _ in range(2))
    g = np.array(0.75, dtype=dtype)
    big = rng.normal(size=(5003,)).astype(dtype)
    cube = rng.normal(size=(4, 5, 6)).astype(dtype)
    cases = []

    def both(what: str, run: Any) -> None:
        """``run`` on each backend: a buffer, or a list of them (stacked)."""
        def host_of(b: Any) -> Any:
            out = run(b)
            return np.stack([b.to_numpy(o) for o in out]) if isinstance(out, list) \
                else b.to_numpy(out)
        cases.append((what, host_of(be), host_of(host)))

    def on(b: Any, a: Any) -> Any:
        return b.asarray(a, dtype)
    values = tuple(r.value for r in _rules.RULES)
    both("every rule's value (an operand broadcast through strides)", lambda b: b.map(
        "proof_values", values, {"x": on(b, x), "y": on(b, y)}, x.shape,
        (dtype,) * len(values)))
    adjoints = tuple(f"mul0(g, {p})" for r in _rules.RULES for p in r.partials) + ("x * c",)
    both("every rule's adjoint (a 0-d operand, a scalar one)", lambda b: b.map(
        "proof_adjoints", adjoints, {"x": on(b, x), "y": on(b, y2), "z": on(b, z),
                                     "g": on(b, g), "c": 1.5},
        x.shape, (dtype,) * len(adjoints)))
    both("comparisons and a select on bools", lambda b: b.map(
        "proof_select", ("choose(m, x * 2.0, -y)",), {
            "m": b.map("proof_compare", ("x < y",), {"x": on(b, x), "y": on(b, y2)},
                       x.shape, (BOOL,))[0], "x": on(b, x), "y": on(b, y2)},
        x.shape, (dtype,))[0])
    for op in ("sum", "max", "min"):
        both(f"reduction ({op}, to one number, several passes)",
             lambda b, op=op: b.reduce(op, on(b, big), (0,)))
        both(f"reduction ({op}, axes brought together)",
             lambda b, op=op: b.reduce(op, on(b, cube), (0, 2)))
    both("reduction of a middle axis", lambda b: b.reduce("sum", on(b, cube), (1,)))
    both("a strided gather", lambda b: b.strided(on(b, x), 2, (3, 4), (13, 2)))
    both("strided scatters", lambda b: b.assemble((7, 13), dtype, [
        (1, (3, 4), (13, 2), b.strided(on(b, x), 0, (3, 4), (13, 1))),
        (40, (2, 2), (13, 1), on(b, z[:2, :2]))]))
    index = np.array([[3, 0, 12], [90, 5, 5]], dtype=np.int64)
    both("a gather by index", lambda b: b.take(on(b, x), index))
    both("a scatter-add by index", lambda b: b.scatter_add((7, 13), dtype, index, on(
        b, z[:2, :3]), unique=False))
    both("a scatter by unique index", lambda b: b.scatter_add((7, 13), dtype, np.array(
        [1, 7, 33]), on(b, y[:3]), unique=True))
    a3 = rng.normal(size=(2, 19, 37)).astype(dtype)
    b3 = rng.normal(size=(1, 37, 11)).astype(dtype)
    both("a matmul", lambda b: b.matmul(on(b, a3), on(b, b3)))
    both("a matmul of transposed operands", lambda b: b.matmul(
        on(b, np.ascontiguousarray(a3.transpose(0, 2, 1))),
        on(b, np.ascontiguousarray(b3.transpose(0, 2, 1))), True, True))
    both("a fill and an add", lambda b: b.full((5, 3), 2.5, dtype) + on(b, z[:5, :3]))
    return cases


def _op_cases(be: Backend, host: Any, dtype: Any, kind: list[str]) -> list[tuple[str, Any, Any]]:
    """Each op kernel's sample call on ``be`` (its OpenCL lowering, called directly) and on
    the numpy backend ``host`` (its numpy lowering): easyad's own ops (``ops:<real>``), or
    the one op of a module imported here (``op:<module>:<name>:<hash>:<real>``)."""
    import importlib

    import numpy as np

    from easyad import ops
    if kind[0] == "op":
        importlib.import_module(kind[1])
        chosen = [ops.get(kind[2])]
    else:
        chosen = [op for op in ops.OPS.values() if op.opencl is not None and
                  op.opencl.__module__.split(".")[0] == "easyad"]
    # the convolutions' route is chosen by shape, each route proven by a sample of its own:
    # never the one that the user's environment forces on every sample (the verdict is kept)
    os.environ.pop("EASYAD_OPENCL_CONV", None)
    rng = np.random.default_rng(25)
    cases = []
    for op in chosen:
        assert op.sample is not None and op.opencl is not None      # (register checks)
        samples = op.sample(rng, dtype)
        for k, (args, kwargs) in enumerate(samples if isinstance(samples, list)
                                           else [samples]):
            shape, params = op.rule(op.bind(kwargs), *(np.shape(a) for a in args))
            got = op.opencl(be, params, *(be.asarray(a, dtype) for a in args))
            want = host.op(op, params, [host.asarray(a, dtype) for a in args], shape, dtype)
            cases.append((f"op {op.name}" + (f" (sample {k})" if k else ""),
                          be.to_numpy(got), host.to_numpy(want)))
    return cases


def _replay_case(device: Any) -> tuple[str, Any, Any]:
    """The scalar replay kernel: f = sin(a) exp(b) + a^2.5 (a branch on a > b), its value and
    gradient at a few points against the derivatives by hand."""
    import numpy as np

    import easyad as ad
    from easyad.compiler.tape.render_cl import replay_gradient_opencl
    lst = ad.WengertList()
    a, b = lst.variable(0.7), lst.variable(0.3)
    out = ad.sin(a) * ad.exp(b) + (a ** 2.5 if a > b else b)
    X = np.array([[0.7, 0.3], [0.9, 0.1], [0.5, 0.2]])
    values, grads, _ = replay_gradient_opencl(lst._arrays(), [a.index, b.index], out.index, X,
                                              device)
    s, e = np.sin(X[:, 0]), np.exp(X[:, 1])
    want = np.column_stack([s * e + X[:, 0] ** 2.5, np.cos(X[:, 0]) * e
                            + 2.5 * X[:, 0] ** 1.5, s * e])
    return "the replay kernel", np.column_stack([values, grads]), want


# programs for the fused kernels: (name, f, input maker); each covers kinds of instructions
def _unary_all(x: Any) -> Any:
    import easyad as ad
    from easyad import _rules
    total = 0.0
    for rule in _rules.UNARY_RULES:
        t = 1.0 + x if rule.name == "acosh" else x
        total = total + ad.sum((-t if rule.name == "neg" else getattr(ad, rule.name)(t)) * x)
    return total


def _binary_all(p: Any) -> Any:
    import operator

    import easyad as ad
    from easyad import _rules
    ops = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "div": operator.truediv, "pow": operator.pow}
    x, y = p
    total = 0.0
    for rule in _rules.BINARY_RULES:
        total = total + ad.sum((ops.get(rule.name) or getattr(ad, rule.name))(x, y) * x)
    return total


def _structure(x: Any) -> Any:
    import numpy as np

    import easyad as ad
    index = np.arange(0, x.shape[0], 3)
    return (ad.amax(x) + ad.amin(x) * 2.0 + ad.sum(x * x)          # reductions to one
            + ad.sum(x[3:] * ad.exp(-x[:-3]))                        # a pad (slice adjoint)
            + ad.sum(x[index] * ad.cos(x[index]))                    # gathers
            + ad.sum(ad.where(x > 0.5, x ** 2, -x) + ad.maximum(x, 0.3) * ad.tanh(x))
            + ad.sum(ad.sin(x) * ad.sum(x) + x[5]))                  # broadcast numbers


def _fused_cases(device: Any, real: str, width: int) -> list[tuple[str, Any, Any]]:
    """Each program recorded on numpy and run there kernel by kernel (the reference), then
    bound to ``device``: fused into OpenCL kernels at ``width`` and run there (recording on
    the device would first build an eager kernel per operation: minutes, not seconds)."""
    import warnings

    import numpy as np

    import easyad as ad
    from easyad.compiler.program import fused_cl
    from easyad.errors import CompilerWarning
    dtype = np.dtype(REALS[real])
    rng = np.random.default_rng(25)
    n = 16 * 7 + 5                 # whole vectors of every width and a scalar rest
    x = rng.uniform(0.15, 0.85, n).astype(dtype)
    y = rng.uniform(0.2, 0.9, n).astype(dtype)
    v = rng.normal(size=n).astype(dtype)
    cases: list[tuple[str, Any, Any]] = []

    def flat(value: Any, grad: Any) -> Any:
        return np.concatenate([np.ravel(value)]
                              + [np.ravel(g) for g in ad._trees.flatten(grad)[0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilerWarning)   # kernels that did not build
        for name, f, arg in (("every unary rule", _unary_all, x),
                             ("every binary rule", _binary_all, (x, y)),
                             ("reductions, pads, gathers, selects", _structure, x)):
            F = ad.record(f, arg, tensor=True, fuse=False)
            want = flat(*F.value_and_gradient(arg))
            want_hvp = F.hvp(x, v) if f is _structure else None
            F._backend, F.fuse = device.backend, True
            F._bound.clear()
            cases.append((f"{name} (value and gradient)", flat(*F.value_and_gradient(arg)),
                          want))
            if want_hvp is not None:
                cases.append((f"{name} (a Hessian-vector product)", F.hvp(x, v), want_hvp))
            built = [step.spec.width for step in F._bound["gradient"].steps
                     if type(step) is fused_cl.Launch]
            if width and width not in built:
                raise AssertionError(f"{name}: no kernel was built {width} lanes wide "
                                     f"(widths {built})")
    return cases


def _prove(device: Any, kind: str) -> dict[str, Any]:
    import numpy as np

    from easyad.compiler.program import vector_cl
    from easyad.tensor import _devices
    from easyad.tensor._numpy import NumpyBackend
    parts = kind.split(":")
    real = parts[-1] if parts[0] == "op" else parts[1]
    be = device.backend
    if parts[0] in ("ops", "op"):
        cases = _op_cases(be, NumpyBackend(_devices.NUMPY), np.dtype(REALS[real]), parts)
        verdict: dict[str, Any] = {"ok": True, "problem": ""}
    elif parts[0] == "eager":
        cases = _eager_cases(be, NumpyBackend(_devices.NUMPY), np.dtype(REALS[real]))
        if real == "double":
            cases.append(_replay_case(device))
        verdict = {"ok": True, "problem": ""}
    else:
        width = int(parts[2])
        lanewise: frozenset[str] = frozenset()
        if width:
            try:
                lanewise = vector_cl.check_vector_math(be, real, width)
            except Exception:   # noqa: BLE001 (a check that does not build: trust none)
                lanewise = vector_cl.VECTOR_MATH
        vector_cl.forced[real] = (width, lanewise)
        cases = _fused_cases(device, real, width)
        verdict = {"ok": True, "problem": "", "lanewise": sorted(lanewise)}
    for what, got, want in cases:
        problem = _close(what, got, want, real)
        if problem:
            return {"ok": False, "problem": problem}
    return verdict


def main() -> None:
    request = json.loads(sys.stdin.read())
    import pyopencl as cl

    import easyad as ad
    from easyad.tensor import _devices
    ad.set_device("numpy")        # the references: eager numpy, whatever EASYAD_DEVICE says
    handle = cl.get_platforms()[request["platform"]].get_devices()[request["device"]]
    # the device as _devices would list it, without listing (no proof in a proof)
    device = _devices.Device("opencl:proof", "opencl", handle.name.strip(),
                             bool(handle.type & cl.device_type.GPU), True,
                             bool(handle.double_fp_config), "", "", handle)
    crash = {k.strip() for k in os.environ.get(CRASH_ENV, "").split(",")}

    def say(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()   # the parent learns which kind a crash happened on

    for kind in request["kinds"]:
        if kind in crash:     # as a driver's crash: the default action (LLVM handles it)
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        try:
            verdict = _prove(device, kind)
        except Exception as error:   # noqa: BLE001 (any failure is the kind's verdict)
            verdict = {"ok": False, "problem": f"{type(error).__name__}: "
                                               f"{_probe.first_log_line(str(error))}"}
        say({"kind": kind, "verdict": verdict})

"""Proofs of kernel kinds: no kind of kernel is built in this process before a child process
has built and run it on the same device and checked its numbers.

The device probe (``_probe``) builds one tiny kernel. A driver that passes it may still
crash on the kernels easyad really builds: PyPI's PoCL 3.0 (LLVM 14) on AVX-512 AMD EPYC
builds the fused kernels 8 doubles wide (its preferred width) and dies inside the user's
process, SIGSEGV in ``pocl_llvm_codegen`` or LLVM's "Cannot select", while 4 lanes work.
A crash cannot be caught, so it is kept out of this process: every *kind* of kernel is
proven first, in a child, by the real renderers on the real backend code:

- ``eager:<real>`` (real: ``float`` or ``double``): the eager backend's kernels, each kind
  through ``OpenCLBackend`` itself: every rule's value and adjoint (``render_map``, with
  operands of every layout: same shape, broadcast through strides, 0-d, scalar), bools and
  selects, reductions (one and several passes, axes brought together), strided gathers and
  scatters, ``take``/``put``, the matmul of the device's kind, pyopencl's fill, and for
  ``double`` the scalar replay kernel (``_replay_cl``).
- ``fused:<real>:<width>``: recorded programs fused into one OpenCL source each by
  ``_program_cl`` at that vector width (0: scalar kernels), after the vector-math check
  (``_program_cl._check_vector_math``, built only here): every rule in vector form,
  reductions to one number, a slice's adjoint (pad), gathers, selects and comparisons,
  broadcast numbers, a scalar rest, and a Hessian-vector product (tmul), each against
  eager numpy.

The verdicts are cached on disk next to the probe's (``kernel-proofs-v*.json``), keyed by
the device's identity (``_probe.device_key``: device, driver, the CPU's flags) and a hash
of the code that renders the kernels, so a changed renderer is proven anew. A child that
dies fails the kind it was proving (how it died, and the last line it printed). Who uses
the verdicts: ``_devices`` (a device whose eager kinds fail is not usable, or float32
only) and ``_program_cl.fused_width`` (the vector width of fused kernels: the widest
proven of 16, 8, 4, 2, then scalar kernels, then none: one kernel per instruction).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from easyad.tensor import _probe

# bump when a verdict's fields change (a changed proof or renderer changes the fingerprint)
PROOF_VERSION = 1
PROOF_TIMEOUT_S = 300.0
# for tests only: kinds (comma-separated) whose proof child kills itself with SIGSEGV, as
# a crashing driver does (read by the child, so it stands for a real crash end to end)
CRASH_ENV = "EASYAD_PROOF_CRASH"
REALS = {"float": "float32", "double": "float64"}
_PACKAGE = Path(__file__).resolve().parent.parent
# what renders or runs the proven kernels: a change to any of these proves again
_RENDERERS = ("_helpers.h", "_rules.py", "_expr.py", "tensor/_kernels.py", "tensor/_opencl.py",
              "tensor/_program.py", "tensor/_program_c.py", "tensor/_program_cl.py",
              "tensor/_replay_cl.py", "tensor/_proofs.py")


def cache_path() -> str:
    return os.path.join(os.path.dirname(_probe.cache_path()),
                        f"kernel-proofs-v{PROOF_VERSION}.json")


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of the code that renders and runs the kernels (read once per process)."""
    h = hashlib.sha256()
    for name in _RENDERERS:
        try:
            h.update((_PACKAGE / name).read_bytes())
        except OSError:
            h.update(b"missing " + name.encode())
    return h.hexdigest()[:16]


_lock = threading.Lock()
_known: dict[str, dict[str, Any]] = {}      # this process's verdicts, by cache key


def _valid(verdict: Any) -> bool:
    return isinstance(verdict, dict) and isinstance(verdict.get("ok"), bool) and \
        isinstance(verdict.get("problem", ""), str)


def caller_stacklevel() -> int:
    """The ``stacklevel`` of a warning issued by the caller of this function that points at
    the first frame outside easyad (the user's line, not easyad's internals)."""
    level, frame = 2, sys._getframe(2)
    root = str(_PACKAGE)
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame, level = frame.f_back, level + 1
    return level


_keys: dict[int, str] = {}


def _device_key(handle: Any, cl: Any) -> str:
    """``_probe.device_key``, worked out once per device in a process (it reads the CPU's
    flags)."""
    key = _keys.get(handle.int_ptr)
    if key is None:
        key = _keys[handle.int_ptr] = _probe.device_key(handle, cl)
    return key


def _where(handle: Any, cl: Any) -> tuple[int, int]:
    """The (platform, device) indices of ``handle`` in pyopencl's enumeration (the child
    finds the device by them)."""
    for p, platform in enumerate(cl.get_platforms()):
        for d, other in enumerate(platform.get_devices()):
            if other == handle:
                return p, d
    raise LookupError(f"OpenCL device {handle.name!r} is no longer listed")


def verdicts(handle: Any, kinds: list[str]) -> dict[str, dict[str, Any]]:
    """The verdict of each kind (``{"ok", "problem", ...}``) on the device ``handle``: from
    this process, else the disk, else proven now in child processes (and kept on disk)."""
    import pyopencl as cl
    prefix = f"{_device_key(handle, cl)}:{fingerprint()}:"
    with _lock:
        missing = [k for k in kinds if prefix + k not in _known]
        if missing:
            on_disk = _probe.read_cache(cache_path())
            for k in missing:
                if _valid(on_disk.get(prefix + k)):
                    _known[prefix + k] = on_disk[prefix + k]
            missing = [k for k in missing if prefix + k not in _known]
        if missing:
            try:
                platform, device = _where(handle, cl)
                found = prove(platform, device, missing)
            except LookupError as error:
                found = {k: {"ok": False, "problem": str(error)} for k in missing}
            _probe.write_cache({prefix + k: v for k, v in found.items()}, cache_path())
            _known.update({prefix + k: v for k, v in found.items()})
        return {k: _known[prefix + k] for k in kinds}


def forget() -> None:
    """Forget this process's verdicts (the disk's are read again)."""
    with _lock:
        _known.clear()


def _how(returncode: int | str) -> str:
    if isinstance(returncode, int) and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}" if isinstance(returncode, int) else returncode


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def prove(platform: int, device: int, kinds: list[str]) -> dict[str, dict[str, Any]]:
    """Verdicts for ``kinds`` on device ``device`` of platform ``platform``, each proven in
    a child process of its own: a kind passes only if its child also exits cleanly (PoCL
    may abort at exit over a program it built wrongly, after the numbers came back)."""
    return {kind: _prove_in_child(platform, device, kind) for kind in kinds}


def _prove_in_child(platform: int, device: int, kind: str) -> dict[str, Any]:
    root = str(_PACKAGE.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    request = {"platform": platform, "device": device, "kinds": [kind]}
    try:
        child = subprocess.run(
            [sys.executable, "-c", "from easyad.tensor._proofs import _child; _child()"],
            input=json.dumps(request), capture_output=True, text=True,
            timeout=PROOF_TIMEOUT_S, env=env)
        stdout, stderr, died = child.stdout, child.stderr, child.returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "problem": f"the proof did not finish in {PROOF_TIMEOUT_S:.0f} s"}
    verdict = None
    for line in stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue   # a driver printed on stdout
        if isinstance(message, dict) and message.get("kind") == kind and \
                _valid(message.get("verdict")):
            verdict = message["verdict"]
    said = _last_line(stderr)
    if died:
        when = " after its numbers came back" if verdict is not None else ""
        return {"ok": False, "problem": f"the driver crashed{when}: {_how(died)}"
                + (f"; its last words: {said}" if said else "")}
    if verdict is None:
        return {"ok": False, "problem": "the proof gave no verdict"
                + (f"; its last words: {said}" if said else "")}
    return verdict


# ---- the child: build, run and check each kind ----

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


def _eager_cases(be: Any, host: Any, dtype: Any) -> list[tuple[str, Any, Any]]:
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


def _replay_case(device: Any) -> tuple[str, Any, Any]:
    """The scalar replay kernel: f = sin(a) exp(b) + a^2.5 (a branch on a > b), its value and
    gradient at a few points against the derivatives by hand."""
    import numpy as np

    import easyad as ad
    from easyad.tensor._replay_cl import replay_gradient_opencl
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
            built = [rest[1].width for kind, *rest in F._bound["gradient"].steps
                     if kind == "kernel"]
            if width and width not in built:
                raise AssertionError(f"{name}: no kernel was built {width} lanes wide "
                                     f"(widths {built})")
    return cases


def _prove(device: Any, kind: str) -> dict[str, Any]:
    import numpy as np

    from easyad.tensor import _devices, _program_cl
    from easyad.tensor._numpy import NumpyBackend
    parts = kind.split(":")
    real = parts[1]
    be = device.backend
    if parts[0] == "eager":
        cases = _eager_cases(be, NumpyBackend(_devices.NUMPY), np.dtype(REALS[real]))
        if real == "double":
            cases.append(_replay_case(device))
        verdict: dict[str, Any] = {"ok": True, "problem": ""}
    else:
        width = int(parts[2])
        lanewise: frozenset[str] = frozenset()
        if width:
            try:
                lanewise = _program_cl._check_vector_math(be, real, width)
            except Exception:   # noqa: BLE001 (a check that does not build: trust none)
                lanewise = _program_cl._VECTOR_MATH
        _program_cl._forced[real] = (width, lanewise)
        cases = _fused_cases(device, real, width)
        verdict = {"ok": True, "problem": "", "lanewise": sorted(lanewise)}
    for what, got, want in cases:
        problem = _close(what, got, want, real)
        if problem:
            return {"ok": False, "problem": problem}
    return verdict


def _child() -> None:
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

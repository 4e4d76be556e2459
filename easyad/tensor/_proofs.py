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
  ``double`` the scalar replay kernel (``compiler/tape/render_cl.py``).
- ``fused:<real>:<width>``: recorded programs fused into one OpenCL source each by
  ``compiler.program.fused_cl`` at that vector width (0: scalar kernels), after the
  vector-math check (``compiler.program.vector_cl.check_vector_math``, built only here):
  every rule in vector form, reductions to one number, a slice's adjoint (pad), gathers,
  selects and comparisons, broadcast numbers, a scalar rest, and a Hessian-vector product
  (tmul), each against eager numpy.

The verdicts are cached on disk next to the probe's (``kernel-proofs-v*.json``), keyed by
the device's identity (``_probe.device_key``: device, driver, the CPU's flags) and a hash
of the code that renders the kernels, so a changed renderer is proven anew. A child that
dies fails the kind it was proving (how it died, and the last line it printed). Who uses
the verdicts: ``_devices`` (a device whose eager kinds fail is not usable, or float32
only) and ``compiler.program.vector_cl.fused_width`` (the vector width of fused kernels: the widest
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
              "tensor/_kernels_matmul.py", "tensor/_cl_memory.py", "tensor/_cl_matmul.py",
              "tensor/_cl_errors.py",
              "tensor/_program.py", "compiler/program/plan.py", "compiler/program/cstyle.py",
              "compiler/program/render_cl.py", "compiler/program/vector_cl.py",
              "compiler/program/fused_cl.py", "compiler/tape/render_cl.py", "compiler/dialect.py",
              "compiler/cstyle.py", "tensor/_proofs.py",
              "tensor/_proof_child.py")


def cache_path() -> str:
    return os.path.join(os.path.dirname(_probe.cache_path()),
                        f"kernel-proofs-v{PROOF_VERSION}.json")


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of the code that renders and runs the kernels (read once per process)."""
    h = hashlib.sha256()
    # the op table's modules hold the kernels of easyad's own ops (proven as "ops:<real>")
    names = [*_RENDERERS, *sorted(f"ops/{p.name}" for p in (_PACKAGE / "ops").glob("*.py"))]
    for name in names:
        try:
            h.update((_PACKAGE / name).read_bytes())
        except OSError:
            h.update(b"missing " + name.encode())
    return h.hexdigest()[:16]


def op_kind(op: Any, real: str) -> str:
    """The proof kind of an op's OpenCL kernel: easyad's own ops' kernels are proven
    together (``ops:<real>``, keyed by the fingerprint, which hashes easyad/ops); an op
    defined elsewhere by itself, keyed by its module's source (the child imports it)."""
    module = op.opencl.__module__
    if module.split(".")[0] == "easyad":
        return f"ops:{real}"
    source = sys.modules[module].__file__ if module in sys.modules else None
    try:
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:12] if source \
            else "nofile"
    except OSError:
        digest = "nofile"
    return f"op:{module}:{op.name}:{digest}:{real}"


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
            _probe.write_cache({prefix + k: v for k, v in found.items()}, cache_path(), _valid)
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
            [sys.executable, "-c", "from easyad.tensor._proof_child import main; main()"],
            input=json.dumps(request), capture_output=True, text=True,
            timeout=PROOF_TIMEOUT_S, env=env)
        stdout, stderr, died = child.stdout, child.stderr, child.returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "problem": f"the proof did not finish in {PROOF_TIMEOUT_S:.0f} s"}
    verdict = None
    for message in _probe.json_messages(stdout):
        if message.get("kind") == kind and _valid(message.get("verdict")):
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

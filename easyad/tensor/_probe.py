"""Proof that an OpenCL device works: build and run a tiny kernel, once per device and driver.

A listed device is no proof of a working one: PoCL 3.0 from PyPI (LLVM 14) lists CPUs it
cannot build kernels for ("unknown target CPU 'generic'" on CPUs its LLVM does not know).
So every device is probed by building and running a float32 and a float64 kernel and
checking the numbers. The probe runs in a child process, so a driver that crashes or aborts
takes the child, not the user's interpreter, and whatever it prints goes nowhere. Verdicts
are cached on disk keyed by the device's identity and driver version (and, for CPU devices,
the CPU's feature flags, as a home folder may be shared by different machines), so later
processes read a small JSON file instead of compiling anything.

This file is also the child's program (``python _probe.py`` reads a request on stdin): the
child imports nothing of easyad, only the standard library, numpy and pyopencl (the cache
functions, parent-side, import ``easyad._cache`` when called).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from typing import Any
from collections.abc import Callable, Iterator

# bump when the probe or the verdict's fields change: old verdicts are then ignored
PROBE_VERSION = 1

# y = x*x + sqrt(x) + 0.5: arithmetic, a builtin call and a store, in each precision
PROBE_SOURCES = {
    "float32": """
__kernel void easyad_probe(__global float *y, __global const float *x, const long n) {
    long i = get_global_id(0);
    if (i < n) y[i] = x[i] * x[i] + sqrt(x[i]) + 0.5f;
}""",
    "float64": """
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void easyad_probe(__global double *y, __global const double *x, const long n) {
    long i = get_global_id(0);
    if (i < n) y[i] = x[i] * x[i] + sqrt(x[i]) + 0.5;
}""",
}

PROBE_TIMEOUT_S = 300.0   # a first PoCL build compiles its kernel library: allow minutes

FIX_BUILD = ("install a driver that can build kernels for this device: on Debian/Ubuntu "
             "`sudo apt-get install pocl-opencl-icd` (PoCL built for every CPU), on Fedora "
             "`sudo dnf install pocl`, or the device vendor's OpenCL driver; then "
             "`python -m easyad devices` probes again")
FIX_FP64 = "use dtype=numpy.float32 on this device, or a device with float64 (cl_khr_fp64)"


def cache_path() -> str:
    """Where verdicts are kept: in easyad's private cache folder (``easyad._cache``:
    $EASYAD_CACHE_DIR, else $XDG_CACHE_HOME/easyad, else ~/.cache/easyad)."""
    from easyad import _cache     # here, not at the top: the child runs this file alone
    return os.path.join(_cache.root(), f"opencl-probe-v{PROBE_VERSION}.json")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def device_key(handle: Any, cl: Any) -> str:
    """A device's identity for the cache: platform, device and driver versions (and the CPU's
    flags for a CPU device), hashed."""
    platform = handle.platform
    parts = [platform.name, platform.version, handle.name, handle.version,
             handle.driver_version, str(int(handle.type))]
    if handle.type & cl.device_type.CPU:
        parts.append(_cpu_flags())
    return hashlib.sha256("\x1f".join(p.strip() for p in parts).encode()).hexdigest()[:32]


def valid_verdict(verdict: Any) -> bool:
    """Whether a cached probe verdict has its fields (a damaged one is probed again)."""
    return isinstance(verdict, dict) and all(
        isinstance(verdict.get(k), t) for k, t in
        (("usable", bool), ("fp64", bool), ("problem", str), ("fix", str)))


def read_cache(path: str | None = None) -> dict[str, Any]:
    """The verdicts kept in ``path`` (default: the probe's file); {} where the file is
    missing, unreadable, not a JSON object, or not this user's own file in a private
    folder (a verdict says which kernels are safe to build in this process, so a planted
    one could crash it: such a file means prove again, as a corrupted one does)."""
    from easyad import _cache
    path = path or cache_path()
    try:
        _cache.private_directory()
        data = json.loads(_cache.read_private(path))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(verdicts: dict[str, Any], path: str | None = None,
                valid: Callable[[Any], bool] = valid_verdict) -> None:
    """Merge ``verdicts`` into the cache file ``path`` (default: the probe's), keeping only
    entries ``valid`` accepts (damaged or outdated ones are dropped), written atomically
    into the private cache folder; an unusable cache is no error: the next process proves
    again."""
    from easyad import _cache
    path = path or cache_path()
    try:
        folder = _cache.private_directory()
        data = {k: v for k, v in read_cache(path).items() if valid(v)}
        data.update(verdicts)
        _cache.write_atomic(folder, os.path.basename(path),
                            json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError:
        pass


def json_messages(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects a child printed, one a line (a driver may print on stdout too:
    other lines are skipped)."""
    for line in text.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            yield message


# a compiler message's source location: '<kernel>:1:56: ', 'input.cl:3:1: '
_LOCATION = re.compile(r"^\S+?:\d+:\d+:\s*")


def first_log_line(message: str) -> str:
    """The line of a build failure that says why: the first 'error' line of the build log,
    else its first non-empty line."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    body = lines
    for k, ln in enumerate(lines):   # pyopencl: "... Build on <device>:" then the log
        if ln.startswith("Build on "):
            body = lines[k + 1:]
            break
    for ln in body:
        if "error" in ln.lower():
            # the source location before the message ("<kernel>:1:56: error: ..." from
            # NVIDIA's compiler) says nothing to the user: one form for every driver
            return _LOCATION.sub("", ln, count=1)
    return body[0] if body else (lines[0] if lines else "unknown failure")


def probe(requests: list[dict[str, Any]], sources: dict[str, str] | None = None,
          fault: str | None = None) -> dict[str, dict[str, Any]]:
    """Verdicts for the devices of ``requests`` (each ``{"key", "platform", "device"}``:
    indices in pyopencl's enumeration), probed in child processes. A child that dies while
    probing a device fails that device (with how it died) and the rest are probed again.
    ``sources`` and ``fault`` inject failures for tests."""
    verdicts: dict[str, dict[str, Any]] = {}
    pending = list(requests)
    while pending:
        request = {"devices": pending, "sources": sources or PROBE_SOURCES, "fault": fault}
        try:
            child = subprocess.run([sys.executable, os.path.abspath(__file__)],
                                   input=json.dumps(request), capture_output=True, text=True,
                                   timeout=PROBE_TIMEOUT_S)
            out = child.stdout
            died: int | str | None = None if child.returncode == 0 else child.returncode
        except subprocess.TimeoutExpired as timeout:
            out = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (
                timeout.stdout or "")
            died = f"timed out after {PROBE_TIMEOUT_S:.0f} s"
        started = None
        for message in json_messages(out):
            if "start" in message:
                started = message["start"]
            elif "verdict" in message:
                verdicts[message["key"]] = message["verdict"]
                started = None
        pending = [r for r in pending if r["key"] not in verdicts]
        if pending and died is not None:
            culprit = started or pending[0]["key"]
            how = (f"killed by signal {-died}" if isinstance(died, int) and died < 0 else
                   f"exited with status {died}" if isinstance(died, int) else died)
            verdicts[culprit] = {"usable": False, "fp64": False,
                                 "problem": f"the driver crashed while probing ({how})",
                                 "fix": FIX_BUILD}
            pending = [r for r in pending if r["key"] != culprit]
        elif pending:   # the child ended normally without a verdict: should not happen
            for r in pending:
                verdicts[r["key"]] = {"usable": False, "fp64": False,
                                      "problem": "the probe gave no verdict", "fix": FIX_BUILD}
            pending = []
    return verdicts


FP32_CORRECTLY_ROUNDED = "-cl-fp32-correctly-rounded-divide-sqrt"


def build_options(cl: Any, devices: Any) -> list[str]:
    """The options every easyad OpenCL program is built with: float division and sqrt
    correctly rounded where every device of the build offers it (NVIDIA's default allows
    2.5 ulp, so a float32 kernel's x / y differed from numpy's in the last bit; PoCL's CPU
    devices round correctly either way). Where a device does not offer it, its own
    rounding stays (docs/tensors.md)."""
    wanted = cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
    try:
        ok = all(d.single_fp_config & wanted for d in devices)
    except cl.Error:      # a driver that cannot say: build as before
        return []
    return [FP32_CORRECTLY_ROUNDED] if ok and devices else []


# ---- the child ----

def _run_one(cl: Any, np: Any, handle: Any, source: str, dtype: Any) -> str | None:
    """None if ``source`` builds and computes the right numbers on ``handle``, else why not."""
    context = cl.Context([handle])
    queue = cl.CommandQueue(context)
    try:
        program = cl.Program(context, source).build(build_options(cl, [handle]))
    except cl.Error as error:
        return first_log_line(str(error))
    n = 1000
    x = np.linspace(0.0, 4.0, n).astype(dtype)
    mf = cl.mem_flags
    x_buf = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    y_buf = cl.Buffer(context, mf.WRITE_ONLY, x.nbytes)
    kernel = program.easyad_probe
    kernel.set_scalar_arg_dtypes([None, None, np.int64])
    kernel(queue, (n,), None, y_buf, x_buf, n)
    y = np.empty_like(x)
    cl.enqueue_copy(queue, y, y_buf)
    queue.finish()
    expected = x * x + np.sqrt(x) + dtype(0.5)
    if not np.allclose(y, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=0):
        worst = int(np.argmax(np.abs(y - expected)))
        return (f"the probe kernel computed wrong numbers ({y[worst]!r} instead of "
                f"{expected[worst]!r})")
    return None


def _verdict(cl: Any, np: Any, handle: Any, sources: dict[str, str]) -> dict[str, Any]:
    try:
        problem32 = _run_one(cl, np, handle, sources["float32"], np.float32)
    except Exception as error:   # any failure of the driver is the device's verdict
        problem32 = f"{type(error).__name__}: {first_log_line(str(error))}"
    if problem32 is not None:
        return {"usable": False, "fp64": False, "problem": problem32, "fix": FIX_BUILD}
    if not handle.double_fp_config:
        return {"usable": True, "fp64": False, "problem": "no float64 (cl_khr_fp64)",
                "fix": FIX_FP64}
    try:
        problem64 = _run_one(cl, np, handle, sources["float64"], np.float64)
    except Exception as error:
        problem64 = f"{type(error).__name__}: {first_log_line(str(error))}"
    if problem64 is not None:
        return {"usable": True, "fp64": False, "problem": f"float64 kernels fail: {problem64}",
                "fix": FIX_FP64}
    return {"usable": True, "fp64": True, "problem": "", "fix": ""}


def _child() -> None:
    request = json.loads(sys.stdin.read())
    import numpy as np
    import pyopencl as cl
    platforms = cl.get_platforms()

    def say(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()   # the parent learns which device a crash happened on

    for r in request["devices"]:
        say({"start": r["key"]})
        if request.get("fault") == "abort":
            os.abort()
        handle = platforms[r["platform"]].get_devices()[r["device"]]
        say({"key": r["key"], "verdict": _verdict(cl, np, handle, request["sources"])})


if __name__ == "__main__":
    _child()

"""Devices: where tensors live and their kernels run.

``numpy`` (the host) is always there. With the ``opencl`` extra (pyopencl) every OpenCL
device that passes the probe (``_probe``: a tiny kernel built and run once per device and
driver, the verdict cached on disk) is one more. A device that fails the probe is left out
of ``devices()``; ``devices(include_unusable=True)`` and ``device_report()`` show it with
the reason and the fix. Nothing here runs at ``import easyad``: OpenCL is looked at the
first time a device is asked for.

The device of a new tensor is its ``device=`` argument, else the one ``set_device`` chose,
else the ``EASYAD_DEVICE`` environment variable, else numpy. A device is named by a spec:
``"numpy"``, ``"opencl"`` (the best working OpenCL device: a GPU with float64, else a CPU
with float64, else any working one), ``"opencl:N"`` (the N-th OpenCL device found, in
pyopencl's order; the numbering counts unusable devices too, so it does not change when a
probe verdict does), or a ``Device``.
"""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from easyad.errors import DeviceError, KernelFallbackWarning
from easyad.tensor import _probe, _proofs

FIX_NO_OPENCL = ("install the 'opencl' extra (pip install 'easyad[opencl]': pyopencl and a "
                 "CPU driver) and, where PyPI's PoCL cannot build kernels for this CPU, the "
                 "system's PoCL (Debian/Ubuntu: sudo apt-get install pocl-opencl-icd), or "
                 "use device='numpy'")


@dataclass(frozen=True)
class Device:
    """One place tensors can live: ``name`` is the spec that selects it.

    ``usable`` says whether it passed the probe; if not, ``problem`` says why (the first line
    of the build log) and ``fix`` what to do. ``fp64``: float64 kernels work there.

    >>> import easyad as ad
    >>> [d.name for d in ad.devices()][0]       # numpy is always there
    'numpy'
    """

    name: str                       # "numpy", "opencl:0", ...
    kind: str                       # "numpy" or "opencl"
    description: str
    is_gpu: bool = False
    usable: bool = True
    fp64: bool = True
    problem: str = ""
    fix: str = ""
    _handle: Any = field(default=None, repr=False, compare=False)  # pyopencl.Device

    def __str__(self) -> str:
        return self.name

    @property
    def backend(self) -> Any:
        """The backend object that stores this device's buffers and runs its kernels."""
        if not self.usable:
            raise DeviceError(f"device {self.name} ({self.description}) is not usable: "
                              f"{self.problem}. Fix: {self.fix}", device=self)
        return _backend_of(self)

    @property
    def live_buffers(self) -> int:
        """Buffers allocated on this device and not yet released. On the host (numpy)
        device they are counted from the first read of this property on (counting costs
        every operation a weak reference, so it starts when a memory check asks)."""
        return int(self.backend.live_buffers)


NUMPY = Device("numpy", "numpy", "numpy on the host")

# why OpenCL as a whole is missing (no pyopencl, no platform), for the report and errors
_missing: list[str] = []


@functools.lru_cache(maxsize=1)
def _opencl_devices() -> tuple[Device, ...]:
    """Every OpenCL device found, each with its probe verdict (probing the new ones)."""
    _missing.clear()
    try:
        import pyopencl as cl
    except Exception as error:   # not installed, or its ICD loader is broken: no OpenCL
        _missing.append(f"pyopencl cannot be imported ({type(error).__name__}: {error})")
        return ()
    try:
        platforms = cl.get_platforms()
    except Exception as error:   # no platform at all (pyopencl raises LogicError)
        _missing.append(f"no OpenCL platform ({_probe.first_log_line(str(error))})")
        return ()
    found: list[dict[str, Any]] = []
    for p, platform in enumerate(platforms):
        try:
            handles = platform.get_devices()
        except Exception:
            continue
        for d, handle in enumerate(handles):
            found.append({"key": _probe.device_key(handle, cl), "platform": p, "device": d,
                          "handle": handle, "platform_name": platform.name.strip()})
    if not found:
        _missing.append("OpenCL platforms are installed but list no device")
    cached = {k: v for k, v in _probe.read_cache().items() if _probe.valid_verdict(v)}
    new = [{k: f[k] for k in ("key", "platform", "device")} for f in found
           if f["key"] not in cached]
    if new:
        verdicts = _probe.probe(new)
        _probe.write_cache(verdicts)
        cached.update(verdicts)
    out = []
    for i, f in enumerate(found):
        handle, v = f["handle"], dict(cached[str(f["key"])])
        description = (f"{handle.name.strip()} ({f['platform_name']}, "
                       f"driver {handle.driver_version.strip()})")
        if v["usable"]:
            _prove_eager_kernels(f"opencl:{i}", description, handle, v)
        out.append(Device(f"opencl:{i}", "opencl", description,
                          bool(handle.type & cl.device_type.GPU), bool(v["usable"]),
                          bool(v["fp64"]), str(v["problem"]), str(v["fix"]), handle))
    return tuple(out)


def _prove_eager_kernels(name: str, description: str, handle: Any, v: dict[str, Any]) -> None:
    """Narrow the probe's verdict ``v`` by the proofs of the eager kernel kinds (``_proofs``:
    every kind the backend builds, built and run in a child process first): a device
    whose float32 kernels fail is not usable, one whose float64 kernels fail is float32
    only, each with one KernelFallbackWarning."""
    kinds = ["eager:float"] + (["eager:double"] if v["fp64"] else [])
    proofs = _proofs.verdicts(handle, kinds)
    failed = proofs["eager:float"] if not proofs["eager:float"]["ok"] else \
        proofs.get("eager:double", {"ok": True})
    if failed["ok"]:
        return
    single = proofs["eager:float"]["ok"]
    precision = "float64" if single else "float32"
    v.update(usable=single, fp64=False,
             problem=f"its {precision} kernels failed their proof: {failed['problem']}",
             fix=_probe.FIX_FP64 if single else _probe.FIX_BUILD)
    instead = ("float32 tensors only there" if single else
               "it is left out of devices(): tensors stay on numpy unless another device works")
    warnings.warn(f"OpenCL device {name} ({description}): {v['problem']} (proven in a child "
                  f"process, so the driver could not crash this one); {instead}. Fix: "
                  f"{v['fix']}; verdicts are kept in {_proofs.cache_path()} (delete it to "
                  f"prove again)", KernelFallbackWarning, stacklevel=_proofs.caller_stacklevel())


def rescan() -> None:
    """Forget the devices found and the kernel proofs' verdicts of this process (the next
    question looks again; the verdicts cached on disk stay)."""
    _opencl_devices.cache_clear()
    _proofs.forget()


def devices(include_unusable: bool = False) -> list[Device]:
    """The devices tensors can use: numpy first, then each OpenCL device that passed the
    probe. With ``include_unusable=True`` also the OpenCL devices that failed it (their
    ``problem`` and ``fix`` say why and what to do).

    >>> import easyad as ad
    >>> ad.devices()[0].name
    'numpy'
    >>> all(d.usable for d in ad.devices())
    True
    """
    return [NUMPY, *(d for d in _opencl_devices() if include_unusable or d.usable)]


def device_report() -> str:
    """A readable list of every device found, the unusable ones with their reason and fix
    (``python -m easyad devices`` prints it).

    >>> import easyad as ad
    >>> ad.device_report().splitlines()[0]
    'numpy: numpy on the host'
    """
    lines = [f"{NUMPY.name}: {NUMPY.description}"]
    for d in _opencl_devices():
        if d.usable:
            note = "" if d.fp64 else f" [float32 only: {d.problem}; {d.fix}]"
            lines.append(f"{d.name}: {d.description}{' GPU' if d.is_gpu else ''}{note}")
        else:
            lines.append(f"{d.name}: {d.description} -- NOT USABLE: {d.problem}\n"
                         f"    fix: {d.fix}")
    if _missing:
        lines.append(f"OpenCL: {_missing[0]}\n    fix: {FIX_NO_OPENCL}")
    elif not any(d.usable for d in _opencl_devices()):
        lines.append(f"OpenCL: no working device\n    fix: {FIX_NO_OPENCL}")
    return "\n".join(lines)


def _no_opencl_error(spec: str) -> DeviceError:
    failed = [d for d in _opencl_devices() if not d.usable]
    why = ("; ".join(f"{d.name} ({d.description}): {d.problem}" for d in failed)
           or (_missing[0] if _missing else "no OpenCL device found"))
    fix = failed[0].fix if failed else FIX_NO_OPENCL
    return DeviceError(f"no working OpenCL device for {spec!r}: {why}. Fix: {fix}")


def find_device(spec: Any) -> Device:
    """The Device a spec names (see the module docstring). ValueError for a name that names
    nothing; DeviceError if it names an OpenCL device that does not work."""
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a device is a Device or a name such as 'numpy' or 'opencl', "
                        f"got {type(spec).__name__}")
    name = spec.strip().lower()
    if name in ("numpy", "cpu-numpy", "host"):
        return NUMPY
    cl_devices = _opencl_devices()
    if name == "opencl":
        working = [d for d in cl_devices if d.usable]
        if not working:
            raise _no_opencl_error(spec)
        return min(working, key=lambda d: (not d.fp64, not d.is_gpu))
    for d in cl_devices:
        if d.name == name:
            if not d.usable:
                d.backend  # raises DeviceError with the reason and the fix
            return d
    known = ", ".join(d.name for d in devices(include_unusable=True))
    raise ValueError(f"no device {spec!r}; devices: {known}")


_chosen: list[Device] = []


def set_device(device: Any) -> Device:
    """Make ``device`` (a Device or a spec such as ``"opencl"``) the default for new
    tensors; returns it. ``"opencl"`` picks a working GPU, else a working CPU device, and
    raises DeviceError (with the reason and what to install) when none works.

    >>> import easyad as ad
    >>> previous = ad.get_device()
    >>> ad.set_device("numpy").name
    'numpy'
    >>> _ = ad.set_device(previous)
    """
    d = find_device(device)
    if not d.usable:
        d.backend  # raises DeviceError
    _chosen[:] = [d]
    return d


def get_device() -> Device:
    """The device new tensors go to when none is given.

    >>> import easyad as ad
    >>> ad.get_device().kind in ("numpy", "opencl")
    True
    """
    if _chosen:
        return _chosen[0]
    spec = os.environ.get("EASYAD_DEVICE", "").strip()
    return find_device(spec) if spec else NUMPY


def resolve(device: Any = None) -> Any:
    """The backend for ``device`` (None: the default device)."""
    return (get_device() if device is None else find_device(device)).backend


@functools.lru_cache(maxsize=None)
def _backend_of(device: Device) -> Any:
    if device.kind == "numpy":
        from easyad.tensor._numpy import NumpyBackend
        return NumpyBackend(device)
    from easyad.tensor._opencl import OpenCLBackend
    return OpenCLBackend(device)

"""Device discovery and device failures (issue 11): every OpenCL device is proved by a probe
kernel (cached on disk), a device that fails is listed with its reason and fix but never
used, and no pyopencl exception reaches the user. Broken devices are made on purpose: a
probe kernel that cannot build (a fault injected at the probe, which is the same path as a
driver that cannot build for the CPU), a child that aborts, and only PyPI's PoCL visible
(broken on CPUs its LLVM does not know, such as AVX-512 AMD EPYC)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import easyad as ad
from easyad.tensor import _devices, _probe, _proofs

pyopencl = pytest.importorskip("pyopencl")

BROKEN_SOURCE = "__kernel void easyad_probe(__global float *y) { y[0] = undeclared_name; }"


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty verdict cache, and device lists looked up again (before and after)."""
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path))
    _devices.rescan()
    yield tmp_path
    _devices.rescan()


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_import_needs_no_opencl():
    result = run_python("import sys, easyad\nassert 'pyopencl' not in sys.modules\n"
                        "assert 'easyad.tensor._opencl' not in sys.modules")
    assert result.returncode == 0, result.stderr


def test_verdicts_are_cached_per_device(fresh_cache, monkeypatch):
    found = ad.devices(include_unusable=True)
    opencl = [d for d in found if d.kind == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL platform at all")
    cached = json.loads((fresh_cache / os.path.basename(_probe.cache_path())).read_text())
    assert len(cached) == len(opencl)
    assert sorted(v["usable"] for v in cached.values()) == sorted(d.usable for d in opencl)

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again although every verdict is cached")
    monkeypatch.setattr(_probe, "probe", no_probe)
    _devices.rescan()
    assert ad.devices(include_unusable=True) == found


def test_a_device_that_cannot_build_kernels_is_left_out(fresh_cache, monkeypatch):
    working = [d.name for d in ad.devices() if d.kind == "opencl"]   # with the real probe
    _devices.rescan()
    fresh_cache.joinpath(os.path.basename(_probe.cache_path())).unlink()
    monkeypatch.setitem(_probe.PROBE_SOURCES, "float32", BROKEN_SOURCE)
    everything = ad.devices(include_unusable=True)
    opencl = [d for d in everything if d.kind == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL platform at all")
    assert [d.name for d in ad.devices()] == ["numpy"]        # none passed the probe
    for d in opencl:
        assert not d.usable and "pocl-opencl-icd" in d.fix
        if d.name in working:   # it built the real probe: now the build log's error line
            assert "undeclared_name" in d.problem and d.problem.startswith("error")
    report = ad.device_report()
    assert "NOT USABLE" in report and "undeclared_name" in report and "fix:" in report
    with pytest.raises(ad.DeviceError, match="no working OpenCL device") as caught:
        ad.set_device("opencl")
    assert all(d.name in str(caught.value) and d.problem in str(caught.value) for d in opencl)
    with pytest.raises(ad.DeviceError, match="not usable.*Fix:"):
        ad.set_device(opencl[0].name)
    with pytest.raises(ad.DeviceError):
        ad.Tensor.constant(np.ones(3), device=opencl[0])
    assert ad.get_device().name == "numpy"                    # nothing changed
    lst = ad.WengertList()                                    # numpy tensors still work
    t = ad.Tensor.variable(np.arange(3.0), lst)
    np.testing.assert_array_equal(ad.sum(t * t).derivatives()[t], [0.0, 2.0, 4.0])


def test_a_probe_that_crashes_fails_only_that_device():
    platforms = pyopencl.get_platforms()
    requests = [{"key": f"k{p}.{d}", "platform": p, "device": d}
                for p, platform in enumerate(platforms)
                for d, _ in enumerate(platform.get_devices())]
    if not requests:
        pytest.skip("no OpenCL device at all")
    verdicts = _probe.probe(requests, fault="abort")
    assert set(verdicts) == {r["key"] for r in requests}      # each child died on its first
    for v in verdicts.values():
        assert not v["usable"] and "crashed" in v["problem"] and "signal 6" in v["problem"]


def test_build_log_first_line():
    message = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed\n\n"
               "Build on <pyopencl.Device 'pthread-AMD EPYC'>:\n\n"
               "warning: something harmless\nerror: unknown target CPU 'generic'\nmore")
    assert _probe.first_log_line(message) == "error: unknown target CPU 'generic'"
    assert _probe.first_log_line("just one line") == "just one line"


def test_only_pypi_pocl_visible(tmp_path):
    """PyPI's PoCL alone (pyopencl's wheel loads it even with no system driver): it either
    works, or (on a CPU its LLVM does not know) is explained and refused; numpy tensors
    work either way."""
    empty = tmp_path / "vendors"
    empty.mkdir()
    code = """
import numpy as np, easyad as ad
lst = ad.WengertList()
t = ad.Tensor.variable(np.arange(3.0), lst)
assert ad.sum(t * t).derivatives()[t].tolist() == [0.0, 2.0, 4.0]
cl = [d for d in ad.devices(include_unusable=True) if d.kind == "opencl"]
if not cl:
    print("NO PYPI POCL")
elif cl[0].usable:
    assert ad.set_device("opencl").name == cl[0].name
    x = ad.Tensor.variable(np.arange(3.0), ad.WengertList())
    print("WORKS", ad.sum(x * x).derivatives()[x].tolist())
else:
    assert [d.name for d in ad.devices()] == ["numpy"]
    assert "NOT USABLE" in ad.device_report() and cl[0].problem in ad.device_report()
    try:
        ad.set_device("opencl")
    except ad.DeviceError as e:
        assert cl[0].problem in str(e) and "pocl-opencl-icd" in str(e), e
        print("REFUSED", cl[0].problem)
    else:
        raise AssertionError("set_device('opencl') accepted a broken device")
"""
    # the session's kernel proofs, keyed by device: a device seen only here is proven anew
    (tmp_path / "cache").mkdir()
    if os.path.exists(_proofs.cache_path()):
        shutil.copy(_proofs.cache_path(), tmp_path / "cache")
    result = run_python(code, {"OCL_ICD_VENDORS": str(empty),
                               "EASYAD_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("NO PYPI POCL"):
        pytest.skip("this pyopencl brings no PoCL of its own (the system's driver only)")
    assert result.stdout.startswith(("WORKS [0.0, 2.0, 4.0]", "REFUSED"))
    assert result.stderr == ""                     # nothing printed, nothing at exit


def test_devices_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "easyad", "devices"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("numpy: numpy on the host")
    with_opencl = subprocess.run([sys.executable, "-m", "easyad", "devices",
                                  "--require-opencl"], capture_output=True, text=True,
                                 timeout=300)
    working = any(d.kind == "opencl" for d in ad.devices())
    assert with_opencl.returncode == (0 if working else 1)


# ---- failures of a working device: DeviceErrors, nothing recorded, earlier results kept ----

def test_out_of_device_memory(opencl_device):
    lst = ad.WengertList()
    a = ad.Tensor.variable(np.ones((10**6, 1)), lst, device=opencl_device)
    before = ad.sum(a * 2.0)
    length = len(lst)
    b = ad.Tensor.constant(np.ones((1, 10**6)), device=opencl_device)
    with pytest.raises(ad.DeviceError, match="out of device memory.*Fix:") as caught:
        a * b                                       # 10^12 elements: no device holds that
    assert opencl_device in str(caught.value) and caught.value.operation.startswith("map")
    assert len(lst) == length                       # the failed product recorded nothing
    assert before.number == 2.0e6                   # ad.sum of a tensor is a Record
    np.testing.assert_array_equal(before.derivatives()[a], np.full((10**6, 1), 2.0))


def test_a_lost_device_is_a_device_error(opencl_device, monkeypatch):
    import pyopencl.array as cl_array
    t = ad.Tensor.constant(np.arange(4.0), device=opencl_device)

    def lost(self, *args, **kwargs):
        record = pyopencl._cl._ErrorRecord("clEnqueueReadBuffer",
                                           pyopencl.status_code.INVALID_COMMAND_QUEUE,
                                           "the queue is gone")
        raise pyopencl.LogicError(record)
    monkeypatch.setattr(cl_array.Array, "get", lost)
    with pytest.raises(ad.DeviceError, match="lost or reset.*restart"):
        t.value
    monkeypatch.undo()
    np.testing.assert_array_equal(t.value, np.arange(4.0))


def test_a_kernel_that_fails_to_build_is_a_device_error(opencl_device, monkeypatch, capfd):
    from easyad.tensor import _kernels
    t = ad.Tensor.constant(np.arange(4.0), device=opencl_device)
    render = _kernels.render_map

    def broken(label, *args, **kwargs):   # hypot's kernel only: a line that is not C
        source = render(label, *args, **kwargs)
        return source + "\nnot_a_type broken;\n" if label == "hypot" else source
    monkeypatch.setattr(_kernels, "render_map", broken)
    # the backend's prepared maps forgotten: another test in this process (the suite runs a
    # file to a process, in any order) may have launched hypot here before
    monkeypatch.setattr(t._backend, "_maps", {})
    monkeypatch.setattr(t._backend, "_rule_kernels", {}, raising=False)
    with pytest.raises(ad.DeviceError, match="building the OpenCL kernel easyad_hypot.*Fix:"):
        ad.hypot(t, 1.0)
    captured = capfd.readouterr()
    assert "warning" not in captured.err and "error" not in captured.err   # nothing leaked


def test_no_float64_device_refuses_float64_only(opencl_device):
    device = ad.devices()[[d.name for d in ad.devices()].index(opencl_device)]
    single = dataclasses.replace(device, fp64=False, problem="no float64 (cl_khr_fp64)",
                                 fix=_probe.FIX_FP64)
    with pytest.raises(ad.DeviceError, match="cannot run float64.*float32"):
        ad.Tensor.constant(np.ones(3), device=single)
    x = ad.Tensor.constant(np.ones(3, dtype=np.float32), device=single)
    assert (x * 2.0).value.tolist() == [2.0, 2.0, 2.0]


def test_kernel_builds_print_nothing(opencl_device):
    """A run that builds many kernels (every elementwise rule) leaves stderr empty, at exit
    too (PoCL printed '1 warning generated.' and, for a bad build, aborted at exit)."""
    code = f"""
import numpy as np, easyad as ad
x = ad.Tensor.constant(np.linspace(0.1, 0.9, 5), device={opencl_device!r})
for f in (ad.sin, ad.exp, ad.sqrt, ad.tanh, ad.erf, ad.cbrt, ad.asin, ad.log1p):
    f(x).value
(x ** 2.5).value, ad.hypot(x, x).value, ad.maximum(x, 0.5).value
"""
    result = run_python(code)
    assert result.returncode == 0 and result.stderr == "", result.stderr

"""Kernel kinds proven in a child process before this one builds them (issue 24: a driver that
crashes on a kind of kernel, as PyPI's PoCL 3.0 does on 8-lane double vectors on AVX-512
AMD EPYC, must not take the user's process or the test run with it). A crash is simulated
end to end: EASYAD_PROOF_CRASH makes the proof's child kill itself with SIGSEGV, as the
driver does. Each test works on a copy of the session's verdicts (so only the kinds it
crashes are proven again), and forgets this process's verdicts before and after."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad.compiler.program import fused_cl, vector_cl
from easyad.tensor import _devices, _probe, _proof_child, _proofs
from easyad.tensor._program import BoundProgram

pytestmark = pytest.mark.skipif(not [d for d in ad.devices() if d.kind == "opencl"],
                                reason="no working OpenCL device")


@pytest.fixture
def proof_cache(tmp_path, monkeypatch):
    """A cache folder holding the session's verdicts; EASYAD_CACHE_DIR points there."""
    for path in (_probe.cache_path(), _proofs.cache_path()):
        if os.path.exists(path):
            shutil.copy(path, tmp_path / os.path.basename(path))
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path))
    _proofs.forget()
    yield tmp_path
    _proofs.forget()
    _devices.rescan()


def _proof_file(cache):
    return cache / os.path.basename(_proofs.cache_path())


def _drop(cache, kind):
    """Remove the verdicts of ``kind`` (any device) from the copied cache."""
    path = _proof_file(cache)
    data = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({k: v for k, v in data.items() if not k.endswith(":" + kind)}))


def _fallbacks(caught):
    return [w for w in caught if issubclass(w.category, ad.KernelFallbackWarning)]


def _cpu_backend():
    for d in ad.devices():
        if d.kind == "opencl" and not d.is_gpu and d.fp64:
            return d.backend
    pytest.skip("vector kernels are built for CPU OpenCL devices with float64 only")


def _f(x):
    return ad.sum(ad.sin(x) * ad.exp(x) + x * x)


def _f_gradient(x):            # by hand
    return np.cos(x) * np.exp(x) + np.sin(x) * np.exp(x) + 2 * x


def _widths(F):
    return [step.spec.width for step in F._bound["gradient"].steps
            if isinstance(step, fused_cl.Launch)]


def test_a_width_whose_proof_crashes_falls_back_with_one_warning(proof_cache, monkeypatch):
    be = _cpu_backend()
    _drop(proof_cache, "fused:double:2")
    monkeypatch.setenv(vector_cl.VECTOR_ENV, "2")
    monkeypatch.setenv(_proofs.CRASH_ENV, "fused:double:2")
    monkeypatch.setattr(be, "_fused_width", {}, raising=False)    # decided anew here
    x = np.linspace(0.1, 1.9, 37)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F = ad.record(_f, x, device=be.device, tensor=True)
        value, gradient = F.value_and_gradient(x)
        G = ad.record(lambda x: ad.sum(ad.cos(x) * x), x, device=be.device, tensor=True)
        G.gradient(x)                            # the same fallback: no second warning
    (warning,) = _fallbacks(caught)
    message = str(warning.message)
    assert "fused float64 kernels failed their proof with 2-lane vectors" in message
    assert "SIGSEGV" in message and "scalar loops instead" in message
    assert f"{vector_cl.VECTOR_ENV}=N" in message and "pocl-opencl-icd" in message
    assert _widths(F) and set(_widths(F)) == {0}
    np.testing.assert_allclose(value, np.sum(np.sin(x) * np.exp(x) + x * x), rtol=1e-12)
    np.testing.assert_allclose(gradient, _f_gradient(x), rtol=1e-12)
    np.testing.assert_allclose(G.gradient(x), np.cos(x) - x * np.sin(x), rtol=1e-12)
    kept = json.loads(_proof_file(proof_cache).read_text())
    (crashed,) = [v for k, v in kept.items() if k.endswith(":fused:double:2")]
    assert crashed["ok"] is False and "killed by signal 11 (SIGSEGV)" in crashed["problem"]


def test_no_fused_kind_proven_runs_one_kernel_per_instruction(proof_cache, monkeypatch):
    be = _cpu_backend()
    _drop(proof_cache, "fused:double:2")
    _drop(proof_cache, "fused:double:0")
    monkeypatch.setenv(vector_cl.VECTOR_ENV, "2")
    monkeypatch.setenv(_proofs.CRASH_ENV, "fused:double:2,fused:double:0")
    monkeypatch.setattr(be, "_fused_width", {}, raising=False)
    x = np.linspace(0.1, 1.9, 37)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F = ad.record(_f, x, device=be.device, tensor=True)
        gradient = F.gradient(x)
    (warning,) = _fallbacks(caught)
    assert "scalar loops (the driver crashed" in str(warning.message)
    assert "no fused kernels: each instruction runs as its own kernel" in str(warning.message)
    assert isinstance(F._bound["gradient"], BoundProgram)       # no fused program
    np.testing.assert_allclose(gradient, _f_gradient(x), rtol=1e-12)


def test_a_device_whose_float64_kernels_crash_is_float32_only(proof_cache, monkeypatch):
    _drop(proof_cache, "eager:double")
    monkeypatch.setenv(_proofs.CRASH_ENV, "eager:double")
    _devices.rescan()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = [d for d in ad.devices() if d.kind == "opencl"]
        ad.devices()                                  # listed once a process: no new warning
    fp64_before = [d for d in found if d.problem.startswith("its float64 kernels failed")]
    assert len(_fallbacks(caught)) == len(fp64_before) >= 1
    device = fp64_before[0]
    assert not device.fp64 and "killed by signal 11 (SIGSEGV)" in device.problem
    assert "float32 tensors only" in str(_fallbacks(caught)[0].message)
    with pytest.raises(ad.DeviceError, match="cannot run float64"):
        ad.Tensor.constant(np.ones(3), device=device)
    x = ad.Tensor.variable(np.array([0.5, 2.0, 3.0], dtype=np.float32), ad.WengertList(),
                           device=device)
    np.testing.assert_allclose(ad.sum(x * x).derivatives()[x], [1.0, 4.0, 6.0])


def test_verdicts_are_read_from_disk_without_a_child(proof_cache, monkeypatch):
    be = _cpu_backend()
    width = vector_cl.fused_width(be, "double")       # proven (or read) before
    kinds = ["eager:float", f"fused:double:{width}"]
    _proofs.verdicts(be.device._handle, kinds)   # on disk now (an earlier test may have
    _proofs.forget()                             # proven them under another cache folder)

    def no_child(*args, **kwargs):
        raise AssertionError("proved again although the verdict is on disk")
    monkeypatch.setattr(_proofs, "prove", no_child)
    verdicts = _proofs.verdicts(be.device._handle, kinds)
    assert all(verdicts[k]["ok"] for k in kinds)


def test_a_corrupted_verdict_file_is_proven_again(proof_cache, monkeypatch):
    be = _cpu_backend()
    path = _proof_file(proof_cache)
    monkeypatch.setenv(_proofs.CRASH_ENV, "eager:float")   # a child that proves: it dies
    for damaged in ("{not json", "[1, 2]", json.dumps({"x": 1}), "\udcff".encode(
            errors="surrogateescape").decode(errors="replace")):
        path.write_text(damaged)
        _proofs.forget()
        verdict = _proofs.verdicts(be.device._handle, ["eager:float"])["eager:float"]
        assert verdict["ok"] is False and "SIGSEGV" in verdict["problem"]
        kept = json.loads(path.read_text())           # written back whole
        assert any(k.endswith(":eager:float") for k in kept)
    key = next(k for k in kept if k.endswith(":eager:float"))
    path.write_text(json.dumps({key: {"ok": "yes"}}))  # a verdict missing its fields
    _proofs.forget()
    assert _proofs.verdicts(be.device._handle, ["eager:float"])["eager:float"]["ok"] is False


def test_a_corrupted_probe_file_is_probed_again(proof_cache):
    before = [(d.name, d.usable, d.fp64) for d in _devices._opencl_devices()]
    path = proof_cache / os.path.basename(_probe.cache_path())
    data = json.loads(path.read_text())
    path.write_text(json.dumps({k: "damaged" for k in data}))
    _devices.rescan()
    assert [(d.name, d.usable, d.fp64) for d in _devices._opencl_devices()] == before
    assert all(_probe.valid_verdict(v) for v in json.loads(path.read_text()).values())


def test_the_real_devices_vector_widths():
    """Each CPU device's fused kernels get the widest width whose proof passed: every wider
    width asked for failed its proof (with a reason), and a program runs at that width
    with the right numbers."""
    for d in ad.devices():
        if d.kind != "opencl" or d.is_gpu:
            continue
        for real, dtype in (("double", np.float64), ("float", np.float32)):
            if real == "double" and not d.fp64:
                continue
            width = vector_cl.fused_width(d.backend, real)
            asked = vector_cl.vector_width(d.backend, real)
            tried = [w for w in (16, 8, 4, 2) if w <= asked] + [0]
            failed = tried[:tried.index(width)] if width is not None else tried
            verdicts = _proofs.verdicts(d._handle, [f"fused:{real}:{w}" for w in failed])
            for w in failed:
                assert not verdicts[f"fused:{real}:{w}"]["ok"]
                assert verdicts[f"fused:{real}:{w}"]["problem"]
            if width is None:
                continue
            assert _proofs.verdicts(d._handle, [f"fused:{real}:{width}"])[
                f"fused:{real}:{width}"]["ok"]
            x = np.linspace(0.1, 1.9, 8 * 16 + 3).astype(dtype)
            F = ad.record(_f, x, device=d, tensor=True)
            np.testing.assert_allclose(F.gradient(x), _f_gradient(x.astype(np.float64)),
                                       rtol=1e-12 if real == "double" else 1e-4)
            assert (width in _widths(F)) if width else set(_widths(F)) == {0}


def test_wrong_numbers_fail_a_proof():
    assert _proof_child._close("x", [1.0, np.nan, np.inf], [1.0, np.nan, np.inf], "double") is None
    assert "wrong numbers (2.0 instead of 1.0)" in _proof_child._close("x", [2.0], [1.0], "double")
    assert "wrong numbers" in _proof_child._close("x", [np.nan], [1.0], "float")
    assert _proof_child._close("x", [1.00001], [1.0], "float") is None
    assert "shape" in _proof_child._close("x", [1.0, 2.0], [1.0], "double")


def test_verdicts_others_could_have_written_are_not_trusted(tmp_path, monkeypatch):
    """A verdict says which kernels are safe to build in this process: one in a file or a
    folder others can write (a plant) is ignored, as a damaged one is, and proven again."""
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path / "cache"))
    verdict = {"usable": True, "fp64": True, "problem": "", "fix": ""}
    _probe.write_cache({"somekey": verdict})
    path = _probe.cache_path()
    assert _probe.read_cache() == {"somekey": verdict}
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    os.chmod(path, 0o666)                               # a file others can write
    assert _probe.read_cache() == {}
    os.chmod(path, 0o600)
    os.chmod(os.path.dirname(path), 0o777)              # a folder others can write
    assert _probe.read_cache() == {}
    os.chmod(os.path.dirname(path), 0o700)
    with open(path, "w") as f:                          # an outdated or damaged entry
        json.dump({"somekey": verdict, "old": {"usable": "damaged"}}, f)
    _probe.write_cache({"other": verdict})             # is dropped at the next write
    assert _probe.read_cache() == {"somekey": verdict, "other": verdict}


def test_an_op_kernel_that_crashes_its_proof_runs_on_the_host(proof_cache, monkeypatch):
    """The op table's OpenCL kernels (cumsum's) are proven in a child first: a driver that
    crashes on them takes the child down, and the op runs on the host, with one warning
    and the same numbers."""
    be = _cpu_backend()
    _drop(proof_cache, "ops:double")
    monkeypatch.setenv(_proofs.CRASH_ENV, "ops:double")
    monkeypatch.setattr(be, "_proven_ops", {}, raising=False)      # decided anew here
    x = np.linspace(-1.0, 2.0, 12).reshape(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = ad.Tensor.constant(x, device=be.device)
        first, second = ad.cumsum(t, axis=1), ad.cumsum(t, axis=0)
    (warning,) = _fallbacks(caught)
    assert "kernel of op 'cumsum' (double) failed its proof" in str(warning.message)
    assert "SIGSEGV" in str(warning.message) and "runs on the host" in str(warning.message)
    np.testing.assert_array_equal(first.value, np.cumsum(x, axis=1))
    np.testing.assert_array_equal(second.value, np.cumsum(x, axis=0))


def test_an_op_kernel_defined_outside_easyad_is_proven_by_itself(proof_cache, monkeypatch):
    """A user's op with an OpenCL kernel gets a proof kind of its own, keyed by its module's
    source; the child imports that module (here it cannot: a test module is not on the
    child's path), and an op it cannot prove runs on the host."""
    import dataclasses
    from easyad import ops
    from easyad.ops._builtin import CUMSUM

    @dataclasses.dataclass(frozen=True)
    class P:
        axis: int
    op = ops.register(dataclasses.replace(
        CUMSUM, name="cumsum_of_a_user", params=P,
        rule=lambda p, shape: (shape, P(p.axis % len(shape))),
        opencl=lambda be, p, buf: CUMSUM.opencl(be, p, buf)))
    try:
        kind = _proofs.op_kind(op, "double")
        assert kind.startswith(f"op:{__name__}:cumsum_of_a_user:") and kind.endswith(":double")
        be = _cpu_backend()
        x = np.arange(6.0).reshape(2, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = ops.call(op, (ad.Tensor.constant(x, device=be.device),), {"axis": 1})
        (warning,) = _fallbacks(caught)
        assert "cumsum_of_a_user" in str(warning.message)
        assert "ModuleNotFoundError" in str(warning.message)
        np.testing.assert_array_equal(out.value, np.cumsum(x, axis=1))
    finally:
        ops.unregister("cumsum_of_a_user")

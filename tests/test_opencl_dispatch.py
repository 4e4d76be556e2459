"""The OpenCL backend's per-operation path (issue 16): ``prepared_map`` prepares a launch
once per call signature (operand kinds, dtypes, broadcast shapes), so a call only
allocates and enqueues. These tests check that a signature never serves a call it does
not fit, that float32, 0-d and broadcast operands keep their results, that errors are
still DeviceErrors and that an operation never waits for the device."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import easyad as ad
from easyad.tensor import _opencl, _probe

pyopencl = pytest.importorskip("pyopencl")

RNG = np.random.default_rng(16)


@pytest.fixture
def backend(opencl_device):
    return ad.Tensor.constant(np.ones(1), device=opencl_device).device.backend


def _on(backend, array, dtype=np.float64):
    return backend.asarray(np.asarray(array, dtype=dtype), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_family_serves_every_kind_of_call(backend, dtype):
    """One label called with operands of every kind, in an order where a wrongly shared
    launch would be reused: each result as numpy computes it."""
    out = (np.dtype(dtype),)
    run = backend.prepared_map(f"dispatch_{out[0].name}", ("x * y + 1.0",), ("x", "y"))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12}
    calls = [
        ((8,), RNG.normal(size=8), RNG.normal(size=8)),          # same shape
        ((5,), RNG.normal(size=5), RNG.normal(size=5)),          # same kind, other size
        ((2, 3), RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))),
        ((8,), RNG.normal(size=8), 0.5),                         # a float operand
        ((8,), RNG.normal(size=8), np.array(3.0)),               # a 0-d buffer
        ((), np.array(2.0), np.array(3.0)),                      # 0-d output, "same"
        ((3, 4), RNG.normal(size=(3, 1)), RNG.normal(size=(1, 4))),   # broadcasts
        ((3, 4), RNG.normal(size=4), RNG.normal(size=(3, 4))),
        ((4, 3), RNG.normal(size=3), RNG.normal(size=(4, 3))),   # same operand shapes,
        ((2, 3), RNG.normal(size=3), RNG.normal(size=(2, 3))),   # other output shape
        ((8,), RNG.normal(size=8), RNG.normal(size=8)),          # the first signature again
    ]
    for shape, x, y in calls:
        args = tuple(float(v) if isinstance(v, float) else _on(backend, v, dtype)
                     for v in (x, y))
        (result,) = run(args, shape, out)
        assert result.shape == shape and result.dtype == dtype
        expected = (np.asarray(x, dtype) * np.asarray(y, dtype) + dtype(1.0)).astype(dtype)
        np.testing.assert_allclose(backend.to_numpy(result), expected, **tol)
    # sizes of one kind share a launch; each broadcast is its own
    assert len(run._signatures) == 8


def test_a_family_with_several_outputs_and_a_bool_operand(backend):
    run = backend.prepared_map("dispatch_where", ("choose(c, x, -x)", "x + 1.0"),
                               ("c", "x"))
    x = RNG.normal(size=6)
    c = x > 0
    v, w = run((backend.asarray(c, np.bool_), _on(backend, x)), (6,),
               (np.dtype(np.float64), np.dtype(np.float64)))
    np.testing.assert_array_equal(backend.to_numpy(v), np.abs(x))
    np.testing.assert_array_equal(backend.to_numpy(w), x + 1.0)


def test_map_and_prepared_map_share_one_family(backend):
    run = backend.prepared_map("dispatch_share", ("x - y",), ("x", "y"))
    assert backend.prepared_map("dispatch_share", ("x - y",), ("x", "y")) is run
    (z,) = backend.map("dispatch_share", ("x - y",), {"x": _on(backend, [3.0]), "y": 1.0},
                       (1,), (np.dtype(np.float64),))
    assert backend.to_numpy(z).tolist() == [2.0] and len(run._signatures) == 1


def test_signatures_are_bounded(backend, monkeypatch):
    monkeypatch.setattr(_opencl.PreparedMap, "MAX_SIGNATURES", 3)
    run = backend.prepared_map("dispatch_bound", ("x + y",), ("x", "y"))
    for n in range(1, 8):    # a new broadcast shape each time
        x, y = RNG.normal(size=(n, 1)), RNG.normal(size=n)
        (z,) = run((_on(backend, x), _on(backend, y)), (n, n), (np.dtype(np.float64),))
        np.testing.assert_array_equal(backend.to_numpy(z), x + y)
        assert len(run._signatures) <= 3


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eager_gradients_on_every_kind_of_operand(opencl_device, dtype):
    """Values and gradients of a program mixing same-shape, 0-d, float and broadcast
    operands, with inputs used many times (the sweep adds their adjoints on the device),
    against the numpy device."""
    x0 = RNG.uniform(0.2, 1.0, (3, 4)).astype(dtype)
    y0 = RNG.uniform(0.2, 1.0, 4).astype(dtype)
    s0 = np.array(0.7, dtype=dtype)

    def f(x, y, s):
        a = ad.sin(x) * x + y          # broadcast y, x used twice
        b = a * s - 0.5 * x            # 0-d s, a float
        return (b * b + ad.exp(y)).sum(), a

    results = {}
    for device in ("numpy", opencl_device):
        lst = ad.WengertList()
        x, y, s = (ad.Tensor.variable(v, lst, device=device) for v in (x0, y0, s0))
        total, a = f(x, y, s)
        d = total.derivatives()
        results[device] = (total.number, a.value, d[x], d[y], d[s])
        assert a.dtype == dtype and d[x].dtype == dtype
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for got, want in zip(results[opencl_device], results["numpy"]):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_device_arrays_add_through_the_backend(backend):
    x, y = RNG.normal(size=5), RNG.normal(size=5)
    a, b = _on(backend, x), _on(backend, y)
    assert type(a) is backend.array_class and isinstance(a, _opencl.DeviceArray)
    backend.live_buffers
    before = backend.live_buffers
    total = a + b
    assert type(total) is backend.array_class and backend.live_buffers == before + 1
    np.testing.assert_array_equal(backend.to_numpy(total), x + y)
    # anything else is pyopencl's own sum
    np.testing.assert_array_equal((a + 1.0).get(), x + 1.0)
    single = _on(backend, y, np.float32)
    np.testing.assert_allclose((a + single).get(), x + y.astype(np.float32), rtol=1e-15)


def test_errors_of_a_prepared_launch_are_device_errors(backend, monkeypatch):
    run = backend.prepared_map("dispatch_fails", ("x * 2.0",), ("x",))
    x = _on(backend, np.arange(3.0))

    def lost(*args, **kwargs):
        record = pyopencl._cl._ErrorRecord("clEnqueueNDRangeKernel",
                                           pyopencl.status_code.INVALID_COMMAND_QUEUE,
                                           "the queue is gone")
        raise pyopencl.LogicError(record)
    monkeypatch.setattr(_opencl, "_enqueue", lost)
    with pytest.raises(ad.DeviceError, match="lost or reset.*restart") as caught:
        run((x,), (3,), (np.dtype(np.float64),))
    assert caught.value.operation == "map (dispatch_fails)"
    with pytest.raises(ad.DeviceError) as caught:     # an outer operation names itself
        backend.reduce("sum", backend.reshape(x, (3, 1)), ())
    assert caught.value.operation == "reduce (sum)"
    monkeypatch.undo()
    (y,) = run((x,), (3,), (np.dtype(np.float64),))   # the backend is not left busy
    assert backend.to_numpy(y).tolist() == [0.0, 2.0, 4.0]


def test_float32_only_device(opencl_device):
    device = ad.devices()[[d.name for d in ad.devices()].index(opencl_device)]
    single = dataclasses.replace(device, fp64=False, problem="no float64 (cl_khr_fp64)",
                                 fix=_probe.FIX_FP64)
    be = single.backend
    x0 = np.linspace(0.1, 0.8, 8, dtype=np.float32)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst, device=single)
    z = (ad.sin(x) * 0.5 + x).sum()
    np.testing.assert_allclose(z.number, np.sum(np.sin(x0) * 0.5 + x0), rtol=1e-5)
    np.testing.assert_allclose(z.derivatives()[x], np.cos(x0) * 0.5 + 1, rtol=1e-5)
    run = be.prepared_map("dispatch_single", ("x + 1.0",), ("x",))
    with pytest.raises(ad.DeviceError, match="cannot run float64.*float32"):
        run((x._data,), (8,), (np.dtype(np.float64),))


def test_an_operation_never_waits_for_the_device(backend, monkeypatch):
    """Elementwise operations, reductions over an axis and a backward sweep's adjoints
    enqueue only: no read to the host, no finish."""
    x, y = _on(backend, RNG.normal(size=(4, 3))), _on(backend, RNG.normal(size=3))
    f64 = (np.dtype(np.float64),)
    mul = backend.prepared_map("dispatch_async", ("x * y",), ("x", "y"))
    mul((x, y), (4, 3), f64)                      # compiled before the check
    backend.reduce("sum", x, (0,))
    waits = []
    monkeypatch.setattr(pyopencl, "enqueue_copy", lambda *a, **k: waits.append("copy"))
    monkeypatch.setattr(pyopencl, "wait_for_events", lambda *a, **k: waits.append("wait"))
    monkeypatch.setattr(pyopencl.array.Array, "get", lambda *a, **k: waits.append("get"))
    for _ in range(3):
        (z,) = mul((x, y), (4, 3), f64)
        z = z + x
        backend.reduce("sum", z, (0,))
    assert waits == []


def test_arrays_without_pyopencl_private_constructor(backend, monkeypatch):
    """A pyopencl whose Array lacks the private fast-constructor keywords gets arrays from
    the public constructor: the same values and gradients."""
    x0 = np.linspace(0.1, 1.0, 8)
    results = []
    for fast in (True, False):
        monkeypatch.setattr(_opencl, "_FAST_CONSTRUCTOR", fast)
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst, device=backend.device.name)
        z = ad.sum(ad.sin(x * x) + x.reshape(2, 4).T.sum(axis=0).sum() * x)
        results.append((z.number, z.derivatives()[x]))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    ref = np.sin(x0 * x0) + x0.sum() * x0
    assert results[1][0] == pytest.approx(ref.sum(), rel=1e-12)

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
from easyad.tensor import _cl_memory, _opencl, _probe

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
        monkeypatch.setattr(_cl_memory, "_FAST_CONSTRUCTOR", fast)
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst, device=backend.device.name)
        z = ad.sum(ad.sin(x * x) + x.reshape(2, 4).T.sum(axis=0).sum() * x)
        results.append((z.number, z.derivatives()[x]))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    ref = np.sin(x0 * x0) + x0.sum() * x0
    assert results[1][0] == pytest.approx(ref.sum(), rel=1e-12)


# ---- host cost of eager operations (issue 30): caches must never serve a wrong call ----

def test_kernel_sources_are_rendered_once_per_arguments_and_tables(monkeypatch):
    """A renderer gives the same string object for the same arguments (the kernel cache
    hashes it once), another source for other arguments, and renders anew when a table
    it reads (a matmul's tile) changes."""
    from easyad.tensor import _kernels as kernels
    from easyad.tensor import _kernels_matmul as matmul
    assert kernels.render_strided("float", 3, False) is kernels.render_strided("float", 3,
                                                                               False)
    assert kernels.render_strided("float", 3, False) != kernels.render_strided("float", 2,
                                                                               False)
    assert "double" in kernels.render_reduce("sum", "double")
    assert kernels.preamble("float") is kernels.preamble("float")
    assert kernels.preamble("float", 4) != kernels.preamble("float")
    before = matmul.render_matmul("float")
    assert matmul.render_matmul("float") is before
    monkeypatch.setitem(matmul.MATMUL_TILE, "TK", 8)
    assert "#define TK 8" in matmul.render_matmul("float") and "#define TK 8" not in before
    monkeypatch.undo()
    assert matmul.render_matmul("float") is before
    nt = matmul.render_matmul_nt("double", 32)
    monkeypatch.setitem(matmul.MATMUL_NT_BLOCK, "RM", 2)
    assert matmul.render_matmul_nt("double", 32) != nt


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.bool_])
def test_arrays_made_from_a_template_are_independent(backend, dtype):
    """Arrays of a shape seen before are copies of a template's state: each with its own
    buffer, events and flags, the right shape, strides and dtype; size 0 and 0-d too."""
    storage = backend._storage(dtype)
    for shape in [(5,), (2, 3), (), (0,), (1, 7, 1), (5,), (2, 3), (), (0,)]:
        values = RNG.normal(size=shape) > 0 if dtype == np.bool_ else RNG.normal(size=shape)
        a, b = backend.allocate(shape, dtype), backend.allocate(shape, dtype)
        size = int(np.prod(shape))
        if size:
            a.set(np.asarray(values, storage))
            b.set(np.asarray(~values if dtype == np.bool_ else values + 1, storage))
        for arr in (a, b):
            assert arr.shape == shape and arr.dtype == storage and arr.size == size
            assert arr.offset == 0
            assert not size or arr.strides == np.empty(shape, storage).strides
            assert arr.flags.c_contiguous and type(arr) is backend.array_class
        assert a.events is not b.events
        if size:
            assert a.base_data is not b.base_data and a.base_data.int_ptr != b.base_data.int_ptr
        np.testing.assert_array_equal(backend.to_numpy(a), np.asarray(values, storage))
    assert ((5,), storage) in backend._templates


def test_reshape_makes_views_and_keeps_pyopencl_errors(backend):
    x0 = RNG.normal(size=(4, 6))
    x = _on(backend, x0)
    for shape in [(24,), (2, 12), (1, 4, 6, 1), (3, 2, 4), (4, 6)]:
        v = backend.reshape(x, shape)
        assert v.shape == shape and v.base_data is x.base_data and v.events is x.events
        assert v.strides == np.empty(shape).strides and v.flags.c_contiguous
        np.testing.assert_array_equal(backend.to_numpy(v), x0.reshape(shape))
    assert backend.reshape(x, (4, 6)) is x
    assert backend.reshape(x, [-1, 3]).shape == (8, 3)        # pyopencl's -1
    with pytest.raises(ValueError):
        backend.reshape(x, (5, 5))
    zero = backend.reshape(_on(backend, np.empty((0, 3))), (3, 0))
    assert zero.shape == (3, 0) and backend.to_numpy(zero).shape == (3, 0)
    # a strided array (not the backend's own kind) goes through pyopencl's reshape
    odd = x[:, ::2]
    assert backend.reshape(odd, (4, 3)).shape == (4, 3)


def test_arrays_without_plain_state_use_the_constructors(backend, monkeypatch):
    """A pyopencl whose arrays keep their state elsewhere than a plain dict: every array
    from a constructor, reshape through pyopencl; the same values and gradients."""
    monkeypatch.setattr(_cl_memory, "_PLAIN_STATE", False)
    monkeypatch.setattr(backend, "_templates", {})
    monkeypatch.setattr(backend, "_plain", False)
    reshaped = []
    real_reshape = pyopencl.array.Array.reshape
    monkeypatch.setattr(pyopencl.array.Array, "reshape",
                        lambda self, *a, **k: reshaped.append(a) or real_reshape(self, *a, **k))
    x0 = np.linspace(0.1, 1.0, 8)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst, device=backend.device.name)
    z = ad.sum(ad.sin(x * x) + x.reshape(2, 4).T.sum(axis=0).sum() * x)
    assert backend._templates == {} and reshaped
    assert z.number == pytest.approx(np.sum(np.sin(x0 * x0) + x0.sum() * x0), rel=1e-12)
    np.testing.assert_allclose(z.derivatives()[x], 2 * x0 * np.cos(x0 * x0) + x0.sum()
                               + x0.sum(), rtol=1e-12)


def _cross_entropy(device, z0, target, dtype, reduction):
    lst = ad.WengertList()
    z = ad.Tensor.variable(z0, lst, device=device, dtype=dtype)
    loss = ad.nn.functional.cross_entropy(z, target, reduction=reduction)
    return loss.number, loss.derivatives()[z]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (13, 10), (300, 3), (257, 1), (1031, 37)])
def test_fused_cross_entropy_equals_numpy(opencl_device, backend, shape, dtype):
    """The two-kernel cross_entropy (rows over one work-group, the vjp per element) against
    the numpy device, loss and gradient, mean and sum, rows beyond one work-group's size."""
    z0 = RNG.normal(scale=3.0, size=shape)
    target = RNG.integers(0, shape[1], shape[0])
    tol = {"rtol": 2e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12,
                                                                     "atol": 1e-14}
    for reduction in ("mean", "sum"):
        loss, grad = _cross_entropy(opencl_device, z0, target, dtype, reduction)
        ref_loss, ref_grad = _cross_entropy("numpy", z0, target, dtype, reduction)
        assert np.asarray(grad).dtype == dtype
        np.testing.assert_allclose(loss, ref_loss, **tol)
        np.testing.assert_allclose(grad, ref_grad, **tol)


def test_fused_cross_entropy_launches_two_kernels_and_keeps_edge_values(opencl_device,
                                                                        backend, monkeypatch):
    """Forward and vjp are one launch each (no map, reduce, gather or fill); rows with an
    infinite or NaN logit give what numpy gives; too many logits per work-item take the
    composed kernels (same values)."""
    z0 = RNG.normal(size=(6, 4))
    z0[1, 2] = np.inf
    z0[2, :] = -np.inf
    z0[3, 0] = np.nan
    target = np.array([0, 1, 2, 3, 0, 3])
    (forward, group), vjp = backend._ce_kernels(np.dtype(np.float64))
    launched = []

    def counted(name, kernel):
        return lambda *args: launched.append(name) or kernel(*args)
    monkeypatch.setitem(backend._reductions, ("cross_entropy", np.dtype(np.float64)),
                        ((counted("forward", forward), group), counted("vjp", vjp)))
    for name in ("map", "reduce", "take", "scatter_add", "full", "matmul"):
        monkeypatch.setattr(backend, name, lambda *a, **k: pytest.fail("not fused"))
    lst = ad.WengertList()
    z = ad.Tensor.variable(z0, lst, device=opencl_device)
    loss = ad.nn.functional.cross_entropy(z, target, reduction="sum")
    grad = loss.derivatives()[z]
    assert launched == ["forward", "vjp"]
    monkeypatch.undo()
    with np.errstate(invalid="ignore"):
        ref_loss, ref_grad = _cross_entropy("numpy", z0, target, np.float64, "sum")
    np.testing.assert_array_equal(np.isnan(grad), np.isnan(ref_grad))
    finite = ~np.isnan(ref_grad)
    np.testing.assert_allclose(grad[finite], ref_grad[finite], rtol=1e-12)
    assert np.isnan(loss.number) and np.isnan(ref_loss)
    z1 = RNG.normal(size=(40, 9))
    t1 = RNG.integers(0, 9, 40)
    fused = _cross_entropy(opencl_device, z1, t1, np.float64, "mean")
    monkeypatch.setattr(_opencl, "_CE_FUSED_WORK", 8)
    composed = _cross_entropy(opencl_device, z1, t1, np.float64, "mean")
    np.testing.assert_allclose(fused[0], composed[0], rtol=1e-13)
    np.testing.assert_allclose(fused[1], composed[1], rtol=1e-13)


def test_strided_copies_of_every_view_and_dtype(backend):
    """Gathers and scatters are prepared once per view and dtype: views met again (with
    other values), the same view in another dtype and new views all equal numpy's."""
    base = np.arange(60.0).reshape(3, 4, 5)
    views = [(0, (5, 4, 3), (1, 5, 20)),      # a transpose
             (7, (2, 3), (20, 2)),            # a strided slice with an offset
             (0, (60,), (1,)), (59, (1,), (1,)), (3, (4, 1, 2), (5, 1, 1))]
    for dtype in (np.float64, np.float32, np.float64):
        for scale in (1.0, -2.0):
            host = (base * scale).astype(dtype)
            buf = _on(backend, host, dtype)
            for offset, shape, strides in views:
                expected = np.lib.stride_tricks.as_strided(
                    host.reshape(-1)[offset:], shape,
                    tuple(s * host.itemsize for s in strides))
                out = backend.strided(buf, offset, shape, strides)
                assert out.dtype == dtype and out.shape == shape
                np.testing.assert_array_equal(backend.to_numpy(out), expected)
                parts = [(offset, shape, strides, _on(backend, expected, dtype))]
                back = backend.to_numpy(backend.assemble((60,), dtype, parts))
                mask = np.zeros(60, bool)
                mask[offset + sum(np.ix_(*[np.arange(n) * s for n, s in zip(shape, strides)]))
                     .reshape(-1)] = True
                np.testing.assert_array_equal(back[mask], host.reshape(-1)[mask])
                assert not back[~mask].any()
    assert len(backend._copies) >= 2 * len(views)

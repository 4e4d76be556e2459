"""The structural operations' C paths in the core (easyad/_engine/structural.pxi: sum,
mean, max, min, basic getitem, matmul, reshape, transpose and .T on the numpy device, and
the steps SumStep, ExtremeStep, ReshapeStep, TransposeStep, KeySliceStep, MatmulStep)
against the Python operations of easyad/tensor/_structural.py, both its fast paths and its
general path: the same values, gradients and second derivatives bit for bit, the C path
taken where it should be (and not elsewhere), errors raised by the Python path with the
tape left as it was, and the steps' Python API."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import easyad as ad
from easyad import _core, _tapeview
from easyad._core import (ExtremeStep, KeySliceStep, MatmulStep, ReshapeStep, SumStep,
                          TransposeStep, _CoreStep, _released_vjp)
from easyad.tensor import _devices, _structural
from easyad.tensor._steps import Step

OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"]
RNG = np.random.default_rng(11)
A43 = RNG.standard_normal((4, 3))
A234 = RNG.standard_normal((2, 3, 4))
TIES = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0], [-0.0, 0.0, -1.0], [5.0, 5.0, 5.0]])
SPECIAL = np.array([[1.0, np.nan, 2.0], [np.inf, -np.inf, 0.5], [-0.0, 0.0, 1e308],
                    [1e308, 1e308, -2.0]])
BIG = RNG.standard_normal((40, 70))

# name -> (f, input arrays): what the C paths take
TAKEN = {
    "sum": (lambda x: x.sum(), [A43]),
    "sum0": (lambda x: x.sum(axis=0), [A43]),
    "sum1": (lambda x: x.sum(axis=1), [A43]),
    "sum-1": (lambda x: x.sum(axis=-1), [A234]),
    "sum_middle": (lambda x: x.sum(axis=1), [A234]),
    "sum0d": (lambda x: x.sum(), [np.array(2.5)]),
    "sum_vector_axis": (lambda x: x.sum(axis=0), [A43[:, 0]]),
    "sum_empty": (lambda x: x.sum(axis=0), [np.zeros((0, 3))]),
    "sum_big": (lambda x: x.sum() + x.sum(axis=1).sum(), [BIG]),
    "sum_special": (lambda x: x.sum(axis=0), [SPECIAL]),
    "mean": (lambda x: x.mean(), [A43]),
    "mean0": (lambda x: x.mean(axis=0), [A43]),
    "mean-2": (lambda x: x.mean(axis=-2), [A234]),
    "mean_empty": (lambda x: x.mean(axis=0), [np.zeros((0, 3))]),
    "max": (lambda x: x.max(), [A43]),
    "max1": (lambda x: x.max(axis=1), [A43]),
    "min0": (lambda x: x.min(axis=0), [A234]),
    "amin-1": (lambda x: x.amin(axis=-1), [A234]),
    "max_ties": (lambda x: x.max(axis=1) + x.max(axis=0).sum() + x.max(), [TIES]),
    "min_ties": (lambda x: x.min(axis=0).sum() * x.min(), [TIES]),
    "max_special": (lambda x: x.max(axis=1), [SPECIAL]),
    "max_vector": (lambda x: x.max(axis=0), [A43[:, 1]]),
    "slice": (lambda x: x[1:], [A43]),
    "int": (lambda x: x[1], [A43]),
    "negint": (lambda x: x[-1], [A234]),
    "column": (lambda x: x[:, -1], [A43]),
    "steps": (lambda x: x[::-2, 1:], [A234]),
    "element": (lambda x: x[1, 2] * 2.0 + x[-1, -3], [A43]),
    "element3": (lambda x: x[1, -1, 0], [A234]),
    "element_vector": (lambda x: x[2], [A43[:, 1]]),
    "element0d": (lambda x: x[()], [np.array(1.5)]),
    "empty_tuple": (lambda x: x[()], [A43]),
    "empty_slice": (lambda x: x[5:], [A43]),
    "mixed": (lambda x: x[0, 1:], [A234]),
    "huge_slice": (lambda x: x[-10**30:10**30], [A43]),
    "mm": (lambda a, b: a @ b, [A43, RNG.standard_normal((3, 2))]),
    "mv": (lambda a, b: a @ b, [A43, RNG.standard_normal(3)]),
    "vm": (lambda a, b: a @ b, [RNG.standard_normal(4), A43]),
    "vv": (lambda a, b: a @ b, [RNG.standard_normal(3), RNG.standard_normal(3)]),
    "matmul_method": (lambda a, b: a.matmul(b), [A43, RNG.standard_normal(3)]),
    "mm_empty": (lambda a, b: a @ b, [np.zeros((0, 3)), RNG.standard_normal((3, 2))]),
    "mm_inner_empty": (lambda a, b: a @ b, [np.zeros((2, 0)), np.zeros((0, 3))]),
    "mm_big": (lambda a, b: a @ b, [RNG.standard_normal((37, 65)),
                                    RNG.standard_normal((65, 29))]),
    "mv_big": (lambda a, b: a @ b, [BIG, RNG.standard_normal(70)]),
    "reshape": (lambda x: x.reshape(12), [A43]),
    "reshape_args": (lambda x: x.reshape(3, 4), [A43]),
    "reshape_tuple": (lambda x: x.reshape((2, -1, 3)), [A234]),
    "reshape-1": (lambda x: x.reshape(-1), [A234]),
    "reshape0d": (lambda x: x.reshape(()), [np.array(2.0)]),
    "reshape_none": (lambda x: x.reshape(), [np.array([2.0])]),
    "reshape_empty": (lambda x: x.reshape(3, 0), [np.zeros((0, 3))]),
    "T": (lambda x: x.T, [A43]),
    "transpose": (lambda x: x.transpose(), [A43]),
    "transpose10": (lambda x: x.transpose(1, 0), [A43]),
    "transpose_tuple": (lambda x: x.transpose((1, 0)), [A43]),
    "T_empty": (lambda x: x.T, [np.zeros((0, 3))]),
    "chain": (lambda a, b: ((a.T @ a)[1:, :2].reshape(4) * b.max()).mean()
              + (a @ b).sum(axis=0) + a[2].min(), [A43, RNG.standard_normal(3)]),
}

# what the Python operations keep (the C paths decline): they must still work, the same
DECLINED = {
    "keepdims": (lambda x: x.sum(axis=1, keepdims=True), [A43]),
    "mean_keepdims": (lambda x: x.mean(keepdims=True), [A43]),
    "max_keepdims": (lambda x: x.max(axis=0, keepdims=True), [A234]),
    "tuple_axes": (lambda x: x.sum(axis=(0, 2)), [A234]),
    "numpy_axis": (lambda x: x.max(axis=np.int64(1)), [A43]),
    "fancy": (lambda x: x[[0, 2, 0]], [A43]),
    "array_index": (lambda x: x[np.array([1, 3])], [A43]),
    "bool_index": (lambda x: x[True:], [A43]),
    "newaxis": (lambda x: x[None, 1], [A43]),
    "ellipsis": (lambda x: x[..., 1], [A234]),
    "numpy_int_index": (lambda x: x[np.int64(1)], [A43]),
    "bmm": (lambda a, b: a @ b, [A234, RNG.standard_normal((2, 4, 5))]),
    "broadcast_mm": (lambda a, b: a @ b, [A234, RNG.standard_normal((4, 5))]),
    "reshape_numpy_int": (lambda x: x.reshape(np.int64(12)), [A43]),
    "reshape_list": (lambda x: x.reshape([3, 4]), [A43]),
    "transpose3": (lambda x: x.transpose(2, 0, 1), [A234]),
    "T3": (lambda x: x.T, [A234]),
    "T1": (lambda x: x.T * 2.0, [A43[0]]),
    "transpose01": (lambda x: x.transpose(0, 1) * 2.0, [A43]),
}


@pytest.fixture
def paths(monkeypatch):
    """paths(kind): "c" (as shipped), "python" (the C paths off) or "general" (every fast
    path off); restored after the test."""
    previous = _core._structural_fast(True)

    def use(kind):
        _core._structural_fast(kind == "c")
        monkeypatch.setattr(_structural, "_fast",
                            (lambda t: False) if kind == "general" else _FAST)
    yield use
    _core._structural_fast(previous)


_FAST = _structural._fast


def _as_result(v):
    if isinstance(v, ad.Tensor):
        return ("tensor", v.shape, v.dtype, v.value)
    if isinstance(v, ad.Record):
        return ("record", np.float64(v.number))
    return (type(v).__name__, np.float64(v))


def _same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "tensor":
        assert a[1] == b[1] and a[2] == b[2] and a[3].dtype == b[3].dtype
        assert a[3].tobytes() == b[3].tobytes()
    else:
        assert a[1].tobytes() == b[1].tobytes(), (a, b)


def _run(f, arrays, dtype, constant=()):
    """(value, gradients of a weighted sum, H v, entries recorded) of f."""
    lst = ad.WengertList()
    ts = [ad.Tensor.constant(a, dtype=dtype) if k in constant
          else ad.Tensor.variable(a, lst, dtype=dtype) for k, a in enumerate(arrays)]
    before = len(lst)
    out = f(*ts)
    entries = len(lst) - before
    value = _as_result(out)
    if isinstance(out, ad.Tensor):
        loss = (out * np.linspace(-1.0, 2.0, out.size).reshape(out.shape)).sum()
    else:
        loss = out * 1.5
    variables = [t for k, t in enumerate(ts) if k not in constant]
    if not isinstance(loss, ad.Record):
        return value, None, None, entries
    d = loss.derivatives()
    grads = [np.asarray(d[t]) for t in variables]
    d2 = loss.derivatives(create_graph=True)
    total = 0.0
    for t in variables:
        g = d2[t]
        if isinstance(g, ad.Tensor):
            total = total + (g * np.cos(np.arange(t.size, dtype=np.float64))
                             .reshape(t.shape)).sum()
    hv = None
    if isinstance(total, ad.Record):
        dd = total.derivatives()
        hv = [np.asarray(dd[t]) for t in variables]
    return value, grads, hv, entries


def _compare(got, want):
    _same(got[0], want[0])
    for a, b in ((got[1], want[1]), (got[2], want[2])):
        assert (a is None) == (b is None)
        if a is not None:
            for x, y in zip(a, b):
                assert x.shape == y.shape and x.dtype == y.dtype
                assert x.tobytes() == y.tobytes()
    assert got[3] == want[3]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(TAKEN) + sorted(DECLINED))
def test_c_path_equals_the_python_paths_bit_for_bit(name, dtype, paths):
    f, arrays = TAKEN.get(name) or DECLINED[name]
    paths("c")
    fast = _run(f, arrays, dtype)
    paths("python")
    _compare(fast, _run(f, arrays, dtype))
    paths("general")
    _compare(fast, _run(f, arrays, dtype))


@pytest.mark.parametrize("name", ["mm", "mv", "vm", "vv", "mm_big", "chain"])
@pytest.mark.parametrize("constant", [(0,), (1,), (0, 1)])
def test_matmul_with_constants(name, constant, paths):
    f, arrays = TAKEN[name]
    paths("c")
    fast = _run(f, arrays, None, constant)
    paths("general")
    _compare(fast, _run(f, arrays, None, constant))


def test_constant_results():
    """Constants in, constants out: floats for one number, unrecorded tensors."""
    x = ad.Tensor.constant(A43)
    b = ad.Tensor.constant(A43[0])
    for v in (x.sum(), x.mean(), x.max(), x[1, 2], b @ b):
        assert type(v) is float
    for t in (x.sum(axis=0), x.max(axis=1), x[1:], x @ b, x.reshape(12), x.T):
        assert isinstance(t, ad.Tensor) and t.tape is None and t._index == -1


def _nodes(lst):
    """The node entries with inputs (tensor operations) of ``lst``."""
    view = _tapeview.TapeView(lst)
    found = [lst._node(e) for e in range(len(view)) if view.kind(e) == _tapeview.NODE]
    return [node for node in found if node.inputs]


_FALLBACKS = ("sum", "mean", "extreme", "reshape", "transpose", "getitem", "matmul")
_PYTHON_STEPS = ("sum_vjp", "extreme_vjp", "transpose_vjp", "matmul_vjp")
_REGISTERED = {"sum": _structural.reduce_sum, "mean": _structural.mean,
               "extreme": _structural.reduce_extreme, "reshape": _structural.reshape,
               "transpose": _structural.transpose, "getitem": _structural.getitem,
               "matmul": _structural.matmul, "sum_vjp": _structural._sum_vjp,
               "extreme_vjp": _structural._extreme_vjp,
               "transpose_vjp": _structural._transpose_vjp,
               "matmul_vjp": _structural._matmul_vjp}


@pytest.fixture
def python_refused():
    """Within the test, the Python operations and the Python vjps the C steps fall back
    to raise: only the C paths work."""
    def boom(*args, **kwargs):
        raise AssertionError("the Python path was taken")
    for name in _FALLBACKS + _PYTHON_STEPS:
        _core._register_service("structural." + name, boom)
    try:
        yield
    finally:
        for name in _FALLBACKS + _PYTHON_STEPS:
            _core._register_service("structural." + name, _REGISTERED[name])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(TAKEN))
def test_the_c_path_is_taken_forward_and_backward(name, dtype, python_refused):
    f, arrays = TAKEN[name]
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst, dtype=dtype) for a in arrays]
    out = f(*ts)
    seed = np.ones(out.shape) if isinstance(out, ad.Tensor) else None
    if seed is not None and out.size == 0:
        return
    d = out.derivatives(seed) if seed is not None else out.derivatives()
    for t in ts:
        assert d[t].shape == t.shape
    for node in _nodes(lst):
        if isinstance(node.vjp, _CoreStep):   # recorded by C: the step's method is the graph
            assert node.graph is None


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declined_cases_go_to_python(name, python_refused):
    f, arrays = DECLINED[name]
    lst = ad.WengertList()
    with pytest.raises(AssertionError, match="Python path"):
        f(*[ad.Tensor.variable(a, lst) for a in arrays])


def test_other_operands_go_to_python(python_refused):
    lst, other = ad.WengertList(), ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    cases = [lambda: x @ A43.T, lambda: x @ ad.Tensor.variable(A43.T, other),
             lambda: x @ ad.Tensor.variable(A43.T, lst, dtype=np.float32),
             lambda: x @ lst.variable(2.0), lambda: ad.Tensor.variable(A43, lst, dtype=np.float32)
             @ x.T]
    for case in cases:
        with pytest.raises(AssertionError, match="Python path"):
            case()
    lst.clear()
    for op in (lambda: x.sum(), lambda: x[1:], lambda: x.T, lambda: x.reshape(12)):
        with pytest.raises(AssertionError, match="Python path"):   # stale: Python raises
            op()


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
def test_opencl_tensors_go_to_python(python_refused):
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst, device=OPENCL[0])
    for op in (lambda: x.sum(), lambda: x.max(axis=1), lambda: x[1:], lambda: x.T,
               lambda: x.reshape(12), lambda: x @ x.T):
        with pytest.raises(AssertionError, match="Python path"):
            op()


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
@pytest.mark.parametrize("name", ["chain", "max_ties", "element", "vv", "sum-1"])
def test_opencl_agrees(name):
    f, arrays = TAKEN[name]
    got = _run(f, arrays, np.float64)
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst, device=OPENCL[0]) for a in arrays]
    out = f(*ts)
    value = out.value if isinstance(out, ad.Tensor) else out.number
    np.testing.assert_allclose(value, got[0][-1], rtol=1e-12, atol=1e-12)


def test_gradients_are_finite_differences():
    a, b = A43, RNG.standard_normal(3)

    def f(x, y):
        return (((x.T[:, 1:] @ x[1:]) @ y).reshape(3, 1).sum(axis=1).max()
                + x[2, 1] * x.mean(axis=0)[1] + x.min() + (y @ y) * x.sum()
                + (x @ y).max(axis=0) + x.reshape(12)[3:].sum(axis=-1) + (y @ x.T)[1])

    lst = ad.WengertList()
    xs = [ad.Tensor.variable(v, lst) for v in (a, b)]
    d = f(*xs).derivatives()
    h = 1e-6
    for k, v in enumerate((a, b)):
        direction = np.sin(np.arange(v.size) + 1.0).reshape(v.shape)

        def value(s):
            args = [a, b]
            args[k] = v + s * direction
            return f(*[ad.Tensor.constant(u) for u in args])
        fd = (value(h) - value(-h)) / (2 * h)
        assert np.sum(d[xs[k]] * direction) == pytest.approx(fd, rel=1e-6, abs=1e-8)


ERRORS = {
    "axis2": (lambda x: x.sum(axis=2), [A43]),
    "axis-3": (lambda x: x.mean(axis=-3), [A43]),
    "huge_axis": (lambda x: x.max(axis=10**30), [A43]),
    "float_axis": (lambda x: x.sum(axis=1.0), [A43]),
    "max_empty": (lambda x: x.max(), [np.zeros((0, 3))]),
    "min_empty_axis": (lambda x: x.min(axis=0), [np.zeros((0, 3))]),
    "sum_0d_axis": (lambda x: x.sum(axis=0), [np.array(1.0)]),
    "index4": (lambda x: x[4], [A43]),
    "index-5": (lambda x: x[-5], [A43]),
    "huge_index": (lambda x: x[10**30], [A43]),
    "index_col": (lambda x: x[:, 3], [A43]),
    "too_many": (lambda x: x[0, 0, 0], [A43]),
    "float_index": (lambda x: x[1.0], [A43]),
    "float_slice": (lambda x: x[1.0:], [A43]),
    "zero_step": (lambda x: x[::0], [A43]),
    "index_0d": (lambda x: x[0], [np.array(1.0)]),
    "reshape5": (lambda x: x.reshape(5), [A43]),
    "reshape-1-1": (lambda x: x.reshape(-1, -1), [A43]),
    "reshape-1_5": (lambda x: x.reshape(-1, 5), [A43]),
    "reshape0-1": (lambda x: x.reshape(0, -1), [A43]),
    "reshape_float": (lambda x: x.reshape((2.0, 6)), [A43]),
    "reshape-2": (lambda x: x.reshape(-2, -6), [A43]),
    "reshape_huge": (lambda x: x.reshape(2**62, 2**62), [A43]),
    "reshape_string": (lambda x: x.reshape("a"), [A43]),
    "transpose00": (lambda x: x.transpose(0, 0), [A43]),
    "transpose_float": (lambda x: x.transpose(1.0, 0), [A43]),
    "mm_inner": (lambda a, b: a @ b, [A43, RNG.standard_normal((4, 2))]),
    "mv_inner": (lambda a, b: a @ b, [A43, RNG.standard_normal(4)]),
    "vv_inner": (lambda a, b: a @ b, [RNG.standard_normal(3), RNG.standard_normal(4)]),
    "matmul_0d": (lambda a, b: a @ b, [np.array(1.0), A43]),
    "matmul_list": (lambda a: a @ [[1.0, 2.0]], [A43]),
}


def _error(f, arrays):
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst) for a in arrays]
    before = len(lst)
    with pytest.raises(Exception) as info:
        f(*ts)
    assert len(lst) == before             # nothing recorded
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_are_the_python_paths_and_leave_the_tape(name, paths):
    f, arrays = ERRORS[name]
    paths("c")
    fast = _error(f, arrays)
    paths("general")
    assert fast == _error(f, arrays)


def test_a_transform_input_reads_its_elements():
    """getitem on ad.grad's inputs: single elements are Records (the core asks Python),
    slices take the C path."""
    def f(x):
        return x[0] * x[1] + (x[1:] * x[:-1]).sum() + x.reshape(2, 2).T[0, 1]
    x0 = np.array([0.5, -1.0, 2.0, 3.0])
    g = ad.grad(f)(x0)
    expected = np.array([x0[1] + x0[1], x0[0] + x0[0] + x0[2], x0[1] + x0[3] + 1.0, x0[2]])
    np.testing.assert_allclose(g, expected, rtol=1e-14)


def test_slices_of_a_transform_input_take_the_c_path(python_refused):
    lst = ad.WengertList()
    x = ad.Tensor._input(A43[0], lst)
    assert x[1:].shape == (2,) and x[:, ][::2].shape == (2,)
    assert type(x[1]) is ad.Record and type(x[(0,)]) is ad.Record


def test_buffers_are_counted_and_owned():
    be = _devices.resolve("numpy")
    be.live_buffers                                        # counting on
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    parts = [x[1:], x.T, x.sum(axis=0), x.max(axis=1), x @ ad.Tensor.constant(A43[0])]
    for p in parts:
        assert p._data.flags.c_contiguous and p._data.base is None
    before = [p.value.copy() for p in parts]
    x._data[...] = 0.0
    for p, v in zip(parts, before):
        assert np.array_equal(p.value, v)
    counted = be.live_buffers
    del parts, p
    assert be.live_buffers < counted


def _steps(be):
    f64 = np.dtype(np.float64)
    g = np.arange(3.0)
    return {
        "sum": SumStep(ad.Tensor, be, (1, 3), (4, 3), f64),
        "max": ExtremeStep(ad.Tensor, be, (1, 3), (4, 3), f64, TIES, TIES.max(axis=0,
                                                                              keepdims=True),
                           (0,)),
        "reshape": ReshapeStep(be, (3, 1)),
        "transpose": TransposeStep(be, (3,), (0,)),
        "slice": KeySliceStep(ad.Tensor, be, (4, 3), f64, (1,)),
        "matmul": MatmulStep(ad.Tensor, be, f64, (), (4, 3), (3, 1), (4, 3, 1), (1, 4, 3),
                             A43.reshape(1, 4, 3), g.reshape(1, 3, 1),
                             ((A43, (4, 3), f64, 0), (g, (3,), f64, 1))),
    }


def test_steps_keep_their_python_api():
    steps = _steps(_devices.resolve("numpy"))
    g = np.arange(3.0)
    for step in steps.values():
        assert isinstance(step, Step) and isinstance(step, _CoreStep)
        assert step.graph is not None
    np.testing.assert_array_equal(steps["sum"](g)[0], np.broadcast_to(g, (4, 3)))
    np.testing.assert_array_equal(steps["sum"](2.0)[0], np.full((4, 3), 2.0))
    np.testing.assert_array_equal(steps["max"](g)[0], [[0, 0, 0], [0, 0, 0], [0, 0, 0],
                                                       [0, 1, 2]])
    assert steps["reshape"](g)[0].shape == (3, 1)
    np.testing.assert_array_equal(steps["slice"](g)[0][1], g)
    ga, gb = steps["matmul"](np.ones(4))
    np.testing.assert_array_equal(ga, np.broadcast_to(g, (4, 3)))
    np.testing.assert_allclose(gb, A43.sum(axis=0), rtol=1e-14)
    assert steps["sum"].kept == (1, 3) and steps["matmul"].mkn == (4, 3, 1)
    with pytest.raises(AttributeError):
        steps["sum"].kept = (3,)
    with pytest.raises(NotImplementedError):
        Step()(1.0)


def test_steps_pickle_as_before():
    """A step pickles where what it holds does (as the Python classes did; a backend
    counting its buffers does not), the Python ones too."""
    from easyad.tensor._steps import AstypeStep
    for name, step in _steps("a backend").items():
        copy = pickle.loads(pickle.dumps(step))
        assert type(copy) is type(step) and copy.be == "a backend", name
        assert pickle.dumps(copy) == pickle.dumps(step), name
    step = AstypeStep("a backend", (2,), np.dtype(np.float32))
    assert isinstance(step, Step) and not isinstance(step, _CoreStep)
    assert pickle.loads(pickle.dumps(step)).shape == (2,)


def test_a_releasing_sweep_drops_the_core_steps():
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    z = (x.T @ x[:, 0]).max() + x.reshape(12)[3:].sum() + x.mean(axis=0).min()
    lst._backward_from(z, None, True)
    labels = set()
    for node in _nodes(lst):
        labels.add(node.label)
        assert node.vjp is _released_vjp and node.graph is _released_vjp
    assert {"transpose", "matmul", "max", "reshape", "getitem", "sum", "min"} <= labels
    with pytest.raises(RuntimeError, match="released"):
        z.derivatives()


def test_third_derivatives_through_the_c_steps():
    lst = ad.WengertList()
    x0, v = np.array([0.5, -1.0, 1.5, 2.0]), np.array([1.0, 2.0, -1.0, 3.0])
    x = ad.Tensor.variable(x0, lst)
    y = x.reshape(2, 2).T.reshape(4)               # x0 x2 x1 x3
    d1 = ((y[1:3] ** 3).sum() + (y @ y) * y[0]).derivatives(create_graph=True)[x]
    d2 = (d1 * v).sum().derivatives(create_graph=True)[x]
    d3 = (d2 * v).sum().derivatives()[x]
    # f = x2^3 + x1^3 + |x|^2 x0: third derivative along v
    s = 6 * v[1] ** 3 + 6 * v[2] ** 3 + 6 * v[0] * (v @ v)
    assert float(np.sum(d3 * v)) == pytest.approx(s, rel=1e-12)

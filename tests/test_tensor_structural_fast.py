"""The structural operations' numpy fast paths (the core's C paths, _engine/structural.pxi,
where they take the case, and easyad/tensor/_structural.py's Python ones: sum, mean,
max, min over all axes or one int axis; getitem with ints and slices; reshape; 2-D
transpose; matmul of 1-D/2-D and same-batch 3-D operands) against the general path
(``_fast`` patched to say no): the same values bit for bit, the same result types, shapes
and dtypes, the same gradients and second derivatives (create_graph), the same errors;
and that the fast path is the one taken."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad.tensor import _structural
from easyad.tensor import _shapes

RNG = np.random.default_rng(7)
A43 = RNG.standard_normal((4, 3))
A234 = RNG.standard_normal((2, 3, 4))

# name -> (f, input arrays)
CASES = {
    "sum": (lambda x: x.sum(), [A43]),
    "sum0": (lambda x: x.sum(axis=0), [A43]),
    "sum-1": (lambda x: x.sum(axis=-1), [A234]),
    "sum1keep": (lambda x: x.sum(axis=1, keepdims=True), [A234]),
    "sumkeep": (lambda x: x.sum(keepdims=True), [A43]),
    "sum0d": (lambda x: x.sum(), [np.array(2.5)]),
    "sum_empty": (lambda x: x.sum(), [np.zeros((0, 3))]),
    "sum_empty0": (lambda x: x.sum(axis=0), [np.zeros((0, 3))]),
    "sum_vector": (lambda x: x.sum(axis=0), [A43[:, 0]]),
    "mean": (lambda x: x.mean(), [A43]),
    "mean1": (lambda x: x.mean(axis=1), [A43]),
    "mean-2keep": (lambda x: x.mean(axis=-2, keepdims=True), [A234]),
    "mean_empty": (lambda x: x.mean(axis=0), [np.zeros((0, 3))]),
    "max": (lambda x: x.max(), [A43]),
    "max1": (lambda x: x.max(axis=1), [A43]),
    "min0keep": (lambda x: x.min(axis=0, keepdims=True), [A234]),
    "max_ties": (lambda x: x.max(axis=1), [np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])]),
    "min_ties": (lambda x: x.min(), [np.array([[1.0, 0.0], [0.0, 2.0]])]),
    "slice": (lambda x: x[1:], [A43]),
    "int": (lambda x: x[1], [A43]),
    "negint": (lambda x: x[-1], [A43]),
    "column": (lambda x: x[:, 0], [A43]),
    "negcolumn": (lambda x: x[:, -1], [A43]),
    "step": (lambda x: x[::2], [A43]),
    "reverse": (lambda x: x[1:3, ::-1], [A43]),
    "negstep": (lambda x: x[::-2, 1:], [A234]),
    "element": (lambda x: x[1, 2], [A43]),
    "element3": (lambda x: x[1, -1, 0], [A234]),
    "vector_element": (lambda x: x[2], [A43[:, 1]]),
    "empty_slice": (lambda x: x[5:], [A43]),
    "empty_tuple": (lambda x: x[()], [A43]),
    "empty_tuple0d": (lambda x: x[()], [np.array(1.5)]),
    "mixed": (lambda x: x[0, 1:], [A234]),
    "reshape": (lambda x: x.reshape(12), [A43]),
    "reshape2": (lambda x: x.reshape(3, 4), [A43]),
    "reshape-1": (lambda x: x.reshape((-1,)), [A234]),
    "reshape2-1": (lambda x: x.reshape(2, -1), [A43]),
    "reshape0d": (lambda x: x.reshape(()), [np.array(2.0)]),
    "reshape_bool": (lambda x: x.reshape((True, 12)) + x.reshape((1, 12)), [A43]),
    "reshape_numpy_int": (lambda x: x.reshape((np.int64(2), 6)), [A43]),
    "index_numpy_int": (lambda x: x[np.int64(1), True:], [A43]),
    "reshape_empty": (lambda x: x.reshape(3, 0), [np.zeros((0, 3))]),
    "T": (lambda x: x.T, [A43]),
    "transpose": (lambda x: x.transpose(), [A43]),
    "transpose10": (lambda x: x.transpose(1, 0), [A43]),
    "transpose_empty": (lambda x: x.T, [np.zeros((0, 3))]),
    "T_of_T": (lambda x: x.T.T * 2.0, [A43]),
    "mm": (lambda a, b: a @ b, [A43, RNG.standard_normal((3, 2))]),
    "mv": (lambda a, b: a @ b, [A43, RNG.standard_normal(3)]),
    "vm": (lambda a, b: a @ b, [RNG.standard_normal(4), A43]),
    "vv": (lambda a, b: a @ b, [RNG.standard_normal(3), RNG.standard_normal(3)]),
    "bmm": (lambda a, b: a @ b, [A234, RNG.standard_normal((2, 4, 5))]),
    "bmm1": (lambda a, b: a @ b, [A234[:1], RNG.standard_normal((1, 4, 2))]),
    "mm_empty": (lambda a, b: a @ b, [np.zeros((0, 3)), RNG.standard_normal((3, 2))]),
    "mm_inner_empty": (lambda a, b: a @ b, [np.zeros((2, 0)), np.zeros((0, 3))]),
    "mm_big": (lambda a, b: a @ b, [RNG.standard_normal((37, 65)),
                                    RNG.standard_normal((65, 29))]),
    "mv_big": (lambda a, b: a @ b, [RNG.standard_normal((37, 65)), RNG.standard_normal(65)]),
    "vm_big": (lambda a, b: a @ b, [RNG.standard_normal(37), RNG.standard_normal((37, 65))]),
    "matmul_method": (lambda a, b: a.matmul(b) + b.sum(), [A43, RNG.standard_normal(3)]),
    "chain": (lambda a, b: ((a.T @ a)[1:, :2].reshape(4) * b.max()).mean(),
              [A43, RNG.standard_normal(3)]),
}


@pytest.fixture
def general(monkeypatch):
    """Within the test: every fast path off (the core's C paths too)."""
    def use_general():
        monkeypatch.setattr(_structural, "_fast", lambda t: False)
        previous = _core._structural_fast(False)
        restore.append(lambda: _core._structural_fast(previous))
    restore = []
    yield use_general
    for undo in restore:
        undo()


def _as_result(v):
    if isinstance(v, ad.Tensor):
        return ("tensor", v.shape, v.dtype, v.value)
    if isinstance(v, ad.Record):
        return ("record", v.number)
    return (type(v).__name__, v)


def _same(a, b):
    assert a[0] == b[0]
    if a[0] == "tensor":
        assert a[1] == b[1] and a[2] == b[2]
        assert np.array_equal(a[3], b[3], equal_nan=True) and a[3].dtype == b[3].dtype
    else:
        assert np.array_equal(a[1:], b[1:], equal_nan=True)


def _run(f, arrays, dtype, constant=()):
    """(value, per-input gradients of a weighted sum, H v) of f; inputs numbered in
    ``constant`` are constants."""
    lst = ad.WengertList()
    ts = [ad.Tensor.constant(a, dtype=dtype) if k in constant
          else ad.Tensor.variable(a, lst, dtype=dtype) for k, a in enumerate(arrays)]
    out = f(*ts)
    value = _as_result(out)
    if isinstance(out, ad.Tensor):
        w = np.linspace(-1.0, 2.0, out.size).reshape(out.shape)
        loss = (out * w).sum()
    else:
        loss = out * 1.5
    variables = [t for k, t in enumerate(ts) if k not in constant]
    if not isinstance(loss, ad.Record):
        return value, None, None
    d = loss.derivatives()
    grads = [np.asarray(d[t]) for t in variables]
    d2 = loss.derivatives(create_graph=True)
    total = 0.0
    for t in variables:
        v = np.cos(np.arange(t.size, dtype=np.float64)).reshape(t.shape)
        g = d2[t]
        total = total + (g * v).sum() if isinstance(g, ad.Tensor) else total
    hv = None
    if isinstance(total, ad.Record):
        dd = total.derivatives()
        hv = [np.asarray(dd[t]) for t in variables]
    return value, grads, hv


def _compare(fast, slow):
    _same(fast[0], slow[0])
    for got, want in ((fast[1], slow[1]), (fast[2], slow[2])):
        assert (got is None) == (want is None)
        if got is not None:
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype
                assert np.array_equal(g, w, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_equals_general_path(name, dtype, general):
    f, arrays = CASES[name]
    fast = _run(f, arrays, dtype)
    general()
    slow = _run(f, arrays, dtype)
    _compare(fast, slow)


@pytest.mark.parametrize("name", ["mm", "mv", "vm", "vv", "bmm"])
@pytest.mark.parametrize("constant", [(0,), (1,), (0, 1)])
def test_matmul_with_constants(name, constant, general):
    f, arrays = CASES[name]
    fast = _run(f, arrays, None, constant)
    general()
    slow = _run(f, arrays, None, constant)
    _compare(fast, slow)


def test_gradients_are_finite_differences():
    """The fast paths' adjoints against central differences (not only the general path)."""
    a, b = A43, RNG.standard_normal(3)

    def f(x, y):
        return ((x.T[:, 1:] @ x[1:]) @ y).reshape(3, 1).sum(axis=1).max() \
            + x[2, 1] * x.mean(axis=0)[1] + x.min()

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


def _error(f, *arrays):
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst) for a in arrays]
    with pytest.raises(Exception) as info:
        f(*ts)
    return type(info.value), str(info.value)


ERRORS = {
    "axis2": (lambda x: x.sum(axis=2), [A43]),
    "axis-3": (lambda x: x.mean(axis=-3), [A43]),
    "max_axis": (lambda x: x.max(axis=5), [A43]),
    "max_empty": (lambda x: x.max(), [np.zeros((0, 3))]),
    "min_empty_axis": (lambda x: x.min(axis=0), [np.zeros((0, 3))]),
    "sum_0d_axis": (lambda x: x.sum(axis=0), [np.array(1.0)]),
    "index4": (lambda x: x[4], [A43]),
    "index-5": (lambda x: x[-5], [A43]),
    "index_col": (lambda x: x[:, 3], [A43]),
    "too_many": (lambda x: x[0, 0, 0], [A43]),
    "float_index": (lambda x: x[1.0], [A43]),
    "float_slice": (lambda x: x[1.0:], [A43]),
    "zero_step": (lambda x: x[::0], [A43]),
    "index_0d": (lambda x: x[0], [np.array(1.0)]),
    "reshape5": (lambda x: x.reshape(5), [A43]),
    "reshape-1-1": (lambda x: x.reshape(-1, -1), [A43]),
    "reshape_float": (lambda x: x.reshape((2.0, 6)), [A43]),
    "reshape-2": (lambda x: x.reshape(-2, -6), [A43]),
    "transpose00": (lambda x: x.transpose(0, 0), [A43]),
    "transpose_float": (lambda x: x.transpose(1.0, 0), [A43]),
    "mm_inner": (lambda a, b: a @ b, [A43, RNG.standard_normal((4, 2))]),
    "mv_inner": (lambda a, b: a @ b, [A43, RNG.standard_normal(4)]),
    "vv_inner": (lambda a, b: a @ b, [RNG.standard_normal(3), RNG.standard_normal(4)]),
    "bmm_batch": (lambda a, b: a @ b, [A234, RNG.standard_normal((3, 4, 2))]),
    "matmul_0d": (lambda a, b: a @ b, [np.array(1.0), A43]),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_are_the_general_paths(name, general):
    f, arrays = ERRORS[name]
    fast = _error(f, *arrays)
    general()
    assert fast == _error(f, *arrays)


def test_stale_tensors_still_raise():
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    y = ad.Tensor.variable(A43.T, lst)
    lst.clear()
    for f in (lambda: x.sum(), lambda: x.sum(axis=0), lambda: x.max(), lambda: x[1:],
              lambda: x.reshape(12), lambda: x.T, lambda: x @ y, lambda: x.mean()):
        with pytest.raises(ad.StaleRecordError):
            f()


def test_results_own_their_buffers():
    """Slices and transposes are copies: writing the operand's buffer leaves them be."""
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    parts = [x[1:], x[:, 0], x.T, x[::2]]
    before = [p.value.copy() for p in parts]
    x._data[...] = 0.0
    for p, v in zip(parts, before):
        assert np.array_equal(p.value, v)
        assert p._data.flags.c_contiguous and p._data.base is None


def test_the_fast_path_is_taken(monkeypatch):
    """With the general path's helpers made to raise, every fast case still works
    (forward and backward)."""
    def boom(*args, **kwargs):
        raise AssertionError("the general path was taken")
    for name in ("_index_key", "permute", "as_batched"):
        monkeypatch.setattr(_structural, name, boom)
    # the op table's ops (the general path of sum, max, min, reshape, transpose)
    monkeypatch.setattr(_structural, "TABLE_OPS", dict.fromkeys(_structural.TABLE_OPS, boom))
    monkeypatch.setattr(_shapes, "normalize_axes", boom)
    monkeypatch.setattr(_shapes, "basic_index", boom)
    monkeypatch.setattr(_shapes, "transpose", boom)
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    b = ad.Tensor.variable(RNG.standard_normal(3), lst)
    B = ad.Tensor.variable(RNG.standard_normal((3, 2)), lst)
    z = (x.sum() + x.sum(axis=0)[1] + x.mean(axis=-1)[0] + x.max(axis=1)[2] + x.min()
         + x[1:][0, 1] + x[:, 0][1] + x.reshape(12)[5] + x.T[1, 2] + (x @ b)[0]
         + (x @ B)[1, 1] + (b @ x.T)[3] + b @ b)
    d = z.derivatives()
    assert d[x].shape == (4, 3) and d[b].shape == (3,) and d[B].shape == (3, 2)


def test_other_backends_take_the_general_path():
    """eval_shape (the meta backend) and ad.record's program backend still work."""
    def f(x):
        return ((x.T @ x)[1:, :2].reshape(4) * x.max()).sum() + x.mean(axis=0)[1]
    shape = ad.eval_shape(f, np.zeros((4, 3)))
    assert tuple(getattr(shape, "shape", ())) == ()
    g = ad.grad(f)(A43)
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    np.testing.assert_allclose(g, f(x).derivatives()[x], rtol=1e-12)

"""The two executors of ``batch_plan``'s plans against each other: the numpy device's
(``batch_np.run_plan``) and OpenCL's (``batch_steps.BatchStep``) run the same batched
matmul / linear / linear_vjp / reduce steps on random shapes (both product orders,
x @ x.T, shared and per-point operands, B = 1, odd sizes, float32 and float64, ties,
zeros and large magnitudes), and both against one replay per point (the numpy backend's
own op at each point) and an exact reference.

Tolerance (docs/record-replay.md, "Batches"): a product's entry is a sum of K products,
which the engines add in different orders (BLAS blocking, the OpenCL GEMM's tiles), so
each entry is within K u (|a| |b|) of the exact value (u: the dtype's unit roundoff;
Higham's bound for a dot product, plus one term for linear's bias) and two engines
within twice that; a sum reduction of n numbers within n u sum |x|; max and min, and
every result of small integers (ties, zeros: every partial sum exact), are bitwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.compiler import ir
from easyad.compiler.program import batch_cl, batch_np, batch_steps
from easyad.compiler.program.batch_plan import Layout, plan_step, supported
from easyad.tensor import _devices

from conftest import OPENCL

_NUMPY = _devices.NUMPY.backend


def _values(rng, shape, dtype, kind):
    if kind == "ints":            # ties and zeros: every sum exact
        return rng.integers(-2, 3, size=shape).astype(dtype)
    scale = {"normal": 1.0, "large": 1e100 if dtype == np.float64 else 1e15}[kind]
    return (rng.normal(size=shape) * scale).astype(dtype)


def _matmul_case(rng):
    n, M, K, N = rng.integers(1, 4), *rng.integers(1, 8, size=3)
    ta, tb = (bool(t) for t in rng.integers(0, 2, size=2))
    ba, bb = ((n, n), (1, n), (n, 1), (1, 1))[rng.integers(0, 4)]
    sa = (ba, K, M) if ta else (ba, M, K)
    sb = (bb, N, K) if tb else (bb, K, N)
    if rng.random() < 0.2:        # x @ x.T: one slot both sides
        return ir.Node("matmul", ir.Matmul(False, True), (0, 0), (2,)), [sa, sa, None]
    return ir.Node("matmul", ir.Matmul(ta, tb), (0, 1), (2,)), [sa, sb, None]


def _linear_case(rng):
    n, k, m = rng.integers(1, 7, size=3)
    x = (k,) if rng.random() < 0.3 else (n, k)
    bias = ("none", "row", "number", "float")[rng.integers(0, 4)]
    shapes = [x, (m, k), (m,) if bias == "row" else (), None]
    b = {"none": None, "row": 2, "number": 2, "float": 0.75}[bias]
    return ir.Node("linear", ir.Linear(), (0, 1, b), (3,)), shapes


def _linear_vjp_case(rng):
    n, o, k = rng.integers(1, 7, size=3)
    needs = tuple(bool(v) for v in rng.integers(0, 2, size=3))
    if not any(needs):
        needs = (True, True, True)
    ins = (0, 1 if needs[1] else None, 2 if needs[0] else None)
    outs = tuple(range(3, 3 + sum(needs)))
    return ir.Node("linear_vjp", ir.LinearVjp(needs), ins, outs), [(n, o), (n, k), (o, k)]


def _reduce_case(rng):
    shape = tuple(int(d) for d in rng.integers(1, 6, size=rng.integers(1, 4)))
    axes = tuple(d for d in range(len(shape)) if rng.random() < 0.5) or (len(shape) - 1,)
    op = ("sum", "max", "min")[rng.integers(0, 3)]
    return ir.Node("reduce", ir.Reduce(op, axes), (0,), (1,)), [shape, None]


def _scatter_case(rng):
    shape = tuple(int(d) for d in rng.integers(1, 5, size=rng.integers(1, 3)))
    size = int(np.prod(shape))
    unique = bool(rng.integers(0, 2))
    if unique:
        index = rng.permutation(size)[:rng.integers(1, size + 1)]
        index = index.reshape(1, -1) if rng.random() < 0.5 else index
    else:                        # repeated indices: added up
        index = rng.integers(0, size, size=(int(rng.integers(1, 4)), 5))
    g = (index.shape, index.shape[-1:], (1,))[rng.integers(0, 3)]   # or broadcast
    params = ir.ScatterAdd(shape, np.dtype(np.float64), index.astype(np.int64), unique)
    return ir.Node("scatter_add", params, (0,), (1,)), [g, None]


def _assemble_case(rng):
    rows, cols = (int(d) for d in rng.integers(2, 6, size=2))
    cut = sorted({0, rows, *(int(c) for c in rng.integers(1, rows, size=2))})
    parts = tuple(ir.Part(a * cols, (b - a, cols), (cols, 1)) for a, b in zip(cut, cut[1:]))
    ins = tuple(range(len(parts)))
    out = len(parts)
    return (ir.Node("assemble", ir.Assemble((rows, cols), np.dtype(np.float64), parts), ins,
                    (out,)), [tuple(q.shape) for q in parts] + [None])


_MAKERS = (_matmul_case, _linear_case, _linear_vjp_case, _reduce_case, _scatter_case,
           _assemble_case)


def _cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        ins, shapes = _MAKERS[i % len(_MAKERS)](rng)
        slots = sorted({s for s in ins.ins if type(s) is int})
        own = {s: bool(rng.integers(0, 2)) for s in slots}
        B = int((1, 2, 5)[rng.integers(0, 3)])
        dtype = (np.float64, np.float32)[rng.integers(0, 2)]
        kind = ("normal", "ints", "large")[rng.integers(0, 3)]
        if ins.op in ("scatter_add", "assemble"):       # the result's dtype: x's
            ins = ir.Node(ins.op, ins.params._replace(dtype=np.dtype(dtype)), ins.ins,
                          ins.outs)
        cases.append((ins, shapes, own, B, dtype, kind, seed * 1000 + i))
    return cases


def _one_point(ins, point):
    """The step at one point: the numpy backend's own op (one replay per point)."""
    p, be = ins.params, _NUMPY
    if ins.op == "matmul":
        return [be.matmul(point[0], point[1], p.transpose_a, p.transpose_b)]
    if ins.op == "reduce":
        return [be.reduce(p.op, point[0], p.axes)]
    if ins.op == "scatter_add":
        g = np.broadcast_to(point[0], p.index.shape)
        return [be.scatter_add(p.shape, point[0].dtype, p.index, g, p.unique)]
    if ins.op == "assemble":
        return [be.assemble(p.shape, point[0].dtype, [
            (q.offset, q.shape, q.strides, v) for q, v in zip(p.parts, point)])]
    if ins.op == "linear":
        x = point[0]
        out = be.linear(x.reshape(1, -1) if x.ndim == 1 else x, point[1], point[2])
        return [out.reshape(-1) if x.ndim == 1 else out]
    return [v for v in be.linear_vjp(*point, p.needs) if v is not None]


def _bounds(ins, point, dtype):
    """Per output: each entry's bound on its distance from the exact value, and the
    exact value (float64 or long double sums of the same operands)."""
    u = np.finfo(dtype).eps / 2
    wide = [np.asarray(v, dtype=np.longdouble) if isinstance(v, np.ndarray) else v
            for v in point]
    absolute = [np.abs(v) if isinstance(v, np.ndarray) else v for v in wide]

    def t(a, flag):
        return np.swapaxes(a, -1, -2) if flag else a
    p = ins.params
    if ins.op == "matmul":
        a, b = t(wide[0], p.transpose_a), t(wide[1], p.transpose_b)
        k = a.shape[-1]
        return [(a @ b, 1.01 * k * u * (t(absolute[0], p.transpose_a)
                                          @ t(absolute[1], p.transpose_b)))]
    if ins.op == "reduce":
        exact = {"sum": np.sum, "max": np.max, "min": np.min}[p.op](wide[0], axis=p.axes)
        n = np.prod([wide[0].shape[d] for d in p.axes])
        bound = n * u * np.sum(absolute[0], axis=p.axes) if p.op == "sum" else 0 * exact
        return [(exact, bound)]
    if ins.op == "scatter_add":
        exact = np.zeros(int(np.prod(p.shape)), dtype=np.longdouble)
        bound = np.zeros_like(exact)
        g = np.broadcast_to(wide[0], p.index.shape).reshape(-1)
        np.add.at(exact, p.index.reshape(-1), g)
        np.add.at(bound, p.index.reshape(-1), np.abs(g))
        return [(exact.reshape(p.shape), p.index.size * u * bound.reshape(p.shape))]
    if ins.op == "assemble":
        exact = np.concatenate(wide)
        return [(exact, 0 * exact)]
    if ins.op == "linear":
        x, w, b = wide
        k = w.shape[1]
        bias = 0.0 if b is None else b
        return [(x @ w.T + bias, 1.01 * (k + 1) * u * (np.abs(x) @ np.abs(w).T
                                                      + np.abs(bias)))]
    g, x, w = wide
    found = []
    if p.needs[0]:
        found.append((g @ w, 1.01 * g.shape[1] * u * (np.abs(g) @ np.abs(w))))
    if p.needs[1]:
        found.append((g.T @ x, 1.01 * g.shape[0] * u * (np.abs(g).T @ np.abs(x))))
    if p.needs[2]:
        found.append((g.sum(axis=0), g.shape[0] * u * np.abs(g).sum(axis=0)))
    return found


def _run_engines(case, be):
    """(numpy engine's outputs, OpenCL's or None, one replay per point, bounds), each
    output (B,) + a point's shape."""
    ins, shapes, own, B, dtype, kind, seed = case
    rng = np.random.default_rng(seed)
    values = {s: _values(rng, ((B,) if own[s] else ()) + shapes[s], dtype, kind)
              for s in own}
    point_of = [lambda b, s=s: (values[s][b] if own[s] else values[s]) if type(s) is int
                else s for s in ins.ins]
    points = [[f(b) for f in point_of] for b in range(B)]
    per_point = [np.stack(o) for o in zip(*(_one_point(ins, pt) for pt in points))]
    bounds = [list(zip(*(_bounds(ins, pt, dtype)[k] for pt in points)))
              for k in range(len(per_point))]
    bounds = [(np.stack(e), np.stack(b)) for e, b in bounds]
    shape_of = [e.shape[1:] for e, _ in bounds]
    # (the numpy backend's reduce to a number gives (1,): the same values)
    per_point = [o.reshape((B,) + sh) for o, sh in zip(per_point, shape_of)]
    operands = tuple(type(s) is int and own[s] for s in ins.ins)
    plan = plan_step(ins, shapes, operands, True)
    bufs = [values[s].reshape(B, -1) if type(s) is int and own[s] else
            values[s] if type(s) is int else s for s in ins.ins]
    numpy_out = [np.broadcast_to(np.asarray(o).reshape(((B,) if mine else ()) + sh),
                                 (B,) + sh)
                 for (o, mine), sh in zip(batch_np.run_plan(_NUMPY, plan, bufs, B),
                                          shape_of)]
    cl_out = None
    if be is not None:
        arrays: list = [None] * (max(ins.outs) + 1)
        for s, v in values.items():
            arrays[s] = be.asarray(np.ascontiguousarray(v), dtype)
        step = batch_steps.BatchStep(ins, lambda i: i, shapes)
        step.run(be, arrays, B, lambda r: not own[r])
        cl_out = [be.to_numpy(arrays[o]).reshape((B,) + sh) for o, sh in
                  zip(ins.outs, shape_of)]
    return numpy_out, cl_out, per_point, bounds


def _agree(got, want, bound, exact, what):
    got = np.asarray(got, dtype=np.longdouble)
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    excess = np.abs(got - np.asarray(want, dtype=np.longdouble)) - bound
    assert excess.max(initial=0) <= 0, (what, float(excess.max()))


def _check_case(case, be):
    ins, shapes, own, B, dtype, kind, _ = case
    numpy_out, cl_out, per_point, bounds = _run_engines(case, be)
    bitwise = kind == "ints" or ins.op == "assemble" or (
        ins.op == "reduce" and ins.params.op != "sum")
    # a scatter adds each point's values in index order on either engine: the same bits
    same = bitwise or ins.op == "scatter_add"
    for k, (exact, bound) in enumerate(bounds):
        what = f"{ins.op} {ins.params} {shapes} own={own} B={B} {np.dtype(dtype)} {kind}"
        assert numpy_out[k].dtype == per_point[k].dtype == dtype, what
        if kind != "large" or np.isfinite(exact).all():
            _agree(numpy_out[k], exact, bound, bitwise, what + " numpy vs exact")
            _agree(per_point[k], exact, bound, bitwise, what + " per point vs exact")
        _agree(numpy_out[k], per_point[k], 2 * bound, same, what + " numpy vs per point")
        if cl_out is not None:
            assert cl_out[k].dtype == dtype, what
            _agree(cl_out[k], exact, bound, bitwise, what + " OpenCL vs exact")
            _agree(cl_out[k], numpy_out[k], 2 * bound, same, what + " OpenCL vs numpy")


def test_numpy_engine_random_steps():
    """The numpy device's executor on 160 random steps (no OpenCL needed)."""
    for case in _cases(160, 60):
        _check_case(case, None)


@pytest.mark.skipif(not OPENCL, reason="no usable OpenCL device")
def test_engines_agree_random_steps():
    """Both executors on the same 48 random steps (the first OpenCL device: the kernels
    of a fresh PoCL cache build in a few seconds)."""
    be = _devices.find_device(OPENCL[0]).backend
    for case in _cases(48, 61):
        if case[4] == np.float64 and not be.device.fp64:
            continue
        _check_case(case, be)


def test_every_layout_is_planned():
    """The random steps above reach every route of the planner (a product of shared
    operands, the points' rows, rows read transposed, vectors, stacks, tiles)."""
    seen = set()
    for ins, shapes, own, *_ in _cases(160, 60):
        operands = tuple(type(s) is int and own[s] for s in ins.ins)
        for result in plan_step(ins, shapes, operands, False).results:
            for read in (getattr(result, "left", None), getattr(result, "right", None)):
                if read is not None:
                    seen.add((read.layout, read.transposed))
    assert seen == {(layout, False) for layout in Layout} | {(Layout.FLAT, True)}


def test_unplannable_steps_are_refused():
    """linear with a 3-d x and a 4-d slot in linear_vjp are not planned: both devices
    then replay such a program point by point; a product of 2-d slots is an error."""
    assert not supported(ir.Node("linear", ir.Linear(), (0, 1, None), (2,)),
                         [(2, 3, 4), (5, 4), None])
    assert not supported(ir.Node("linear_vjp", ir.LinearVjp((True, True, False)),
                                 (0, 1, 2), (3, 4)), [(2, 3, 1, 1), (2, 4), (3, 4)])
    with pytest.raises(ValueError, match="3-d operands"):
        plan_step(ir.Node("matmul", ir.Matmul(False, False), (0, 1), (2,)),
                  [(2, 3), (3, 4), None], (True, False), True)


_IDX = np.array([0, 2, 2, 1, 0])


def _gathered(x):        # a gather's adjoint (repeated indices) and a two-part concatenate
    return ad.sum(ad.sin(x[_IDX])) + ad.sum(ad.concatenate([ad.tanh(x[:2]), x[1:] * 2.0])
                                            ** 2)


@pytest.mark.skipif(not OPENCL, reason="no usable OpenCL device")
def test_scatter_and_assemble_batch_on_opencl():
    """A program whose OpenCL form has a scatter-add of repeated indices and an assemble
    of two parts (backend steps) batches there now: hand-derived values and gradients."""
    F = ad.record(_gathered, np.ones(4), tensor=True, device=OPENCL[0])
    X = np.random.default_rng(64).normal(size=(6, 4))
    values, grads = F.value_and_gradient(X)
    fused = F._bound["gradient"]
    assert {"scatter_add", "assemble"} <= {s.instruction.op for s in fused.steps
                                            if hasattr(s, "instruction")}
    assert batch_cl.batched(fused) is not None
    t = np.tanh(X[:, :2])
    want = np.sin(X[:, _IDX]).sum(axis=1) + (t * t).sum(axis=1) + (4 * X[:, 1:] ** 2).sum(
        axis=1)
    np.testing.assert_allclose(values, want, rtol=1e-13)
    g = np.zeros_like(X)
    np.add.at(g.T, _IDX, np.cos(X[:, _IDX]).T)
    g[:, :2] += 2 * t * (1 - t * t)
    g[:, 1:] += 8 * X[:, 1:]
    np.testing.assert_allclose(grads, g, rtol=1e-13, atol=1e-14)

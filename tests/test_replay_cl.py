"""OpenCL replay of scalar tapes (issue 4): one kernel per tape, one work-item per point,
checked against the scalar reverse mode recording the function anew at every point."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.compiler.tape.render_cl import render_replay_kernel, replay_gradient_opencl

# every test runs on each working OpenCL device (the opencl_device fixture, conftest.py)


def rosenbrock(x):
    total = 0.0
    for i in range(len(x) - 1):
        total = total + 100.0 * (x[i + 1] - x[i] * x[i]) ** 2 + (1.0 - x[i]) ** 2
    return total


def mixed(x):
    a, b, c = x
    u = ad.sin(a) * ad.exp(-b * b) + ad.log1p(c * c) / (1.0 + ad.abs(a))
    v = ad.atan2(a, b) + ad.hypot(b, c) - ad.maximum(a, c) + ad.minimum(2.0, b)
    w = ad.tanh(u) ** 2.5 if False else ad.sqrt(1.0 + u * u) ** 1.5
    return u * v + w + ad.cbrt(c) * ad.erf(a) + 3.0 ** a - ad.asinh(b) * ad.cosh(0.1 * c)


def branchy(x):
    a, b = x
    y = ad.where(a > b, a * b, a - b)          # a select: follows the new point
    if a > 0:                                  # a guard: replay reports a flip
        return y * ad.exp(a)
    return y - a * a


def record_and_replay(f, x0, X, device):
    lst = ad.WengertList()
    xs = [lst.variable(v) for v in x0]
    out = f(xs)
    return replay_gradient_opencl(lst._arrays(), [r.index for r in xs], out.index, X, device)


def scalar_reference(f, X):
    values, grads = [], []
    for row in X:
        lst = ad.WengertList()
        xs = [lst.variable(float(v)) for v in row]
        out = f(xs)
        d = out.derivatives()
        values.append(out.number)
        grads.append([d[x] for x in xs])
    return np.array(values), np.array(grads)


@pytest.mark.parametrize("f,n,scale", [(rosenbrock, 100, 1.0), (rosenbrock, 3, 2.0),
                                       (mixed, 3, 1.0)], ids=["rosenbrock100", "rosenbrock3",
                                                              "mixed"])
def test_replay_matches_scalar_reverse_mode(f, n, scale, opencl_device):
    rng = np.random.default_rng(7)
    X = rng.uniform(0.1, 1.0, (64, n)) * scale
    values, grads, changed = record_and_replay(f, X[0], X, opencl_device)
    ref_values, ref_grads = scalar_reference(f, X)
    assert not changed.any()
    np.testing.assert_allclose(values, ref_values, rtol=1e-12)
    np.testing.assert_allclose(grads, ref_grads, rtol=1e-11, atol=1e-12)


def test_guards_report_changed_branches_and_selects_follow(opencl_device):
    X = np.array([[1.0, 0.5], [2.0, 3.0], [-1.0, -2.0], [-0.5, 0.5], [0.7, 0.7]])
    values, grads, changed = record_and_replay(branchy, X[0], X, opencl_device)
    assert changed.tolist() == [False, False, True, True, False]
    ref_values, ref_grads = scalar_reference(branchy, X)
    ok = ~changed
    np.testing.assert_allclose(values[ok], ref_values[ok], rtol=1e-13)
    np.testing.assert_allclose(grads[ok], ref_grads[ok], rtol=1e-13)


def test_kernel_is_straight_line_from_the_rule_table():
    lst = ad.WengertList()
    x = lst.variable(0.5)
    y = ad.sin(x) * x
    source = render_replay_kernel(lst._arrays(), [x.index], y.index)
    assert "sin(x)" in source and "cos(x)" in source   # the rule's value and partial text
    assert "for" not in source.split("__kernel")[1]      # no loop over the tape


def test_tensor_entries_are_refused():
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones(3), lst)
    s = ad.sum(t)
    with pytest.raises(NotImplementedError, match="node"):
        render_replay_kernel(lst._arrays(), [], s.index)


def test_function_gradient_on_opencl_with_branches(opencl_device):
    def branchy(x):
        if x[0] > 0:
            return x[0] * x[1] ** 2
        return -x[0] * x[1]

    F = ad.record(branchy, [1.0, 2.0])
    X = np.array([[2.0, 3.0], [0.5, -1.0], [-2.0, 3.0]])
    np.testing.assert_allclose(F.gradient(X[:2], device=opencl_device), F.gradient(X[:2]),
                               rtol=1e-14)
    with pytest.raises(ad.BranchChangedError, match=r"x\[0\] > 0.0"):
        F.gradient(X, device=opencl_device)
    np.testing.assert_allclose(F.gradient(X, device=opencl_device, on_branch_change="retape"),
                               [[9.0, 12.0], [1.0, -1.0], [-3.0, 2.0]])
    G, mask = F.gradient(X, device=opencl_device, on_branch_change="mask")
    assert mask.tolist() == [False, False, True] and np.isnan(G[2]).all()
    # a guard after the output (f returns its input on one branch) is checked on OpenCL too
    H = ad.record(lambda v: v[0] if v[0] > 0 else -v[0], [1.0])
    with pytest.raises(ad.BranchChangedError):
        H.gradient(np.array([[-1.0]]), device=opencl_device)


# ---- issue 15 item 3: the optimised program, variable-major memory, device-resident batches

from test_replay import random_program  # noqa: E402


def _queue(device):
    from easyad.tensor._devices import find_device
    return find_device(device).backend.queue


def guarded_program(seed, n):
    """random_program plus a guard (Python branches on x[0]), a select whose untaken branch
    has an infinite partial (the strong zero keeps its adjoint 0), and NaN past x[1] > 0.8."""
    f = random_program(seed, n)

    def g(x):
        total = f(x)
        root = ad.where(x[2] > 0.25, ad.sqrt((x[2] - 0.25) ** 2), x[2])  # sqrt'(0) = inf
        nan = ad.where(x[1] > 0.8, x[1] * float("nan"), x[1] * 0.5)
        total = total + root + nan
        if x[0] > -0.5:
            return total * x[0]
        return total - x[0]

    return g


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_match_the_vm(seed, opencl_device):
    n, B = 5, 40
    rng = np.random.default_rng(seed)
    F = ad.record(guarded_program(seed, n), np.full(n, 0.1))
    X = rng.uniform(-1, 1, (B, n))
    X[:4, 1:3] = (0.0, 0.25)          # the sqrt at 0: the strong zero
    X[4:8, 1] = 0.9                   # NaN values and gradients
    want, want_mask = F.gradient(X, on_branch_change="mask")
    assert want_mask.any() and not want_mask.all() and np.isnan(want[~want_mask]).any()
    got, mask = F.gradient(X, device=opencl_device, on_branch_change="mask")
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)   # NaN where the VM's
    # device-resident, both memory orders: the same numbers, left on the device
    import pyopencl.array as cl_array
    queue = _queue(opencl_device)
    for Xd in (cl_array.to_device(queue, np.ascontiguousarray(X.T)).T,   # variable-major
               cl_array.to_device(queue, X)):                           # row-major
        Gd, mask_d = F.gradient(Xd, device=opencl_device, on_branch_change="mask")
        assert isinstance(Gd, cl_array.Array) and Gd.shape == (B, n) and Gd.flags.f_contiguous
        np.testing.assert_array_equal(mask_d, want_mask)
        np.testing.assert_array_equal(Gd.T.get().T, got)


def test_strong_zero_and_nan(opencl_device):
    F = ad.record(lambda x: ad.where(x[0] > 0.25, ad.sqrt((x[0] - 0.25) ** 2), x[0])
                  + ad.where(x[1] > 0.8, x[1] * float("nan"), x[1]), [0.5, 0.5])
    X = np.array([[0.25, 0.5], [0.5, 0.9], [0.0, 0.0]])
    got = F.gradient(X, device=opencl_device)
    np.testing.assert_array_equal(got, F.gradient(X))
    np.testing.assert_array_equal(got[0], [1.0, 1.0])   # 0 * inf = 0: the untaken sqrt
    assert np.isnan(got[1, 1]) and got[1, 0] == 1.0


def test_device_resident_branch_modes(opencl_device):
    import pyopencl.array as cl_array

    def branchy(x):
        if x[0] > 0:
            return x[0] * x[1] ** 2
        return -x[0] * x[1]

    F = ad.record(branchy, [1.0, 2.0])
    X = np.array([[2.0, 3.0], [0.5, -1.0], [-2.0, 3.0]])
    Xd = cl_array.to_device(_queue(opencl_device), np.ascontiguousarray(X.T)).T
    G = F.gradient(cl_array.to_device(_queue(opencl_device), X[:2]))
    np.testing.assert_allclose(G.get(), [[9.0, 12.0], [1.0, -1.0]])   # device defaults
    with pytest.raises(ad.BranchChangedError, match=r"x\[0\] > 0.0"):
        F.gradient(Xd, device=opencl_device)
    G = F.gradient(Xd, device=opencl_device, on_branch_change="retape")
    assert isinstance(G, cl_array.Array)
    np.testing.assert_allclose(G.get(), [[9.0, 12.0], [1.0, -1.0], [-3.0, 2.0]])
    G, mask = F.gradient(Xd, device=opencl_device, on_branch_change="mask")
    assert mask.tolist() == [False, False, True] and np.isnan(G.get()[2]).all()
    g = F.gradient(cl_array.to_device(_queue(opencl_device), X[0]), device=opencl_device)
    assert g.shape == (2,)
    np.testing.assert_allclose(g.get(), [9.0, 12.0])
    with pytest.raises(ValueError, match="shape"):
        F.gradient(cl_array.to_device(_queue(opencl_device), np.ones((2, 3))))


def test_variable_major_layout_and_the_optimised_program(opencl_device):
    import pyopencl.array as cl_array

    F = ad.record(lambda x: x[0] * 1.0 * ad.sin(x[1]) + ad.sin(x[1]) * x[0] + 0.0, [1.0, 2.0])
    kernel = F._cl_kernel(opencl_device)
    source = kernel.source.split("__kernel")[1]
    assert "G[1 * B + row]" in source and "x_var" in source          # variable-major
    assert source.count("sin(x)") == 1      # the optimised program: sin(x[1]) once, no * 1.0
    XT = cl_array.to_device(_queue(opencl_device), np.array([[1.0, 2.0, 3.0],
                                                             [0.5, 0.25, 0.125]]))
    values, grads, changed, any_changed = kernel.run(XT.T)
    assert grads.shape == (2, 3) and grads.flags.c_contiguous and not any_changed
    want = F.gradient(XT.get().T)
    np.testing.assert_allclose(grads.get(), want.T, rtol=1e-15)
    np.testing.assert_allclose(values.get(), F(XT.get().T), rtol=1e-15)


def test_an_array_of_another_context(opencl_device):
    import pyopencl as cl
    import pyopencl.array as cl_array
    from easyad.tensor._devices import find_device

    context = cl.Context([find_device(opencl_device)._handle])
    queue = cl.CommandQueue(context)
    F = ad.record(lambda x: x[0] * ad.exp(x[1]), [1.0, 2.0])
    X = np.array([[1.0, 0.0], [2.0, 1.0]])
    G = F.gradient(cl_array.to_device(queue, X), device=opencl_device)
    assert G.queue is queue
    np.testing.assert_allclose(G.get(), F.gradient(X), rtol=1e-15)

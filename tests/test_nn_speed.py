"""The numpy device's faster nn kernels (issue 28 item 4) against independent references:
max-pool's scatter and gather (torch's max_pool's vjp and its chosen indices, a float64
loop of additions), the one-exponential sigmoid (float64 and torch), the causal mask
cache."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import ops

torch = pytest.importorskip("torch")
TF = torch.nn.functional

# (input shape, kernel, stride, padding, dilation): tiles, overlapping windows, padding,
# dilation, 1-d and 3-d
GEOMETRIES = [((3, 4, 8, 6), (2, 2), (2, 2), (0, 0), (1, 1)),
              ((2, 3, 7, 9), (3, 3), (1, 2), (1, 1), (1, 1)),
              ((2, 3, 9, 8), (2, 3), (3, 2), (1, 0), (2, 1)),
              ((2, 5, 11), (3,), (1,), (1,), (2,)),
              ((1, 2, 5, 6, 4), (2, 3, 2), (1, 2, 2), (1, 1, 0), (1, 1, 1))]

_TORCH_POOL = {1: TF.max_pool1d, 2: TF.max_pool2d, 3: TF.max_pool3d}


def _sample(rng, shape, dtype):
    x = rng.normal(size=shape).astype(dtype)
    x[..., :3] = np.round(x[..., :3])      # ties: the first maximum takes the derivative
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])))
def test_max_pool_scatter_and_gather_match_torch(geometry, dtype):
    shape, kernel, stride, padding, dilation = geometry
    rng = np.random.default_rng(len(shape) * 7 + kernel[0])
    x = _sample(rng, shape, dtype)
    params = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
    pool = _TORCH_POOL[len(kernel)]
    tx = torch.tensor(x.astype(np.float64))
    y, chosen = pool(tx, kernel, stride, padding, dilation, return_indices=True)
    g = rng.normal(size=y.shape).astype(dtype)
    # the scatter is max_pool's vjp: torch's in float64, our float32 within its rounding
    want = torch.func.vjp(lambda z: pool(z, kernel, stride, padding, dilation), tx)[1](
        torch.tensor(g.astype(np.float64)))[0].numpy()
    got = ops.call(ops.get("max_pool_scatter"), (g, x), params)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-14,
                               atol=1e-6 if dtype == "float32" else 1e-15)
    if dtype == "float32":   # an element's shares summed in float64, rounded once
        wide = ops.call(ops.get("max_pool_scatter"), (g.astype(np.float64), x), params)
        np.testing.assert_array_equal(got, wide.astype(np.float32))
    # the gather picks h at torch's chosen indices
    h = rng.normal(size=shape).astype(dtype)
    picked = np.take_along_axis(h.reshape(shape[:2] + (-1,)),
                                chosen.numpy().reshape(shape[:2] + (-1,)), axis=2)
    gathered = ops.call(ops.get("max_pool_gather"), (h, x), params)
    np.testing.assert_array_equal(gathered, picked.reshape(y.shape))


def test_max_pool_scatter_sums_overlapping_windows_in_float64_order():
    # every window of a 3-wide, stride-1 pool over a constant row chooses its first
    # element; an element chosen by several windows gets the sum of their shares, added
    # in the order a loop over the window's offsets would add them
    x = np.zeros((1, 1, 6))
    x[0, 0, 2] = 1.0                 # windows 0, 1, 2 choose element 2
    g = np.array([[[0.1, 0.2, 0.7, 0.3]]])
    got = ops.call(ops.get("max_pool_scatter"), (g, x),
                   {"kernel": (3,), "stride": (1,)})
    expect = np.zeros((1, 1, 6))
    expect[0, 0, 2] = (0.0 + 0.7) + 0.2 + 0.1     # offsets 0, 1, 2: windows 2, 1, 0
    expect[0, 0, 3] = 0.3                         # window 3: all zero, the first (3)
    np.testing.assert_array_equal(got, expect)


def test_max_pool_scatter_nan_and_all_minus_inf_windows():
    x = np.array([[[1.0, np.nan, 2.0, np.nan, -np.inf, -np.inf]]])
    g = np.array([[[1.0, 2.0, 3.0]]])
    got = ops.call(ops.get("max_pool_scatter"), (g, x), {"kernel": (2,)})
    # torch: a NaN is the maximum (the last NaN of a window); -inf ties: the first
    np.testing.assert_array_equal(got, [[[0.0, 1.0, 0.0, 2.0, 3.0, 0.0]]])


def test_max_pool_gradient_through_the_tape_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 6, 6))
    w = rng.normal(size=(2, 3, 6, 6))

    def f(v):
        return ad.sum(ops.max_pool(v, (3, 3), 1, 1) * w) if isinstance(v, ad.Tensor) \
            else float(np.sum(ops.max_pool(v, (3, 3), 1, 1) * w))

    lst = ad.WengertList()
    xv = ad.Tensor.variable(x, lst)
    grad = f(xv).derivatives()[xv]
    d = rng.normal(size=x.shape)
    step = 1e-6          # the windows' choices are stable: the values are far apart
    fd = (f(x + step * d) - f(x - step * d)) / (2 * step)
    assert np.isclose(np.sum(np.asarray(grad) * d), fd, rtol=1e-7, atol=1e-9)


# ---- the sigmoid's hand-written numpy kernels ----

def _special_values(dtype):
    info = np.finfo(dtype)
    rng = np.random.default_rng(5)
    edges = [0.0, -0.0, np.nan, np.inf, -np.inf, info.tiny, -info.tiny, info.max, -info.max,
             88.0, -88.0, 104.0, -104.0, 710.0, -710.0, 745.0, -745.0, 1e-30, -1e-30]
    return np.concatenate([np.array(edges), rng.normal(scale=8, size=4000),
                           rng.uniform(-800, 800, size=2000)]).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_kernel_is_the_expression_bitwise(dtype):
    from easyad.tensor import _fused, _numpy
    assert _fused._SIGMOID == _numpy.SIGMOID            # the hand-written kernel applies
    x = _special_values(dtype)
    generic = _numpy._compile(_numpy.SIGMOID, _numpy.NAMESPACE, ("x",))
    fast = _numpy.compile_expression(_numpy.SIGMOID, ("x",))
    with np.errstate(all="ignore"):
        want, got = generic(x).astype(dtype), fast(x)
    assert got.dtype == np.dtype(dtype)
    # bitwise (signed zeros included) but NaN's sign bit, which numpy's exp may flip
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))
    # against float64 and torch: within a few ulps of the exact logistic function
    wide = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    # (where the result is a normal number: below, exp(x) is subnormal, with fewer digits)
    normal = np.isfinite(x) & (wide >= np.finfo(dtype).tiny)
    ulp = np.spacing(np.abs(got[normal])).astype(np.float64)
    assert np.all(np.abs(got[normal] - wide[normal]) <= 3 * ulp)     # (measured: 2.5)
    np.testing.assert_allclose(got, torch.sigmoid(torch.tensor(x)).numpy(),
                               rtol=4 * np.finfo(dtype).eps,
                               atol=np.finfo(dtype).tiny)    # (torch: subnormals to 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_vjp_kernel_is_the_expression_bitwise(dtype):
    from easyad.tensor import _numpy
    rng = np.random.default_rng(6)
    s = rng.uniform(0, 1, size=500).astype(dtype)
    g = rng.normal(size=500).astype(dtype)
    generic = _numpy._compile(_numpy.SIGMOID_VJP, _numpy.NAMESPACE, ("g", "s"))
    fast = _numpy.compile_expression(_numpy.SIGMOID_VJP, ("g", "s"))
    np.testing.assert_array_equal(fast(g, s), generic(g, s))
    # operands it was not written for go to the expression: broadcasting, mixed dtypes
    np.testing.assert_array_equal(fast(g[:1], s), generic(g[:1], s))
    np.testing.assert_array_equal(fast(g.astype(np.float64), s),
                                  generic(g.astype(np.float64), s))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_tensor_gradient_matches_torch(dtype):
    x = _special_values(dtype)[19:400].reshape(3, -1)
    lst = ad.WengertList()
    xv = ad.Tensor.variable(x, lst)
    g = np.random.default_rng(7).normal(size=x.shape).astype(dtype)
    y = ad.nn.functional.sigmoid(xv)
    grad = ad.sum(y * g).derivatives()[xv]
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.sigmoid(tx)
    ty.backward(torch.tensor(g))
    tol = 1e-6 if dtype == "float32" else 1e-15
    np.testing.assert_allclose(np.asarray(y.value), ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(grad), tx.grad.numpy(), rtol=10 * tol, atol=tol)


# ---- softmax as one tape entry ----

@pytest.mark.parametrize("axis", [-1, 1, (0, 2)])
def test_softmax_node_value_and_gradient_match_torch(axis):
    rng = np.random.default_rng(8)
    x, g = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    x[0, 0] = 1000.0                                        # exp would overflow unshifted
    lst = ad.WengertList()
    xv = ad.Tensor.variable(x, lst)
    y = ad.softmax(xv, axis=axis)
    # the forward floats are the composition's on constants
    np.testing.assert_array_equal(y.value, ad.softmax(x, axis=axis))
    grad = ad.sum(y * g).derivatives()[xv]
    tx = torch.tensor(x, requires_grad=True)
    dims = axis if isinstance(axis, tuple) else (axis,)
    ty = torch.exp(tx - torch.logsumexp(tx, dim=dims, keepdim=True))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.value, ty.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(np.asarray(grad), tx.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_softmax_node_second_order_and_replay_match_torch():
    rng = np.random.default_rng(9)
    x, g, v = (rng.normal(size=(4, 6)) for _ in range(3))
    lst = ad.WengertList()
    xv = ad.Tensor.variable(x, lst)
    gr = ad.sum(ad.softmax(xv) ** 3 * g).derivatives(create_graph=True)[xv]
    hv = ad.sum(gr * v).derivatives()[xv]
    tx = torch.tensor(x, requires_grad=True)
    tg, = torch.autograd.grad((torch.softmax(tx, -1) ** 3 * torch.tensor(g)).sum(), tx,
                              create_graph=True)
    thv, = torch.autograd.grad((tg * torch.tensor(v)).sum(), tx)
    np.testing.assert_allclose(np.asarray(hv), thv.numpy(), rtol=1e-12, atol=1e-14)
    f = ad.record(lambda t: ad.sum(ad.softmax(t) ** 2 * g), x, tensor=True)
    x2 = rng.normal(size=x.shape)
    t2 = torch.tensor(x2, requires_grad=True)
    (torch.softmax(t2, -1) ** 2 * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(np.asarray(f.gradient(x2)), t2.grad.numpy(), rtol=1e-12,
                               atol=1e-14)


def test_softmax_node_float32_attention_gradient_matches_torch():
    rng = np.random.default_rng(10)
    q, k, v, g = (rng.normal(size=(2, 3, 16, 8)).astype(np.float32) for _ in range(4))
    lst = ad.WengertList()
    Q, K, V = (ad.Tensor.variable(a, lst) for a in (q, k, v))
    out = ad.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True)
    d = ad.sum(out * g).derivatives()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(torch.tensor(g))
    for ours, theirs in ((out.value, None), (d[Q], tq.grad), (d[K], tk.grad), (d[V], tv.grad)):
        if theirs is not None:
            np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1e-5,
                                       atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_vjp_kernel_is_the_rule_bitwise(dtype):
    from easyad.tensor import _numpy
    x = _special_values(dtype)
    g = np.random.default_rng(11).normal(size=x.shape).astype(dtype)
    g[:5] = 0.0                                   # strong zeros against inf and NaN
    generic = _numpy._compile(_numpy.TANH_VJP, _numpy.FLOAT_NAMESPACE, ("x", "g"))
    with np.errstate(all="ignore"):
        want = generic(x, g)
        got = _numpy._compile_for_floats(_numpy.TANH_VJP, ("x", "g"))(x, g)
    np.testing.assert_array_equal(got, want)
    # the kernel's key is the rule table's partial as the core's dispatch asks for it
    from easyad import _rules
    (partial,) = next(r for r in _rules.RULES if r.name == "tanh").partials
    assert _numpy.TANH_VJP == f"mul0(g, {partial})"
    lst = ad.WengertList()
    xv = ad.Tensor.variable(x[19:60].copy(), lst)
    grad = ad.sum(ad.tanh(xv) * g[19:60]).derivatives()[xv]
    tx = torch.tensor(x[19:60], requires_grad=True)
    (torch.tanh(tx) * torch.tensor(g[19:60])).sum().backward()
    np.testing.assert_allclose(np.asarray(grad), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_attention_scaling_the_query_gives_the_scaled_scores_floats(dtype):
    # E = 64: the scale 1/8 is a power of two, applied to the query instead of the scores;
    # the composite's values and every gradient are the scores-scaled composition's bit
    # for bit (the composite: sdpa's path for dropout, here p = 1e-300, which keeps every
    # weight and multiplies by exactly 1); the fused op (the numpy device's path, other
    # sums) agrees to rounding
    rng = np.random.default_rng(12)
    q, k, v, g = (rng.normal(size=(2, 3, 32, 64)).astype(dtype) for _ in range(4))
    mask = np.where(np.tril(np.ones((32, 32), bool)), 0.0, -np.inf).astype(dtype)
    results = []
    for way in ("composed", "composite", "fused"):
        lst = ad.WengertList()
        Q, K, V = (ad.Tensor.variable(a, lst) for a in (q, k, v))
        if way == "composed":
            scores = (Q @ K.transpose((0, 1, 3, 2))) * 0.125 + mask
            out = ad.softmax(scores, axis=-1) @ V
        else:
            out = ad.nn.functional.scaled_dot_product_attention(
                Q, K, V, is_causal=True, dropout_p=1e-300 if way == "composite" else 0.0)
        d = ad.sum(out * g).derivatives()
        results.append([np.asarray(out.value)] + [np.asarray(d[t]) for t in (Q, K, V)])
    tol = 1e-5 if dtype == "float32" else 1e-12
    for composed, composite, fused in zip(*results):
        np.testing.assert_array_equal(composite, composed)
        np.testing.assert_allclose(fused, composed, rtol=0,
                                   atol=tol * max(1.0, float(np.abs(composed).max())))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hand_written_kernels_take_zero_d_arrays(dtype):
    """A 0-d array (a scalar tensor's value: ufuncs give numpy scalars, which ``out=``
    cannot take) goes to the generic expression, with the same floats."""
    from easyad.tensor import _numpy
    x, g = np.array(-0.59, dtype=dtype), np.array(0.25, dtype=dtype)
    cases = [(_numpy.SIGMOID, ("x",), (x,)), (_numpy.TANH_VJP, ("x", "g"), (x, g))]
    for text, names, args in cases:
        generic = _numpy._compile(text, _numpy.NAMESPACE, names)
        fast = _numpy.compile_expression(text, names)
        assert np.array_equal(fast(*args), generic(*args))
    # and through a derivative of scalar tensors, against the closed forms
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.array(-0.59), lst)
    d = (ad.tanh(t) + 1.0 / (1.0 + ad.exp(-t))).derivatives()
    s = 1 / (1 + np.exp(0.59))
    np.testing.assert_allclose(d[t], 1 - np.tanh(-0.59) ** 2 + s * (1 - s), rtol=1e-14)

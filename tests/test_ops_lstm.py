"""The fused LSTM recurrence (``ops._lstm``: ``lstm_scan`` and ``lstm_scan_vjp``) through
every engine against torch written independently (``check_everywhere``: values, gradients,
Hessian-vector products, forward mode, record/replay on numpy and OpenCL), and
``nn.lstm``'s fused path against torch's LSTM and against its per-step composite:
values and every gradient (h_n and c_n cotangents included), create_graph, the recorded
program (one op, not a loop of small instructions), errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import func

import easyad as ad
from easyad import nn, ops
from easyad.errors import ShapeError
from easyad.nn import _recurrent
from easyad.ops import _lstm

from _op_engines import Case, check_everywhere

T, B, H = 2, 1, 2        # small: check_everywhere takes Hessians of every operand
SIZES = {"scan": [T * B * 4 * H, B * H, B * H, 4 * H * H],
         "vjp": [T * B * 6 * H, T * B * 6 * H, B * H, B * H, 4 * H * H]}
SHAPES = {"scan": [(T, B, 4 * H), (B, H), (B, H), (4 * H, H)],
          "vjp": [(T, 6, B, H), (T, 6, B, H), (B, H), (B, H), (4 * H, H)]}


def _split(x, which):
    """The operands, from one vector (the backward's scaled down: its values are
    polynomials of degree ~2T in them, and the checks' tolerances are absolute)."""
    parts, at = [], 0
    for n, s in zip(SIZES[which], SHAPES[which]):
        part = x[at:at + n].reshape(s)
        parts.append(part if which == "scan" else part * 0.5)
        at += n
    return parts


def _torch_scan(xproj, h0, c0, w, reverse):
    """The packed (i, f, g, o, c, h) per step, in torch (the reference)."""
    h, c, rows = h0, c0, [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        a = xproj[t] + h @ w.T
        i, f, g, o = (a[:, k * H:(k + 1) * H] for k in range(4))
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows[t] = torch.stack([i, f, g, o, c, h])
    return torch.stack(rows)


def _torch_scan_vjp(gy, y, h0, c0, w, reverse):
    """The backward recurrence by hand, in torch: the pre-activations' cotangents, then
    a row (dc0, dh0, 0, 0)."""
    order = list(range(T - 1, -1, -1) if reverse else range(T))
    dh, dc, rows = 0.0, 0.0, [None] * T
    for k in reversed(range(T)):
        t = order[k]
        i, f, g, o, c = y[t][:5]
        gi, gf, gg, go, gc, gh = gy[t]
        c_prev = c0 if k == 0 else y[order[k - 1]][4]
        dh = dh + gh
        tc = torch.tanh(c)
        dc = dc + gc + dh * o * (1 - tc ** 2)
        da = torch.cat([(dc * g + gi) * i * (1 - i), (dc * c_prev + gf) * f * (1 - f),
                        (dc * i + gg) * (1 - g ** 2), (dh * tc + go) * o * (1 - o)], -1)
        rows[t] = da
        dc = dc * f
        dh = da @ w
    last = torch.cat([dc, dh, torch.zeros(B, 2 * H, dtype=y.dtype)], -1)
    return torch.cat([torch.stack(rows), last[None]])


def _case(which, reverse):
    op = _lstm.LSTM_SCAN if which == "scan" else _lstm.LSTM_SCAN_VJP
    params = _lstm.ScanParams(reverse)
    ref = _torch_scan if which == "scan" else _torch_scan_vjp

    def ours(x):
        return ops.apply(op, params, tuple(_split(x, which)))

    def numpy(x):
        return op.numpy(params, *_split(x, which))

    def theirs(t):
        return ref(*_split(t, which), reverse)
    return Case(op, ours, numpy, theirs, (sum(SIZES[which]),), {"reverse": reverse},
                batch_axis=None, scalar_engines=False)


# (the reversed backward is checked through nn.lstm's bidirectional layers below)
CASES = {"scan forward": _case("scan", False), "scan reversed": _case("scan", True),
         "vjp forward": _case("vjp", False)}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


# ---- nn.lstm: the fused path ----

def _layer_pair(dtype, **kw):
    torch.manual_seed(0)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    theirs = torch.nn.LSTM(3, 4, dtype=tdtype, **kw)
    ours = nn.LSTM(3, 4, dtype=dtype, **kw)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _normal(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def _ours(ours, x, states, gs, fused):
    """Value and every gradient of sum(out g0) + sum(h_n g1) + sum(c_n g2), eager."""
    _recurrent.FUSED = fused
    try:
        lst = ad.WengertList()
        params = {k: ad.Tensor.variable(v, lst) for k, v in ours.state_dict().items()}
        X = ad.Tensor.variable(x, lst)
        S = [ad.Tensor.variable(s, lst) for s in states]
        out, (h, c) = nn.functional_call(ours, params, X, tuple(S) if S else None)
        loss = ad.sum(out * gs[0]) + ad.sum(h * gs[1]) + ad.sum(c * gs[2])
        d = loss.derivatives()
        grads = {k: d[v] for k, v in params.items()}
        grads["x"] = d[X]
        for k, s in zip(("h0", "c0"), S):
            grads[k] = d[s]
        return float(loss.number), grads
    finally:
        _recurrent.FUSED = True


LAYERS = {"one": ({}, (5, 2, 3), False),
          "two-bidirectional-hx": ({"num_layers": 2, "bidirectional": True}, (4, 3, 3), True),
          "batch-first-hx": ({"batch_first": True}, (2, 5, 3), True),
          "unbatched-reversed": ({"bidirectional": True}, (4, 3), False)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_fused_layers_against_torch_and_the_composite(name, dtype):
    kw, shape, given = LAYERS[name]
    ours, theirs = _layer_pair(dtype, **kw)
    count = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    batch = () if len(shape) == 2 else (shape[0] if kw.get("batch_first") else shape[1],)
    x = _normal(shape, 1, dtype)
    states = [_normal((count, *batch, 4), s, dtype) for s in (2, 3)] if given else []
    tx = torch.tensor(x, requires_grad=True)
    ts = [torch.tensor(s, requires_grad=True) for s in states]
    out, (h, c) = theirs(tx, tuple(ts) if ts else None)
    gs = [_normal(tuple(a.shape), 4 + k, dtype) for k, a in enumerate((out, h, c))]
    tloss = sum((a * torch.tensor(g)).sum() for a, g in zip((out, h, c), gs))
    tloss.backward()
    want = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    want["x"] = tx.grad.numpy()
    for k, s in zip(("h0", "c0"), ts):
        want[k] = s.grad.numpy()
    tol = 1e-10 if dtype == np.float64 else 1e-5
    value, grads = _ours(ours, x, states, gs, fused=True)
    assert abs(value - float(tloss.detach())) <= tol * max(1.0, abs(float(tloss.detach())))
    assert set(grads) == set(want)
    for k in want:
        scale = max(1.0, float(np.abs(want[k]).max()))
        np.testing.assert_allclose(grads[k], want[k], rtol=0, atol=tol * scale, err_msg=k)
    value0, grads0 = _ours(ours, x, states, gs, fused=False)
    assert abs(value - value0) <= tol * max(1.0, abs(value0))
    for k in grads0:
        np.testing.assert_allclose(grads[k], grads0[k], rtol=0, atol=tol, err_msg=k)


def test_create_graph_hvp_against_torch_func():
    """Second order through the fused node (its create_graph vjp is the per-step form)."""
    ours, theirs = _layer_pair(np.float64, bidirectional=True)
    x, v = _normal((4, 2, 3), 1), _normal((4, 2, 3), 2)
    params = {k: p.detach().numpy() for k, p in theirs.named_parameters()}
    vp = {k: _normal(p.shape, 10 + n) for n, (k, p) in enumerate(params.items())}
    g = _normal((4, 2, 8), 3)

    def loss(p, x):
        return ad.sum(ad.tanh(nn.functional_call(ours, p, x)[0]) * g)

    def tloss(p, x):
        out = func.functional_call(theirs, p, (x,))[0]
        return (torch.tanh(out) * torch.tensor(g)).sum()
    tp = {k: torch.tensor(a) for k, a in params.items()}
    tvp = {k: torch.tensor(a) for k, a in vp.items()}
    theirs_x = func.jvp(lambda x: func.grad(tloss, argnums=1)(tp, x), (torch.tensor(x),),
                        (torch.tensor(v),))[1].numpy()
    np.testing.assert_allclose(ad.hvp(lambda x: loss(params, x), x, v), theirs_x,
                               rtol=1e-9, atol=1e-10)
    theirs_p = func.jvp(lambda p: func.grad(tloss)(p, torch.tensor(x)), (tp,), (tvp,))[1]
    ours_p = ad.hvp(lambda p: loss(p, x), params, vp)
    for k in params:
        np.testing.assert_allclose(ours_p[k], theirs_p[k].numpy(), rtol=1e-9, atol=1e-10,
                                   err_msg=k)
    # create_graph by hand: d/dx <grad_x L, v>
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst)
    d = loss(params, X).derivatives(create_graph=True)
    second = ad.sum(d[X] * v).derivatives()[X]
    np.testing.assert_allclose(second, theirs_x, rtol=1e-9, atol=1e-10)


def test_recorded_program_holds_the_op_and_replays():
    ours, theirs = _layer_pair(np.float32, bidirectional=True)
    params = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    g = _normal((6, 3, 8), 3, np.float32)

    def loss(z):
        return ad.sum(nn.functional_call(ours, z["p"], z["x"])[0] * g)
    z0 = {"p": params, "x": _normal((6, 3, 3), 1, np.float32)}
    recorded = ad.record(loss, z0)
    z1 = {"p": {k: v + np.float32(0.01) for k, v in params.items()},
          "x": _normal((6, 3, 3), 2, np.float32)}
    value, grads = recorded.value_and_gradient(z1)
    ours.load_state_dict(z1["p"])
    want_value, want = _ours(ours, z1["x"], [], [g, np.zeros((2, 3, 4), np.float32),
                                                 np.zeros((2, 3, 4), np.float32)], True)
    assert abs(value - want_value) <= 1e-5 * max(1.0, abs(want_value))
    np.testing.assert_allclose(grads["x"], want["x"], rtol=0, atol=1e-5)
    for k in params:
        np.testing.assert_allclose(grads["p"][k], want[k], rtol=0, atol=1e-5, err_msg=k)
    program = recorded._recordings["first"].program
    names = [getattr(i.params, "op", None) for i in program.instructions]
    names = [op.name for op in names if isinstance(op, ops.Op)]
    assert names.count("lstm_scan") == 2 and names.count("lstm_scan_vjp") == 2
    assert len(program.instructions) < 120       # the 6 steps are not unrolled


def test_the_fused_path_is_taken_only_where_it_serves():
    x = ad.Tensor.constant(np.ones((3, 2, 3)))
    w = [(np.zeros((8, 3)), np.zeros((8, 2)))]
    calls = []
    original = _lstm.LSTM_SCAN.numpy
    object.__setattr__(_lstm.LSTM_SCAN, "numpy", lambda *a: calls.append(1) or original(*a))
    try:
        ad.nn.lstm(x, w)
        assert calls == [1]
        tt = ad.TraceTensor.variable(np.ones((3, 2, 3)), np.ones((3, 2, 3)))
        out, _ = ad.nn.lstm(tt, w)      # forward mode: the per-step composite
        assert calls == [1] and out.shape == (3, 2, 2)
    finally:
        object.__setattr__(_lstm.LSTM_SCAN, "numpy", original)


def test_bad_operands_raise():
    z = np.zeros
    with pytest.raises(ShapeError, match=r"must be \(T, B, 4H\) and \(4H, H\)"):
        _lstm.lstm_scan(z((3, 2, 8)), z((2, 2)), z((2, 2)), z((8, 3)))
    with pytest.raises(ShapeError, match=r"h0 \(2, 3\) and c0 \(2, 2\) must be \(B, H\)"):
        _lstm.lstm_scan(z((3, 2, 8)), z((2, 3)), z((2, 2)), z((8, 2)))
    with pytest.raises(ShapeError, match="sequence is empty"):
        _lstm.lstm_scan(z((0, 2, 8)), z((2, 2)), z((2, 2)), z((8, 2)))
    with pytest.raises(TypeError, match="xproj must be a Tensor or numpy array"):
        _lstm.lstm_scan([[0.0]], z((2, 2)), z((2, 2)), z((8, 2)))


def test_operands_of_mixed_dtypes_agree_with_the_composite():
    """A float32 input and c_0 with float64 weights: the node's step casts (its tensor
    form), as the per-step composite does."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3, 2)).astype(np.float32)
    w = tuple(rng.normal(size=s) * 0.5 for s in [(12, 2), (12, 3), (12,), (12,)])
    h0, c0 = rng.normal(size=(1, 3, 3)), rng.normal(size=(1, 3, 3)).astype(np.float32)
    g = rng.normal(size=(4, 3, 3))

    def run(fused):
        _recurrent.FUSED = fused
        try:
            lst = ad.WengertList()
            vs = [ad.Tensor.variable(a, lst) for a in (x, *w, h0, c0)]
            out, (h, c) = nn.lstm(vs[0], [tuple(vs[1:5])], (vs[5], vs[6]))
            d = (ad.sum(out * g) + ad.sum(c * h)).derivatives()
            return [d[v] for v in vs]
        finally:
            _recurrent.FUSED = True
    for a, b in zip(run(True), run(False)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def _torch_packed(xproj, h0, c0, w):
    """The packed (i, f, g, o, c, h) of any size, forward in time (torch: the reference)."""
    hd, h, c, rows = w.shape[1], h0, c0, []
    for t in range(xproj.shape[0]):
        a = xproj[t] + h @ w.T
        i, f, g, o = (a[:, k * hd:(k + 1) * hd] for k in range(4))
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows.append(torch.stack([i, f, g, o, c, h]))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("own", [True, False], ids=["easyad-gemm", "numpy-matmul"])
def test_numpy_lowerings_on_either_product_against_torch(own, dtype, monkeypatch):
    """Both ways the lowerings multiply per step (one (B, 4H) product on easyad's
    kernels, or numpy's per-gate matmul) give torch's packed result and its vjp."""
    if own and not ad._core.GEMM_SUPPORTED:
        pytest.skip("this CPU has no AVX-512 GEMM kernels")
    monkeypatch.setattr(_lstm, "_own_gemm", lambda *shape: own)
    rng = np.random.default_rng(7)
    t, b, hd = 5, 3, 16
    xproj, h0, c0 = (rng.normal(size=s).astype(dtype) for s in
                     [(t, b, 4 * hd), (b, hd), (b, hd)])
    w = (rng.normal(size=(4 * hd, hd)) * 0.3).astype(dtype)
    p = _lstm.ScanParams(False, True)
    y = _lstm._scan_numpy(p, xproj, h0, c0, w)
    tx = [torch.tensor(a, dtype=torch.float64) for a in (xproj, h0, c0, w)]
    want, pullback = func.vjp(_torch_packed, *tx)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(y, want.numpy(), rtol=0, atol=tol)
    gy = rng.normal(size=y.shape).astype(dtype)
    d = _lstm._vjp_numpy(p, gy, y, h0, c0, w)
    dx, dh0, dc0, _ = pullback(torch.tensor(gy, dtype=torch.float64))
    scale = max(1.0, float(dx.abs().max()))
    np.testing.assert_allclose(d[:t], dx.numpy(), rtol=0, atol=tol * scale)
    np.testing.assert_allclose(d[t, :, :hd], dc0.numpy(), rtol=0, atol=tol * scale)
    np.testing.assert_allclose(d[t, :, hd:2 * hd], dh0.numpy(), rtol=0, atol=tol * scale)
    assert not d[t, :, 2 * hd:].any()

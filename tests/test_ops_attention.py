"""The attention op of the table (``ops/_attention.py``, kernels ``ops/_attention_cpu.py``)
that ``nn.functional.scaled_dot_product_attention`` calls on the numpy device: values and
q/k/v(/bias) gradients against torch (float64 to 1e-10, float32 to 1e-5), the kernels'
causal bands and head blocks, rows that attend to nothing (nan, as the composite),
create_graph's Hessian-vector product and forward mode against torch.func, record and
replay, and every engine through ``check_everywhere`` (OpenCL included)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch.func import grad as tgrad
from torch.func import jvp as tjvp

import easyad as ad
from easyad import nn, ops
from easyad.ops import _attention, _attention_cpu

from _op_engines import Case, check_everywhere

F = nn.functional


def _math(q, k, v, mask=None, causal=False):
    """torch's attention written out (torch.func runs forward mode through it; torch's
    fused CPU kernel has no forward-mode rule)."""
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -np.inf)
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v


def _op(causal, scale):
    def ours(q, k, v):
        return ops.apply(_attention.ATTENTION, _attention.AttentionParams(causal, scale),
                         (q, k, v))
    return ours


def _cut(shapes):
    ends = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    return lambda x: [x[ends[i]:ends[i + 1]].reshape(s) for i, s in enumerate(shapes)], \
        int(ends[-1])


def _case(shapes, causal):
    cut, n = _cut(shapes)
    ours = _op(causal, 1.0 / np.sqrt(shapes[0][-1]))
    return Case(_attention.ATTENTION, lambda x: ours(*cut(x)), lambda x: ours(*cut(x)),
                lambda t: _math(*cut(t), causal=causal), (n,), {}, batch_axis=None,
                scalar_engines=False)


CASES = {"attention causal, L != S": _case([(2, 4, 3), (2, 3, 3), (2, 3, 2)], True)}


@pytest.mark.parametrize("name", list(CASES))
def test_every_engine(name):
    check_everywhere(CASES[name])


def _run(shapes, dtype, causal=False, mask=None, bias_grad=False, seed=0):
    """easyad's sdpa (eager, a fresh tape) and torch's: values and gradients."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=s).astype(dtype) for s in shapes)
    g = rng.normal(size=shapes[0][:-1] + shapes[2][-1:]).astype(dtype)
    lst = ad.WengertList()
    Q, K, V = (ad.Tensor.variable(a, lst) for a in (q, k, v))
    M = ad.Tensor.variable(mask, lst) if bias_grad else mask
    y = F.scaled_dot_product_attention(Q, K, V, attn_mask=M, is_causal=causal)
    d = ad.sum(y * g).derivatives()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tm = None if mask is None else torch.tensor(mask, requires_grad=bias_grad)
    ty = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=causal)
    (ty * torch.tensor(g)).sum().backward()
    ours = [y.value, d[Q], d[K], d[V]] + ([d[M]] if bias_grad else [])
    theirs = [ty.detach(), tq.grad, tk.grad, tv.grad] + ([tm.grad] if bias_grad else [])
    return ours, [t.numpy() for t in theirs]


def _close(ours, theirs, tol):
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.max(np.abs(b))))


SHAPES = {
    "causal square, several bands": ([(2, 3, 70, 5), (2, 3, 70, 5), (2, 3, 70, 4)], True),
    "causal L > S": ([(2, 50, 6), (2, 33, 6), (2, 33, 3)], True),
    "causal L < S": ([(2, 33, 6), (2, 50, 6), (2, 50, 3)], True),
    "full, 2-d": ([(9, 4), (7, 4), (7, 5)], False),
    "full, batch rank 3": ([(2, 1, 3, 6, 4), (2, 1, 3, 5, 4), (2, 1, 3, 5, 2)], False),
}


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
@pytest.mark.parametrize("name", list(SHAPES))
def test_against_torch(name, dtype, tol, monkeypatch):
    calls = []
    forward = _attention_cpu.forward
    monkeypatch.setattr(_attention_cpu, "forward", lambda *a: calls.append(1) or forward(*a))
    shapes, causal = SHAPES[name]
    _close(*_run(shapes, dtype, causal), tol)
    assert calls == [1]          # the op ran (the kernels once: the sweep kept p and l)


def test_many_heads_take_several_blocks(monkeypatch):
    monkeypatch.setattr(_attention_cpu, "BLOCK_BYTES", 4096)   # 4 heads of 16x16 a block
    _close(*_run([(3, 5, 16, 4), (3, 5, 16, 4), (3, 5, 16, 3)], np.float64, True), 1e-10)


@pytest.mark.parametrize("kind", ["bool", "float", "float, differentiated"])
def test_masks(kind):
    rng = np.random.default_rng(1)
    mask = rng.random((3, 6, 5)) < 0.6 if kind == "bool" else rng.normal(size=(3, 6, 5))
    if kind == "bool":
        mask[:, :, 0] = True
    shapes = [(2, 3, 6, 4), (2, 3, 5, 4), (2, 3, 5, 2)]
    _close(*_run(shapes, np.float64, mask=mask, bias_grad="differentiated" in kind), 1e-10)


def test_scores_beyond_the_unshifted_range_take_the_row_maximum():
    # |q| |k| scale far past exp's range: the kernel shifts by the rows' maxima
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 9, 4)) * 40 for _ in range(3))
    tq, tk, tv = (torch.tensor(a) for a in (q, k, v))
    for dtype in (np.float32, np.float64):
        got = F.scaled_dot_product_attention(*(ad.Tensor.constant(a.astype(dtype))
                                               for a in (q, k, v)), is_causal=True)
        want = TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy()
        assert np.isfinite(got.value).all()
        np.testing.assert_allclose(got.value, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_rows_that_attend_to_nothing_are_nan_as_the_composite():
    rng = np.random.default_rng(3)
    q, k, v, g = (rng.normal(size=(2, 4, 3)) for _ in range(4))
    mask = np.ones((4, 4), dtype=bool)
    mask[1] = False

    def grads(fused):
        lst = ad.WengertList()
        Q, K, V = (ad.Tensor.variable(a, lst) for a in (q, k, v))
        if fused:
            y = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
        else:       # the composite: dropout's path (p tiny, nothing dropped at this seed)
            y = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, dropout_p=1e-300)
        d = ad.sum(y * g).derivatives()
        return [y.value, d[Q], d[K], d[V]]
    for a, b in zip(grads(True), grads(False)):
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-12, atol=1e-13)
    assert np.isnan(grads(True)[0][:, 1]).all() and not np.isnan(grads(True)[0][:, 0]).any()


def test_create_graph_hvp_and_forward_mode_against_torch_func():
    rng = np.random.default_rng(4)
    q, k, v, g, u = (rng.normal(size=(2, 5, 3)) for _ in range(5))
    tk, tv, tg = (torch.tensor(a) for a in (k, v, g))

    def theirs(tq):
        return (_math(tq, tk, tv, causal=True) * tg).sum()
    hv = tjvp(tgrad(theirs), (torch.tensor(q),), (torch.tensor(u),))[1].numpy()
    lst = ad.WengertList()
    Q = ad.Tensor.variable(q, lst)
    loss = ad.sum(F.scaled_dot_product_attention(Q, k, v, is_causal=True) * g)
    d = loss.derivatives(create_graph=True)
    np.testing.assert_allclose(ad.sum(d[Q] * u).derivatives()[Q], hv, rtol=1e-10, atol=1e-12)
    # forward mode: the op's jvp (TraceTensors go to the composite in nn; call the op)
    tangent = tjvp(lambda a: _math(a, tk, tv, causal=True), (torch.tensor(q),),
                   (torch.tensor(u),))[1].numpy()
    got = _op(True, 1 / np.sqrt(3))(ad.TraceTensor.variable(q, u), k, v)
    np.testing.assert_allclose(got.tangent, tangent, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_record_and_replay(dtype, tol):
    rng = np.random.default_rng(5)
    shapes = [(2, 3, 40, 4), (2, 3, 40, 4), (2, 3, 40, 2)]
    z0 = {n: rng.normal(size=s).astype(dtype) for n, s in zip("qkv", shapes)}
    z1 = {n: rng.normal(size=s).astype(dtype) for n, s in zip("qkv", shapes)}
    g = rng.normal(size=(2, 3, 40, 2)).astype(dtype)

    def loss(z):
        return ad.sum(F.scaled_dot_product_attention(z["q"], z["k"], z["v"], is_causal=True)
                      * g)
    T = ad.record(loss, z0)
    value, grads = T.value_and_gradient(z1)
    tz = {n: torch.tensor(a, requires_grad=True) for n, a in z1.items()}
    want = (TF.scaled_dot_product_attention(tz["q"], tz["k"], tz["v"], is_causal=True)
            * torch.tensor(g)).sum()
    want.backward()
    want = float(want.detach())
    assert abs(float(value) - want) <= tol * max(1.0, abs(want))
    _close([grads[n] for n in "qkv"], [tz[n].grad.numpy() for n in "qkv"], tol)


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(ad.ShapeError, match="same leading axes"):
        _op(False, 1.0)(ad.Tensor.constant(np.ones((2, 3, 4))), np.ones((1, 3, 4)),
                        np.ones((1, 3, 4)))
    with pytest.raises(ad.ShapeError, match="does not broadcast"):
        ops.apply(_attention.ATTENTION, _attention.AttentionParams(),
                  (np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2)), np.ones((2, 5))))


def test_a_mask_with_more_leading_axes_broadcasts_the_result():
    # (the composite's case: the op takes masks that broadcast to the scores only; torch's
    # sdpa refuses this, its formula broadcasts)
    rng = np.random.default_rng(6)
    q, k, v = (rng.normal(size=(5, 3)) for _ in range(3))
    mask = rng.normal(size=(2, 5, 5))
    got = F.scaled_dot_product_attention(ad.Tensor.constant(q), k, v, attn_mask=mask)
    want = _math(*(torch.tensor(a) for a in (q, k, v)), mask=torch.tensor(mask))
    assert got.shape == (2, 5, 3)
    np.testing.assert_allclose(got.value, want.numpy(), rtol=1e-12, atol=1e-12)


def test_a_recording_with_the_fused_kernels_pickles_and_replays_the_same():
    # the fused forward and sweep are registered host kernels of the op table (data, not
    # closures): the recording pickles by their names and the copy gives the same values
    # and gradients at a new point, both equal to torch's
    import pickle
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 8, 4))

    def f(q: Any) -> Any:
        return ad.sum(nn.functional.scaled_dot_product_attention(q, q * 0.5, q,
                                                                  is_causal=True) ** 2)
    F = ad.record(f, q, tensor=True)
    G = pickle.loads(pickle.dumps(F))
    q2 = rng.standard_normal((2, 8, 4))
    tq = torch.tensor(q2, requires_grad=True)
    want = (TF.scaled_dot_product_attention(tq, tq * 0.5, tq, is_causal=True) ** 2).sum()
    want.backward()
    for H in (F, G):
        assert float(H(q2)) == pytest.approx(float(want), rel=1e-12)
        np.testing.assert_allclose(H.gradient(q2), tq.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.array_equal(F.gradient(q2), G.gradient(q2))


def test_a_pickled_recording_calling_an_unregistered_kernel_is_refused():
    # a forged pickle naming a host kernel that is not registered fails on arrival
    import pickle
    from easyad.ops import _table
    q = np.random.default_rng(4).standard_normal((2, 8, 4))
    F = ad.record(lambda q: ad.sum(nn.functional.scaled_dot_product_attention(q, q, q)), q,
                  tensor=True)
    data = pickle.dumps(F)
    kernel = _table.KERNELS.pop("attention")
    try:
        with pytest.raises(KeyError, match="no host kernel 'attention'"):
            pickle.loads(data)
    finally:
        _table.KERNELS["attention"] = kernel


@pytest.mark.parametrize("masked", [False, True])
def test_a_batch_of_a_recording_calls_the_kernels_once_for_all_points(masked):
    # the fused forward and sweep take a batch's points as one more leading axis: one call
    # each for the whole batch, every point's value and gradient those of one replay
    # (bit for bit) and of torch (a mask shared by every point, broadcast to them)
    from easyad.ops import _table
    rng = np.random.default_rng(8)
    mask = rng.normal(size=(8, 8)) if masked else None

    def f(q: Any) -> Any:
        y = nn.functional.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=mask,
                                                       is_causal=not masked)
        return ad.sum(y ** 2)
    F = ad.record(f, rng.standard_normal((2, 8, 4)), tensor=True)
    X = rng.standard_normal((5, 2, 8, 4))
    calls = []
    kernels = {name: _table.KERNELS[name] for name in ("attention", "attention_vjp")}

    def counted(name):
        def fn(*args):
            calls.append(name)
            return kernels[name].fn(*args)
        return fn
    try:
        for name, k in kernels.items():
            _table.KERNELS[name] = k._replace(fn=counted(name))
        values, gradients = F(X), F.gradient(X)
    finally:
        _table.KERNELS.update(kernels)
    assert calls == ["attention", "attention", "attention_vjp"]   # F(X); F.gradient(X)
    for x, value, gradient in zip(X, values, gradients):
        assert value == F(x)
        assert np.array_equal(gradient, F.gradient(x))
        tq = torch.tensor(x, requires_grad=True)
        tm = None if mask is None else torch.tensor(mask)
        want = (TF.scaled_dot_product_attention(tq, tq * 0.5, tq, attn_mask=tm,
                                                is_causal=not masked) ** 2).sum()
        want.backward()
        assert value == pytest.approx(want.item(), rel=1e-12)
        np.testing.assert_allclose(gradient, tq.grad.numpy(), rtol=1e-10, atol=1e-12)

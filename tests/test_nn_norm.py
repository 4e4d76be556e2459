"""Normalisation, embedding and attention in ``nn`` (layer_norm, group_norm, batch_norm,
embedding, scaled_dot_product_attention and their layers, MultiheadAttention) against
torch 2.13.0's with the same weights: forward and backward in float64 (1e-10) and float32
(1e-5), train and eval, running statistics, repeated indices, masks; grad, forward mode,
hessian, record/replay and vmap against torch.func; a block on OpenCL; errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import func

import easyad as ad
from easyad import nn
from easyad.errors import ShapeError

from conftest import OPENCL

F = nn.functional
TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
DTYPES = [np.float64, np.float32]


def _close(ours, theirs, dtype, what=""):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=tol, atol=tol, err_msg=what)


def _against_torch(ours, theirs, arrays, dtype, seed=0):
    """ours(*Tensors) and theirs(*torch tensors): values, and the vjp of a random
    cotangent in every operand."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, dtype=dtype) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ty = theirs(*ts)
    g = rng.normal(size=tuple(ty.shape)).astype(dtype)
    ty.backward(torch.tensor(g))
    lst = ad.WengertList()
    xs = [ad.Tensor.variable(a, lst) for a in arrays]
    y = ours(*xs)
    assert y.dtype == dtype
    _close(y.value, ty, dtype, "value")
    d = ad.sum(y * g).derivatives()
    for k, (x, t) in enumerate(zip(xs, ts)):
        _close(d[x], t.grad, dtype, f"derivative in operand {k}")


def _normal(*shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape)


# ---- the functions, against torch ----

@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_layer_norm_and_group_norm(dtype):
    x = _normal(3, 4, 2, 5)
    _against_torch(lambda x, w, b: F.layer_norm(x, (2, 5), w, b, eps=1e-3),
                   lambda x, w, b: TF.layer_norm(x, (2, 5), w, b, eps=1e-3),
                   [x, _normal(2, 5, seed=2), _normal(2, 5, seed=3)], dtype)
    _against_torch(lambda x: F.layer_norm(x, 5), lambda x: TF.layer_norm(x, (5,)), [x],
                   dtype)
    _against_torch(lambda x, w, b: F.group_norm(x, 2, w, b),
                   lambda x, w, b: TF.group_norm(x, 2, w, b),
                   [x, _normal(4, seed=2), _normal(4, seed=3)], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_function(dtype, training):
    x = _normal(5, 3, 4)
    rm, rv = _normal(3, seed=4), 1.0 + np.abs(_normal(3, seed=5))
    ours_rm, ours_rv = rm.copy(), rv.copy()
    t_rm, t_rv = torch.tensor(rm.astype(dtype)), torch.tensor(rv.astype(dtype))
    _against_torch(lambda x, w, b: F.batch_norm(x, ours_rm, ours_rv, w, b, training, 0.3),
                   lambda x, w, b: TF.batch_norm(x, t_rm, t_rv, w, b, training, 0.3),
                   [x, _normal(3, seed=2), _normal(3, seed=3)], dtype)
    if training:      # torch's update: momentum 0.3, unbiased batch variance (n = 20)
        mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2), ddof=1)
        np.testing.assert_allclose(ours_rm, 0.7 * rm + 0.3 * mean, rtol=TOLERANCE[dtype])
        np.testing.assert_allclose(ours_rv, 0.7 * rv + 0.3 * var, rtol=TOLERANCE[dtype])
        np.testing.assert_allclose(ours_rv, t_rv.numpy(), rtol=TOLERANCE[dtype])
    else:
        assert (ours_rm == rm).all() and (ours_rv == rv).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_embedding_repeated_indices_and_padding(dtype):
    idx = np.array([[0, 3, 3], [1, 3, 0]])
    _against_torch(lambda w: F.embedding(idx, w), lambda w: TF.embedding(torch.tensor(idx), w),
                   [_normal(5, 4)], dtype)
    _against_torch(lambda w: F.embedding(idx, w, padding_idx=3),
                   lambda w: TF.embedding(torch.tensor(idx), w, padding_idx=3),
                   [_normal(5, 4)], dtype)
    # by hand: row 3 is used three times, so its derivative is the sum of three cotangents
    lst = ad.WengertList()
    W = ad.Tensor.variable(_normal(5, 4), lst)
    g = _normal(2, 3, 4, seed=7)
    d = ad.sum(F.embedding(idx, W) * g).derivatives()[W]
    np.testing.assert_allclose(d[3], g[0, 1] + g[0, 2] + g[1, 1], rtol=1e-14)
    np.testing.assert_array_equal(d[[2, 4]], 0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_scaled_dot_product_attention(dtype, mask):
    q, k, v = _normal(2, 3, 5, 4, seed=1), _normal(2, 3, 6, 4, seed=2), _normal(2, 3, 6, 3,
                                                                                seed=3)
    kw = {}
    if mask == "causal":
        kw = {"is_causal": True}
    elif mask == "bool":
        m = np.random.default_rng(4).random((5, 6)) > 0.4
        m[:, 0] = True          # every row attends to something
        kw = {"attn_mask": m}
    elif mask == "float":
        kw = {"attn_mask": _normal(3, 5, 6, seed=5), "scale": 0.7}

    def theirs_kw(t):
        out = dict(kw)
        if "attn_mask" in out:
            out["attn_mask"] = torch.tensor(out["attn_mask"])
            if out["attn_mask"].is_floating_point():
                out["attn_mask"] = out["attn_mask"].to(t.dtype)
        return out
    _against_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
                   lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **theirs_kw(q)),
                   [q, k, v], dtype)


def test_causal_mask_hides_the_future():
    # by hand: with is_causal the first position sees only itself, so its output is v[0]
    q, k, v = _normal(4, 3, seed=1), _normal(4, 3, seed=2), _normal(4, 2, seed=3)
    out = F.scaled_dot_product_attention(ad.Tensor.constant(q), ad.Tensor.constant(k),
                                         ad.Tensor.constant(v), is_causal=True)
    np.testing.assert_allclose(out.value[0], v[0], rtol=1e-14)
    changed = v.copy()
    changed[3] += 10.0      # the last value moves no earlier output
    out2 = F.scaled_dot_product_attention(ad.Tensor.constant(q), ad.Tensor.constant(k),
                                          ad.Tensor.constant(changed), is_causal=True)
    np.testing.assert_allclose(out2.value[:3], out.value[:3], rtol=1e-14)


# ---- the layers, with torch's state_dict ----

def _load(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_layers_train_then_eval(momentum):
    rng = np.random.default_rng(0)
    for ours, theirs, shape in ((nn.BatchNorm1d(3, momentum=momentum),
                                 torch.nn.BatchNorm1d(3, momentum=momentum), (6, 3)),
                                (nn.BatchNorm2d(3, momentum=momentum),
                                 torch.nn.BatchNorm2d(3, momentum=momentum), (4, 3, 2, 3))):
        theirs.double()
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(rng.normal(size=3)))
            theirs.bias.copy_(torch.tensor(rng.normal(size=3)))
        _load(ours, theirs)
        for step in range(3):
            x = rng.normal(size=shape) * (step + 1) + step
            lst = ad.WengertList()
            X = ad.Tensor.variable(x, lst)
            y = ours(X)
            tx = torch.tensor(x, requires_grad=True)
            ty = theirs(tx)
            _close(y.value, ty, np.float64, "train value")
            g = rng.normal(size=shape)
            d = ad.sum(y * g).derivatives()
            ty.backward(torch.tensor(g))
            _close(d[X], tx.grad, np.float64, "train input derivative")
            _close(ours.weight.gradient(d), theirs.weight.grad, np.float64, "weight")
            theirs.weight.grad = theirs.bias.grad = None
        for name, buf in theirs.state_dict().items():
            _close(ours.state_dict()[name], buf, np.float64, name)
        assert int(ours.num_batches_tracked) == 3
        ours.eval()
        theirs.eval()
        x = rng.normal(size=shape)
        _close(ours(x).value, theirs(torch.tensor(x)), np.float64, "eval value")
        _against_torch(lambda x: ours(x), lambda x: theirs(x), [x], np.float64)


def test_norm_layers_and_embedding_load_torch_state():
    torch.manual_seed(0)
    x = _normal(2, 4, 3, 3)
    pairs = [(nn.LayerNorm((3, 3)), torch.nn.LayerNorm((3, 3))),
             (nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4))]
    for ours, theirs in pairs:
        theirs.double()
        with torch.no_grad():
            for p in theirs.parameters():
                p.normal_()
        _load(ours, theirs)
        _against_torch(lambda x: ours(x), lambda x: theirs(x), [x], np.float64)
    emb, temb = nn.Embedding(6, 3, padding_idx=2), torch.nn.Embedding(6, 3, padding_idx=2)
    np.testing.assert_array_equal(emb.weight.data[2], 0.0)
    _load(emb, temb.double())
    idx = np.array([2, 5, 5, 0])
    lst = ad.WengertList()
    d = ad.sum(emb(idx, tape=lst) ** 2).derivatives()
    (temb(torch.tensor(idx)) ** 2).sum().backward()
    _close(emb.weight.gradient(d), temb.weight.grad, np.float64, "embedding weight")


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_against_torch(batch_first):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first, dtype=torch.float64)
    ours = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    _load(ours, theirs)
    n, length, source = 3, 4, 5
    q = _normal(*((n, length, 8) if batch_first else (length, n, 8)), seed=1)
    kv = _normal(*((n, source, 8) if batch_first else (source, n, 8)), seed=2)
    pad = np.zeros((n, source), dtype=bool)
    pad[1, 3:] = True
    causal = ~np.tril(np.ones((length, source), dtype=bool))
    for kw in ({}, {"key_padding_mask": pad}, {"attn_mask": causal},
               {"attn_mask": _normal(length, source, seed=3), "average_attn_weights": False}):
        tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        for index in (0, 1):      # the output, then the attention weights
            _against_torch(lambda a, b: ours(a, b, b, **kw)[index],
                           lambda a, b: theirs(a, b, b, **tkw)[index], [q, kv], np.float64)
    theirs.zero_grad()      # the comparisons above accumulated into torch's gradients
    lst = ad.WengertList()
    d = ad.sum(ours(ad.Tensor.variable(q, lst), kv, kv)[0] ** 2).derivatives()
    tq = torch.tensor(q)
    (theirs(tq, torch.tensor(kv), torch.tensor(kv))[0] ** 2).sum().backward()
    _close(ours.in_proj_weight.gradient(d), theirs.in_proj_weight.grad, np.float64)
    _close(ours.out_proj.weight.gradient(d), theirs.out_proj.weight.grad, np.float64)
    # one input, as a Sequential calls it: self-attention, the output only
    _close(nn.Sequential(ours)(q).value, theirs(*(torch.tensor(q),) * 3)[0], np.float64)


def test_multihead_attention_unbatched_and_causal_float32():
    torch.manual_seed(1)
    theirs = torch.nn.MultiheadAttention(6, 3, dtype=torch.float32)
    ours = nn.MultiheadAttention(6, 3, dtype=np.float32)
    _load(ours, theirs)
    x = _normal(5, 6).astype(np.float32)
    _against_torch(lambda x: ours(x, x, x, is_causal=True, need_weights=False)[0],
                   lambda x: theirs(x, x, x, attn_mask=torch.nn.Transformer.
                                    generate_square_subsequent_mask(5, dtype=torch.float32),
                                    need_weights=False)[0], [x], np.float32)


# ---- transforms: grad, hessian, record/replay, vmap against torch.func ----

def test_every_transform_against_torch_func():
    x = _normal(3, 4, seed=1)
    w, b = _normal(4, seed=2), _normal(4, seed=3)

    def ours(x):
        h = F.layer_norm(x, 4, w, b)
        h = F.batch_norm(h, None, None, training=True)
        return ad.sum(F.scaled_dot_product_attention(h, h, h, is_causal=True) ** 2)

    def theirs(x):
        h = TF.layer_norm(x, (4,), torch.tensor(w), torch.tensor(b))
        h = TF.batch_norm(h, None, None, training=True)
        return (TF.scaled_dot_product_attention(h, h, h, is_causal=True) ** 2).sum()
    tx = torch.tensor(x)
    _close(ad.grad(ours)(x), func.grad(theirs)(tx), np.float64, "grad")
    _close(ad.hessian(ours)(x), func.hessian(theirs)(tx), np.float64, "hessian")
    replay = ad.record(ours, x)
    x2 = _normal(3, 4, seed=9)
    _close(replay.gradient(x2), func.grad(theirs)(torch.tensor(x2)), np.float64, "replay")
    _close(ad.jacobian(ours, mode="forward")(x), func.grad(theirs)(tx), np.float64,
           "forward mode")
    xs = np.stack([x, x2])
    _close(ad.vmap(ad.grad(ours))(xs), func.vmap(func.grad(theirs))(torch.tensor(xs)),
           np.float64, "vmap")


@pytest.mark.parametrize("device", OPENCL or [pytest.param("opencl", marks=pytest.mark.skip(
    reason="no working OpenCL device"))])
def test_a_block_on_opencl(device):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    _load(mha, theirs)
    norms = nn.Sequential(nn.LayerNorm(8), nn.BatchNorm1d(4))
    mha.to(device=device)
    norms.to(device=device)
    x = _normal(2, 4, 8)
    pad = np.array([[0, 0, 1, 1], [0, 0, 0, 0]], dtype=bool)
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst, device=device)
    h = norms(X)
    out = mha(h, h, h, key_padding_mask=pad)[0]
    assert str(out.device) == device
    d = ad.sum(out ** 2).derivatives()
    tx = torch.tensor(x, requires_grad=True)
    th = torch.nn.BatchNorm1d(4, dtype=torch.float64)(TF.layer_norm(tx, (8,)))
    tout = theirs(th, th, th, key_padding_mask=torch.tensor(pad))[0]
    (tout ** 2).sum().backward()
    _close(out.value, tout, np.float64, "value")
    _close(d[X], tx.grad, np.float64, "input derivative")
    _close(mha.in_proj_weight.gradient(d), theirs.in_proj_weight.grad, np.float64)


# ---- errors ----

def test_bad_shapes_and_arguments_raise():
    x = ad.Tensor.constant(_normal(2, 4, 3))
    with pytest.raises(ShapeError, match="normalized_shape"):
        F.layer_norm(x, (4,))
    with pytest.raises(ShapeError, match="weight of shape"):
        F.layer_norm(x, 3, weight=np.ones(4))
    with pytest.raises(ShapeError, match="num_groups=3"):
        F.group_norm(x, 3)
    with pytest.raises(ShapeError, match="num_features=5"):
        nn.BatchNorm1d(5)(x)
    with pytest.raises(ShapeError, match="4 axes"):
        nn.BatchNorm2d(4)(x)
    with pytest.raises(ValueError, match="more than one value"):
        F.batch_norm(ad.Tensor.constant(np.ones((1, 3))), None, None, training=True)
    with pytest.raises(ValueError, match="momentum=None.*num_batches_tracked"):
        F.batch_norm(ad.Tensor.constant(np.ones((2, 3))), np.zeros(3), np.ones(3),
                     training=True, momentum=None)
    with pytest.raises(TypeError, match="integers"):
        F.embedding(np.array([0.5]), ad.Tensor.constant(np.ones((3, 2))))
    with pytest.raises(IndexError, match="outside 0..2"):
        F.embedding(np.array([3]), ad.Tensor.constant(np.ones((3, 2))))
    with pytest.raises(ShapeError, match="share the last axis"):
        F.scaled_dot_product_attention(x, ad.Tensor.constant(np.ones((2, 4, 2))), x)
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=np.ones((4, 4), bool),
                                       is_causal=True)
    mha = nn.MultiheadAttention(6, 2, batch_first=True)
    with pytest.raises(ShapeError, match="key_padding_mask"):
        mha(np.ones((2, 3, 6)), np.ones((2, 3, 6)), np.ones((2, 3, 6)),
            key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ShapeError, match=r"\(N, L, 6\)"):
        mha(np.ones((2, 3, 5)), np.ones((2, 3, 5)), np.ones((2, 3, 5)))
    with pytest.raises(ValueError, match="num_heads=4"):
        nn.MultiheadAttention(6, 4)

"""LSTM, GRU and their cells in ``nn`` against torch 2.13.0's with the same weights
(loaded from torch's state_dict): outputs, final states and the derivatives of a loss in
the input, the initial states and every parameter, in float64 (1e-10) and float32 (1e-5),
for one and two layers, bidirectional, batch first, unbatched, given and default states;
dropout between layers; grad, forward mode, hvp, hessian, record/replay and vmap against
torch.func; OpenCL; errors."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import func

import easyad as ad
from easyad import nn
from easyad.errors import ShapeError

from conftest import OPENCL

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
DTYPES = [np.float64, np.float32]
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}
KINDS = {"lstm": (nn.LSTM, torch.nn.LSTM), "gru": (nn.GRU, torch.nn.GRU)}


def _close(ours, theirs, dtype, what=""):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=tol, atol=tol, err_msg=what)


def _normal(*shape, seed=1, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def _pair(kind, dtype=np.float64, seed=0, **kw):
    """Our layer with a torch layer's weights (torch's own initialisation, a seeded one)."""
    ours_cls, torch_cls = KINDS[kind]
    torch.manual_seed(seed)
    theirs = torch_cls(3, 4, dtype=TORCH_DTYPE[dtype], **kw)
    ours = ours_cls(3, 4, dtype=dtype, **kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())     # names, in torch's order
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


# (layer arguments, input shape, whether hx is given)
CASES = {
    "one-layer": ({}, (5, 2, 3), False),
    "two-layers-bidirectional-hx": ({"num_layers": 2, "bidirectional": True}, (4, 3, 3), True),
    "batch-first-two-layers-hx": ({"num_layers": 2, "batch_first": True}, (2, 5, 3), True),
    "batch-first-default-hx": ({"batch_first": True, "bidirectional": True}, (3, 4, 3), False),
    "unbatched-bidirectional-hx": ({"bidirectional": True}, (6, 3), True),
    "unbatched-no-bias": ({"bias": False, "num_layers": 2}, (4, 3), False),
    "projected-two-layers-hx": ({"proj_size": 2, "num_layers": 2}, (4, 2, 3), True),
    "projected-unbatched-no-bias": ({"proj_size": 3, "bias": False,
                                     "bidirectional": True}, (3, 3), False),
}
PAIRS = [(kind, case) for kind in KINDS for case in CASES
         if kind == "lstm" or "proj_size" not in CASES[case][0]]     # torch's GRU has none


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize(("kind", "case"), PAIRS, ids=[f"{k}-{c}" for k, c in PAIRS])
def test_layers_against_torch(kind, case, dtype):
    kw, shape, given = CASES[case]
    ours, theirs = _pair(kind, dtype, **kw)
    directions = 2 if kw.get("bidirectional") else 1
    count = kw.get("num_layers", 1) * directions
    batch = () if len(shape) == 2 else (shape[0] if kw.get("batch_first") else shape[1],)
    x = _normal(*shape, dtype=dtype)
    sizes = (kw.get("proj_size") or 4, 4)       # h_0 of the projection's size, c_0 of H
    states = [_normal(count, *batch, n, seed=s, dtype=dtype) for s, n in zip((2, 3), sizes)][
        :2 if kind == "lstm" else 1] if given else []
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst)
    S = [ad.Tensor.variable(s, lst) for s in states]
    tx = torch.tensor(x, requires_grad=True)
    ts = [torch.tensor(s, requires_grad=True) for s in states]
    hx = None if not given else (tuple(S) if kind == "lstm" else S[0])
    thx = None if not given else (tuple(ts) if kind == "lstm" else ts[0])
    out, final = ours(X, hx)
    tout, tfinal = theirs(tx, thx)
    finals = list(final) if kind == "lstm" else [final]
    tfinals = list(tfinal) if kind == "lstm" else [tfinal]
    assert out.dtype == dtype and tuple(out.shape) == tuple(tout.shape)
    _close(out.value, tout, dtype, "output")
    for k, (f, tf) in enumerate(zip(finals, tfinals)):
        assert tuple(f.shape) == tuple(tf.shape)
        _close(f.value, tf, dtype, f"final state {k}")
    # a loss that reaches the output and every final state, with random cotangents
    gs = [_normal(*o.shape, seed=10 + k, dtype=dtype) for k, o in enumerate([out] + finals)]
    d = sum((ad.sum(o * g) for o, g in zip([out] + finals, gs)), start=0.0).derivatives()
    sum(((o * torch.tensor(g)).sum() for o, g in zip([tout] + tfinals, gs))).backward()
    _close(d[X], tx.grad, dtype, "input derivative")
    for k, (s, t) in enumerate(zip(S, ts)):
        _close(d[s], t.grad, dtype, f"initial state {k} derivative")
    tparams = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        _close(p.gradient(d), tparams[name].grad, dtype, f"{name} derivative")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cells_against_torch(kind, dtype):
    ours_cls = nn.LSTMCell if kind == "lstm" else nn.GRUCell
    torch_cls = torch.nn.LSTMCell if kind == "lstm" else torch.nn.GRUCell
    torch.manual_seed(1)
    theirs = torch_cls(3, 4, dtype=TORCH_DTYPE[dtype])
    ours = ours_cls(3, 4, dtype=dtype)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    for batch in ((2,), ()):
        xs = [_normal(*batch, 3, seed=s, dtype=dtype) for s in (1, 2, 3)]
        lst = ad.WengertList()
        X = [ad.Tensor.variable(x, lst) for x in xs]
        tX = [torch.tensor(x, requires_grad=True) for x in xs]
        state, tstate = None, None          # three steps from the zero state
        for x, tx in zip(X, tX):
            state, tstate = ours(x, state), theirs(tx, tstate)
        h, th = (state[0], tstate[0]) if kind == "lstm" else (state, tstate)
        _close(h.value, th, dtype, f"h, batch {batch}")
        g = _normal(*batch, 4, seed=7, dtype=dtype)
        loss = ad.sum(h * g) + (ad.sum(state[1] ** 2) if kind == "lstm" else 0.0)
        tloss = (th * torch.tensor(g)).sum() + ((tstate[1] ** 2).sum() if kind == "lstm"
                                                else 0.0)
        d = loss.derivatives()
        theirs.zero_grad()
        tloss.backward()
        for x, tx in zip(X, tX):
            _close(d[x], tx.grad, dtype, "input derivative")
        tparams = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            _close(p.gradient(d), tparams[name].grad, dtype, f"{name} derivative")


def test_cell_functions_by_hand():
    # one LSTM step from zero with one input unit: each gate's pre-activation is its row
    # of w_ih times x plus both biases; derived by hand from torch's formulas
    w_ih = np.array([[1.0], [2.0], [0.5], [-1.0]])
    b = np.array([0.1, -0.2, 0.3, 0.4])
    h, c = nn.lstm_cell(np.array([0.7]), None, w_ih, np.zeros((4, 1)), b, b)
    pre = w_ih[:, 0] * 0.7 + 2 * b
    sig = 1 / (1 + np.exp(-pre))
    c_ref = sig[0] * np.tanh(pre[2])
    np.testing.assert_allclose(c.value, [c_ref], rtol=1e-14)
    np.testing.assert_allclose(h.value, [sig[3] * np.tanh(c_ref)], rtol=1e-14)
    # a GRU step: r multiplies only W_hn h + b_hn
    w_ih, w_hh = np.array([[0.2], [-0.3], [0.8]]), np.array([[0.5], [1.5], [-0.4]])
    b_ih, b_hh, x, h0 = np.array([0.1, 0.2, 0.3]), np.array([-0.1, 0.4, 0.6]), 0.9, 0.25
    r, z = (1 / (1 + np.exp(-(w_ih[k, 0] * x + b_ih[k] + w_hh[k, 0] * h0 + b_hh[k])))
            for k in (0, 1))
    n = np.tanh(w_ih[2, 0] * x + b_ih[2] + r * (w_hh[2, 0] * h0 + b_hh[2]))
    out = nn.gru_cell(np.array([x]), np.array([h0]), w_ih, w_hh, b_ih, b_hh)
    np.testing.assert_allclose(out.value, [(1 - z) * n + z * h0], rtol=1e-14)


def test_default_initialisation_is_torchs():
    bound = 1 / np.sqrt(16)
    a = nn.LSTM(5, 16, num_layers=2, bidirectional=True, generator=3)
    b = nn.LSTM(5, 16, num_layers=2, bidirectional=True, generator=3)
    theirs = torch.nn.LSTM(5, 16, num_layers=2, bidirectional=True)
    for (name, p), (tname, tp) in zip(a.named_parameters(), theirs.named_parameters()):
        assert name == tname and p.shape == tuple(tp.shape)
        assert np.abs(p.data).max() <= bound and np.abs(p.data).max() > 0.9 * bound
        np.testing.assert_array_equal(p.data, b.state_dict()[name])     # seeded: repeatable
    assert a.weight_ih_l1.shape == (64, 32) and a.bias_hh_l1_reverse.shape == (64,)
    # all U(-b, b): 4 * 16 * (5 + 16 + 2) + ... draws, mean near 0, variance b^2 / 3
    values = np.concatenate([p.data.ravel() for p in a.parameters()])
    assert abs(values.mean()) < 0.01 and abs(values.var() - bound ** 2 / 3) < 0.002
    cell = nn.GRUCell(3, 9, bias=False, generator=0)
    assert sorted(cell.state_dict()) == ["weight_hh", "weight_ih"]
    assert np.abs(cell.weight_hh.data).max() <= 1 / 3


def test_dropout_between_layers():
    ours, theirs = _pair("lstm", num_layers=2, dropout=1.0)
    x = _normal(4, 2, 3)
    # p = 1 zeroes the first layer's output in both: deterministic, so comparable
    _close(ours(x)[0].value, theirs(torch.tensor(x))[0], np.float64, "p = 1")
    ours.eval()
    theirs.eval()          # no dropout in evaluation mode
    _close(ours(x)[0].value, theirs(torch.tensor(x))[0], np.float64, "eval")
    # p = 1/2 with a seeded generator: the mask is generator.random(shape) < 1/2, scaled
    # by 2, on layer 0's output only; rebuilt here by hand from two one-layer GRUs. The
    # generator made the weights first, then draws the masks: a copy of it draws the same
    generator = np.random.default_rng(5)
    model = nn.GRU(3, 4, num_layers=2, dropout=0.5, generator=generator)
    masks = copy.deepcopy(generator)
    first, second = nn.GRU(3, 4), nn.GRU(4, 4)
    state = model.state_dict()
    first.load_state_dict({k: v for k, v in state.items() if k.endswith("l0")})
    second.load_state_dict({k.replace("l1", "l0"): v for k, v in state.items()
                            if k.endswith("l1")})
    out, h = model(x)
    mid = first(x)[0].value
    mask = (masks.random(mid.shape) < 0.5) * 2.0
    ref, ref_h = second(mid * mask)
    np.testing.assert_allclose(out.value, ref.value, rtol=1e-14)
    np.testing.assert_allclose(h.value[1], ref_h.value[0], rtol=1e-14)
    np.testing.assert_allclose(h.value[0], first(x)[1].value[0], rtol=1e-14)


# ---- transforms against torch.func ----

def _functional(kind, **kw):
    ours, theirs = _pair(kind, **kw)
    names = [n for n, _ in ours.named_parameters()]

    def loss(params, x):
        out, final = nn.functional_call(ours, params, x)
        h = final[0] if kind == "lstm" else final
        return ad.sum(out ** 2) + ad.sum(ad.tanh(h))

    def tloss(params, x):
        out, final = func.functional_call(theirs, params, (x,))
        h = final[0] if kind == "lstm" else final
        return (out ** 2).sum() + torch.tanh(h).sum()
    params = {n: p.data.copy() for n, p in ours.named_parameters()}
    tparams = {n: torch.tensor(params[n]) for n in names}
    return loss, tloss, params, tparams


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_grad_forward_mode_and_hvp_against_torch_func(kind):
    loss, tloss, params, tparams = _functional(kind, bidirectional=True)
    x = _normal(3, 2, 3)
    tx = torch.tensor(x)
    g = ad.grad(loss)(params, x)
    tg = func.grad(tloss)(tparams, tx)
    for n in params:
        _close(g[n], tg[n], np.float64, f"grad {n}")
    gx = func.grad(tloss, argnums=1)(tparams, tx)
    _close(ad.grad(lambda x: loss(params, x))(x), gx, np.float64, "grad in x")
    _close(ad.jacobian(lambda x: loss(params, x), mode="forward")(x), gx, np.float64,
           "forward mode")
    # Hessian times v, in the input and in the parameters: torch's jvp of its grad
    v = _normal(*x.shape, seed=4)
    _close(ad.hvp(lambda x: loss(params, x), x, v),
           func.jvp(lambda x: func.grad(tloss, argnums=1)(tparams, x), (tx,),
                    (torch.tensor(v),))[1], np.float64, "hvp in x")
    vp = {n: _normal(*p.shape, seed=5 + k) for k, (n, p) in enumerate(params.items())}
    ours_hvp = ad.hvp(lambda p: loss(p, x), params, vp)
    theirs_hvp = func.jvp(lambda p: func.grad(tloss)(p, tx), (tparams,),
                          ({n: torch.tensor(a) for n, a in vp.items()},))[1]
    for n in params:
        _close(ours_hvp[n], theirs_hvp[n], np.float64, f"hvp {n}")


def test_hessian_of_a_small_lstm_cell():
    w_ih, w_hh, b = _normal(8, 2, seed=1), _normal(8, 2, seed=2), _normal(8, seed=3)
    h0, c0 = _normal(2, seed=4), _normal(2, seed=5)

    def ours(x):
        h, c = nn.lstm_cell(x, (h0, c0), w_ih, w_hh, b, b)
        return ad.sum(h * c)

    def theirs(x):
        h, c = torch.lstm_cell(x[None], (torch.tensor(h0)[None], torch.tensor(c0)[None]),
                               torch.tensor(w_ih), torch.tensor(w_hh), torch.tensor(b),
                               torch.tensor(b))
        return (h * c).sum()
    x = _normal(2, seed=6)
    _close(ad.hessian(ours)(x), func.hessian(theirs)(torch.tensor(x)), np.float64)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recorded_loss_replays_at_new_inputs(kind):
    loss, tloss, params, tparams = _functional(kind, num_layers=2, batch_first=True)
    x = _normal(2, 4, 3)
    recorded = ad.record(loss, params, x)
    for seed in (7, 8):
        x2 = _normal(2, 4, 3, seed=seed)
        p2 = {n: a + 0.1 * _normal(*a.shape, seed=seed + k)
              for k, (n, a) in enumerate(params.items())}
        value, g = recorded.value_and_gradient(p2, x2)
        eager_value, eager_g = ad.value_and_grad(loss)(p2, x2)
        tp2 = {n: torch.tensor(a) for n, a in p2.items()}
        tg = func.grad(tloss)(tp2, torch.tensor(x2))
        _close(value, eager_value, np.float64, "replayed value")
        _close(value, tloss(tp2, torch.tensor(x2)).item(), np.float64, "value vs torch")
        for n in params:
            _close(g[n], eager_g[n], np.float64, f"replayed {n}")
            _close(g[n], tg[n], np.float64, f"{n} vs torch")


def test_vmap_of_grad_against_torch():
    loss, tloss, params, tparams = _functional("lstm", num_layers=2)
    xs = np.stack([_normal(3, 2, 3, seed=s) for s in (1, 2, 3)])

    def ours(x):
        return loss(params, x)
    got = ad.vmap(ad.grad(ours))(xs)
    # torch.func.vmap cannot batch torch's LSTM kernel: its grad example by example
    want = np.stack([func.grad(lambda x: tloss(tparams, x))(torch.tensor(x)).numpy()
                     for x in xs])
    _close(got, want, np.float64, "vmap(grad)")


@pytest.mark.parametrize("device", OPENCL or [pytest.param("opencl", marks=pytest.mark.skip(
    reason="no working OpenCL device"))])
def test_a_gru_on_opencl(device):
    ours, theirs = _pair("gru", num_layers=2)
    ours.to(device=device)
    x = _normal(3, 2, 3)
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst, device=device)
    out, h = ours(X)
    assert str(out.device) == device
    d = ad.sum(out ** 2).derivatives()
    tx = torch.tensor(x, requires_grad=True)
    tout, th = theirs(tx)
    (tout ** 2).sum().backward()
    _close(out.value, tout, np.float64, "value")
    _close(h.value, th, np.float64, "h_n")
    _close(d[X], tx.grad, np.float64, "input derivative")
    _close(ours.weight_hh_l1.gradient(d), theirs.weight_hh_l1.grad, np.float64)
    # recorded once on the device, replayed at another input
    recorded = ad.record(lambda x: ad.sum(ours(x)[0] ** 2), x)
    x2 = _normal(3, 2, 3, seed=9)
    tx2 = torch.tensor(x2, requires_grad=True)
    (theirs(tx2)[0] ** 2).sum().backward()
    _close(recorded.gradient(x2), tx2.grad, np.float64, "replayed input derivative")


# ---- errors ----

def test_bad_arguments_raise():
    lstm = nn.LSTM(3, 4, num_layers=2)
    with pytest.raises(ShapeError, match=r"input of shape \(5, 2, 2\)"):
        lstm(np.ones((5, 2, 2)))
    with pytest.raises(ShapeError, match=r"\(L, N, input_size\)"):
        lstm(np.ones((5, 2, 3, 1)))
    with pytest.raises(ShapeError, match=r"h_0 of shape \(1, 2, 4\) must be \(2, 2, 4\)"):
        lstm(np.ones((5, 2, 3)), (np.zeros((1, 2, 4)), np.zeros((2, 2, 4))))
    with pytest.raises(TypeError, match="pair"):
        lstm(np.ones((5, 2, 3)), np.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="empty"):
        lstm(np.ones((0, 2, 3)))
    with pytest.raises(ShapeError, match=r"hx of shape \(3,\) must be \(2, 4\)"):
        nn.GRUCell(3, 4)(np.ones((2, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="proj_size=4 must be"):
        nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="dropout"):
        nn.GRU(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="positive"):
        nn.LSTM(3, 0)
    with pytest.warns(UserWarning, match="does nothing"):
        nn.GRU(3, 4, dropout=0.5)
    with pytest.raises(ShapeError, match=r"weights\[1\] \(layer 1\)"):
        nn.gru(np.ones((2, 3)), [(np.ones((6, 3)), np.ones((6, 2))),
                                 (np.ones((6, 3)), np.ones((6, 2)))])
    with pytest.raises(ValueError, match="per layer and direction"):
        nn.lstm(np.ones((2, 3)), [(np.ones((8, 3)), np.ones((8, 2)))], bidirectional=True)
    with pytest.raises(ShapeError, match=r"\(4 H, input_size\)"):
        nn.lstm_cell(np.ones(3), None, np.ones((6, 3)), np.ones((6, 2)))


def test_a_sequential_passes_its_list_positionally():
    # Sequential calls layer(x, tape): the list lands where hx goes, and is taken as the tape
    gru = nn.GRU(3, 4, generator=0)
    lst = ad.WengertList()
    out, h = nn.Sequential(gru)(np.ones((2, 1, 3)), lst)
    d = ad.sum(out).derivatives()
    assert d[gru.weight_ih_l0].shape == (12, 3) and np.abs(d[gru.weight_ih_l0]).sum() > 0

"""BatchNorm in training mode inside ``ad.record``: every replay at one point updates the
running statistics (and num_batches_tracked, and momentum=None's cumulative average) with
its own batch, as eager easyad and torch's train mode do at every step; batched calls,
pickles and vmap refuse. References: eager easyad and torch 2.13 (same weights, same
batches), float64 to 1e-12."""
import pickle

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import nn

torch.set_default_dtype(torch.float64)
TOL = 1e-12


def _ours(momentum):
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, dtype=np.float64),
                         nn.BatchNorm2d(2, momentum=momentum, dtype=np.float64), nn.Tanh(),
                         nn.Flatten(), nn.Linear(2 * 4 * 4, 3, dtype=np.float64),
                         nn.BatchNorm1d(3, momentum=momentum, dtype=np.float64))


def _theirs(momentum):
    T = torch.nn
    return T.Sequential(T.Conv2d(1, 2, 3, padding=1), T.BatchNorm2d(2, momentum=momentum),
                        T.Tanh(), T.Flatten(), T.Linear(2 * 4 * 4, 3),
                        T.BatchNorm1d(3, momentum=momentum))


def _models(momentum):
    """Two easyad models (recorded, eager) and torch's, all with torch's weights."""
    torch.manual_seed(7)
    theirs = _theirs(momentum)
    with torch.no_grad():
        for b in theirs.modules():
            if isinstance(b, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                b.weight.normal_(1.0, 0.3)
                b.bias.normal_(0.0, 0.3)
    state = {k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()}
    ours = []
    for _ in range(2):
        m = _ours(momentum)
        m.load_state_dict({k: v.copy() for k, v in state.items()})
        m.train()
        ours.append(m)
    theirs.train()
    return ours[0], ours[1], theirs


RNG = np.random.default_rng(28)
G = RNG.normal(size=(6, 3))                       # the loss's fixed weights of the output
BATCHES = [RNG.normal(size=(6, 1, 4, 4)) * (1 + k) + k for k in range(5)]


def _loss(y):
    return ad.sum(y * G + 0.25 * (y * y))


def _tloss(y):
    return (y * torch.tensor(G) + 0.25 * (y * y)).sum()


def _recorded(model):
    named = dict(model.named_parameters())
    params = {k: p.data for k, p in named.items()}

    def loss_of(p, x):
        return _loss(nn.functional_call(model, p, x))
    return ad.record(loss_of, params, BATCHES[0]), params


def _eager_step(model, x):
    lst = ad.WengertList()
    named = dict(model.named_parameters())
    ps = {k: ad.Tensor.variable(p.data, lst) for k, p in named.items()}
    loss = _loss(nn.functional_call(model, ps, x))
    d = loss.derivatives()
    return loss.number, {k: np.asarray(d[t]) for k, t in ps.items()}


def _torch_step(theirs, x):
    theirs.zero_grad()
    loss = _tloss(theirs(torch.tensor(x)))
    loss.backward()
    return loss.item(), {k: p.grad.numpy().copy() for k, p in theirs.named_parameters()}


def _buffers(model):
    return {k: np.asarray(v, dtype=np.float64) for k, v in model.state_dict().items()
            if "running" in k or "num_batches" in k}


def _tbuffers(theirs):
    return {k: v.numpy().astype(np.float64) for k, v in theirs.state_dict().items()
            if "running" in k or "num_batches" in k}


def _same(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=TOL, atol=TOL, err_msg=f"{what}: {k}")


@pytest.mark.parametrize("momentum", [0.1, None])
def test_replayed_training_follows_eager_and_torch(momentum):
    rec_model, eager, theirs = _models(momentum)
    F, params = _recorded(rec_model)
    before = _buffers(rec_model)
    _same(before, _buffers(eager), "recording is not a step")    # untouched by ad.record
    lr = 0.05
    for k, x in enumerate(BATCHES[1:]):
        value, grads = F.value_and_gradient(params, x)
        e_value, e_grads = _eager_step(eager, x)
        t_value, t_grads = _torch_step(theirs, x)
        assert value == pytest.approx(e_value, rel=TOL, abs=TOL)
        assert value == pytest.approx(t_value, rel=TOL, abs=TOL)
        _same(grads, e_grads, f"step {k}: gradient vs eager")
        _same(grads, t_grads, f"step {k}: gradient vs torch")
        _same(_buffers(rec_model), _buffers(eager), f"step {k}: statistics vs eager")
        _same(_buffers(rec_model), _tbuffers(theirs), f"step {k}: statistics vs torch")
        assert int(rec_model[1].num_batches_tracked) == k + 1
        for name, p in params.items():                  # the same SGD step everywhere
            p -= lr * grads[name]
        for name, p in eager.named_parameters():
            p.data -= lr * e_grads[name]
        with torch.no_grad():
            for p in theirs.parameters():
                p -= lr * p.grad


def test_statistics_come_from_each_replay_not_the_recording():
    rec_model, eager, _ = _models(0.1)
    F, params = _recorded(rec_model)
    x = BATCHES[0] * 3.0 + 10.0          # far from the recording's batch
    F(params, x)
    eager(x)
    got, frozen = _buffers(rec_model), _buffers(eager)
    _same(got, frozen, "a value-only replay updates as eager's forward does")
    # what the statistics would be if the effect reused the recording point's batch
    stale, _, _ = _models(0.1)
    stale(BATCHES[0])
    moved = _buffers(stale)
    for k in ("1.running_mean", "1.running_var"):       # (5's input is normalised)
        assert np.max(np.abs(got[k] - moved[k])) > 0.1, k
    F(params, x)
    eager(x)
    _same(_buffers(rec_model), _buffers(eager), "second value-only replay")
    assert int(rec_model[5].num_batches_tracked) == 2


def test_sgd_step_and_vjp_update_once_per_call():
    rec_model, eager, theirs = _models(None)
    F, params = _recorded(rec_model)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for x in BATCHES[1:4]:
        loss = F.sgd_step(params, x, lr=0.1)
        opt.zero_grad()
        t_loss = _tloss(theirs(torch.tensor(x)))
        t_loss.backward()
        opt.step()
        assert loss == pytest.approx(t_loss.item(), rel=TOL, abs=TOL)
        _same(_buffers(rec_model), _tbuffers(theirs), "sgd_step statistics vs torch")
    _same(params, {k: p.detach().numpy() for k, p in theirs.named_parameters()},
          "parameters after sgd_step")
    x = BATCHES[4]
    u = 1.0
    F.vjp(params, u, x)          # one more forward at one point: one more update
    with torch.no_grad():
        theirs(torch.tensor(x))
    _same(_buffers(rec_model), _tbuffers(theirs), "vjp statistics vs torch")
    assert int(rec_model[1].num_batches_tracked) == 4


def _tiny():
    """A function of a (4, 2) batch through BatchNorm1d: Hessians stay small."""
    bn = nn.BatchNorm1d(2, momentum=0.2, affine=False, dtype=np.float64)
    bn.train()
    return bn, lambda x: ad.sum(ad.tanh(bn(x)) * np.array([1.0, -2.0]))


def test_hvp_and_hessian_at_one_point_update_once():
    bn, f = _tiny()
    ref, g = _tiny()
    F = ad.record(f, RNG.normal(size=(4, 2)))
    x = RNG.normal(size=(4, 2)) + 3.0
    v = RNG.normal(size=(4, 2))
    hv = F.hvp(x, v)
    np.testing.assert_allclose(hv, ad.hvp(lambda z: ad.sum(ad.tanh(nn.functional.batch_norm(
        z, None, None, training=True)) * np.array([1.0, -2.0])), x, v), rtol=1e-10, atol=1e-12)
    ref(x)
    _same(_buffers(bn), _buffers(ref), "hvp: one update")
    H = F.hessian(x)                  # every direction at the same point: one update
    ref(x)
    _same(_buffers(bn), _buffers(ref), "hessian: one update")
    assert H.shape == (4, 2, 4, 2)
    assert int(bn.num_batches_tracked) == 2


def test_batches_of_points_refuse():
    bn, f = _tiny()
    F = ad.record(f, RNG.normal(size=(4, 2)))
    X = RNG.normal(size=(3, 4, 2))
    for call in (lambda: F(X), lambda: F.value_and_gradient(X), lambda: F.hessian(X)):
        with pytest.raises(ValueError, match=r"a batch of \d+ points.*running statistics"):
            call()
    assert int(bn.num_batches_tracked) == 0
    da = pytest.importorskip("dask.array")
    with pytest.raises(ValueError, match="dask array of points.*running statistics"):
        F.gradient(da.from_array(X, chunks=(2, 4, 2)))


def test_pickling_refuses_but_eval_recordings_travel():
    bn, f = _tiny()
    F = ad.record(f, RNG.normal(size=(4, 2)))
    with pytest.raises(TypeError, match="running statistics.*do not travel"):
        pickle.dumps(F)
    bn.eval()
    E = ad.record(f, RNG.normal(size=(4, 2)))
    assert E.program.effects == []
    x = RNG.normal(size=(4, 2))
    before = _buffers(bn)
    again = pickle.loads(pickle.dumps(E))
    assert again(x) == pytest.approx(E(x), rel=TOL)
    _same(_buffers(bn), before, "eval replays leave the statistics alone")


def test_vmap_refuses_clearly():
    bn = nn.BatchNorm1d(2, dtype=np.float64)
    with pytest.raises(ValueError, match="torch.func.vmap refuses this too"):
        ad.vmap(lambda x: ad.sum(bn(x)))(RNG.normal(size=(3, 4, 2)))
    assert int(bn.num_batches_tracked) == 0


def _device_run(device, lazy):
    ad.random.seed(3)
    net = nn.Sequential(nn.Linear(4, 8, dtype=np.float64),
                        nn.BatchNorm1d(8, momentum=None, dtype=np.float64), nn.Tanh(),
                        nn.Linear(8, 1, dtype=np.float64))
    params = {k: p.data.copy() for k, p in net.named_parameters()}
    step = ad.record(lambda p, X: ad.sum(nn.functional_call(net, p, X) ** 2), params,
                     np.ones((16, 4)), device=device)
    losses = []
    for k in range(3):
        X = np.random.default_rng(k).normal(size=(16, 4)) + 2.0
        losses.append(float(step.sgd_step(params, X, lr=0.01, lazy=lazy)))
    return losses, _buffers(net)


def test_opencl_replays_update_as_the_numpy_device(opencl_device):
    losses, stats = _device_run("numpy", False)
    for lazy in (False, True):
        got, got_stats = _device_run(opencl_device, lazy)
        np.testing.assert_allclose(got, losses, rtol=1e-12)
        _same(got_stats, stats, f"OpenCL statistics (lazy={lazy})")
        assert got_stats["1.num_batches_tracked"] == 3

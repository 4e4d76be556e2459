"""Training utilities of issue 28 item 2: ad.data.DataLoader, nn.utils' gradient clipping
(against torch.nn.utils on the same numbers), nn.init (against torch.nn.init fed the same
draws) and checkpoints (resumed training bit for bit equal to uninterrupted training)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import nn, optim
from easyad.nn import functional as F


# ---- DataLoader ----

def _epoch(loader):
    return [tuple(np.asarray(a).copy() for a in (b if isinstance(b, tuple) else (b,)))
            for b in loader]


def test_every_sample_once_per_epoch_with_its_label():
    x = np.arange(23 * 3, dtype=float).reshape(23, 3)
    y = np.arange(23)
    loader = ad.data.DataLoader(x, y, batch_size=5, shuffle=True, seed=4)
    assert len(loader) == 5
    seen = []
    for xb, yb in loader:
        assert xb.shape[1:] == (3,) and len(xb) == len(yb) <= 5
        np.testing.assert_array_equal(xb, x[yb])          # rows stay with their labels
        seen += yb.tolist()
    assert sorted(seen) == list(range(23))
    assert seen != list(range(23))                        # shuffled


def test_shuffle_is_seeded_per_epoch_and_epochs_differ():
    x = np.arange(40.0)
    a = ad.data.DataLoader(x, batch_size=8, shuffle=True, seed=11)
    b = ad.data.DataLoader(x, batch_size=8, shuffle=True, seed=11)
    first, second = _epoch(a), _epoch(a)
    assert [f[0].tolist() for f in first] == [f[0].tolist() for f in _epoch(b)]
    assert [f[0].tolist() for f in second] == [f[0].tolist() for f in _epoch(b)]
    assert np.concatenate([f[0] for f in first]).tolist() != \
        np.concatenate([f[0] for f in second]).tolist()
    other = _epoch(ad.data.DataLoader(x, batch_size=8, shuffle=True, seed=12))
    assert np.concatenate([f[0] for f in other]).tolist() != \
        np.concatenate([f[0] for f in first]).tolist()
    resumed = ad.data.DataLoader(x, batch_size=8, shuffle=True, seed=11)
    resumed.set_epoch(1)                                  # a run restarted at epoch 1
    assert [f[0].tolist() for f in _epoch(resumed)] == [f[0].tolist() for f in second]
    ss = [ad.data.DataLoader(x, batch_size=40, shuffle=True, seed=np.random.SeedSequence(8))
          for _ in range(2)]
    e0, e1 = _epoch(ss[0]), _epoch(ss[0])
    assert e0[0][0].tolist() == _epoch(ss[1])[0][0].tolist() != e1[0][0].tolist()
    ad.random.seed(3)                                     # seed=None: from ad.random
    c = _epoch(ad.data.DataLoader(x, batch_size=40, shuffle=True))
    ad.random.seed(3)
    d = _epoch(ad.data.DataLoader(x, batch_size=40, shuffle=True))
    assert c[0][0].tolist() == d[0][0].tolist() != x.tolist()


def test_order_drop_last_single_array_and_tensors():
    x = np.arange(10.0)
    batches = [b.tolist() for b in ad.data.DataLoader(x, batch_size=4)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]      # torch's order unshuffled
    dropped = ad.data.DataLoader(x, batch_size=4, drop_last=True, shuffle=True, seed=0)
    assert len(dropped) == 2 and [len(b) for b in dropped] == [4, 4]
    assert len(ad.data.DataLoader(x, batch_size=20, drop_last=True)) == 0
    assert len(ad.data.DataLoader(x, batch_size=20)) == 1
    t = ad.Tensor.constant(np.arange(12.0).reshape(6, 2))
    got = list(ad.data.DataLoader(t, [0, 1, 2, 3, 4, 5], batch_size=4, shuffle=True, seed=1))
    assert isinstance(got[0][0], ad.Tensor) and got[0][0].shape == (4, 2)
    np.testing.assert_array_equal(np.asarray(got[0][0]),
                                  np.arange(12.0).reshape(6, 2)[got[0][1]])
    b = next(iter(ad.data.DataLoader(x, batch_size=3)))
    b[:] = -1.0
    assert x[0] == 0.0                                    # batches are copies


def test_dataloader_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\[5, 4\]"):
        ad.data.DataLoader(np.zeros(5), np.zeros(4), batch_size=2)
    with pytest.raises(ValueError, match="at least 1"):
        ad.data.DataLoader(np.zeros(5), batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        ad.data.DataLoader(np.zeros(5), batch_size=2.5)
    with pytest.raises(ValueError, match="at least one array"):
        ad.data.DataLoader(batch_size=2)
    with pytest.raises(ValueError, match="scalar"):
        ad.data.DataLoader(np.float64(3.0), batch_size=2)
    with pytest.raises(TypeError, match="seed"):
        ad.data.DataLoader(np.zeros(5), seed=np.random.default_rng(0))
    with pytest.raises(ValueError, match="epoch"):
        ad.data.DataLoader(np.zeros(5)).set_epoch(-1)


# ---- gradient clipping ----

def _model_and_loss(rng, dtype=np.float64):
    model = nn.Sequential(nn.Linear(4, 6, generator=1, dtype=dtype), nn.Tanh(),
                          nn.Linear(6, 3, generator=2, dtype=dtype))
    x, y = rng.standard_normal((8, 4)).astype(dtype), rng.standard_normal((8, 3)).astype(dtype)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    ref = ref.double() if dtype == np.float64 else ref.float()
    ref.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    lst = ad.WengertList()
    loss = F.mse_loss(model(x, tape=lst), y) * 50.0
    tloss = torch.nn.functional.mse_loss(ref(torch.tensor(x, dtype=ref[0].weight.dtype)),
                                         torch.tensor(y, dtype=ref[0].weight.dtype)) * 50.0
    tloss.backward()
    return model, ref, loss


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, math.inf, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, rng):
    model, ref, loss = _model_and_loss(rng)
    grads = nn.utils.clip_grad_norm_(model, loss.derivatives(), max_norm, norm_type)
    total = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type)
    assert grads.total_norm == pytest.approx(total.item(), rel=1e-12)
    names = dict(model.named_parameters())
    for name, tp in ref.named_parameters():
        np.testing.assert_allclose(grads[names[name]], tp.grad.numpy(), rtol=1e-12, atol=1e-15)
    if max_norm < 1.0:       # clipped: the new norm is max_norm (up to torch's 1e-6)
        flat = np.concatenate([g.ravel() for g in grads.values()])
        order = float(norm_type)
        assert np.linalg.norm(flat, ord=order) == pytest.approx(max_norm, rel=1e-5)


def test_clip_grad_norm_float32_and_value_match_torch(rng):
    model, ref, loss = _model_and_loss(rng, np.float32)
    grads = nn.utils.clip_grad_norm_(model.parameters(), loss.derivatives(), 0.3)
    total = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.3)
    assert grads.total_norm == pytest.approx(total.item(), rel=1e-6)
    for p, tp in zip(model.parameters(), ref.parameters()):
        assert grads[p].dtype == np.float32
        np.testing.assert_allclose(grads[p], tp.grad.numpy(), rtol=1e-5, atol=1e-7)
    model, ref, loss = _model_and_loss(rng)
    d = loss.derivatives()
    before = {p: d[p].copy() for p in model.parameters()}
    clipped = nn.utils.clip_grad_value_(model, d, 0.05)
    torch.nn.utils.clip_grad_value_(ref.parameters(), 0.05)
    for p, tp in zip(model.parameters(), ref.parameters()):
        np.testing.assert_array_equal(clipped[p], tp.grad.numpy())
        np.testing.assert_array_equal(d[p], before[p])          # the sweep is not written
    assert np.abs(np.concatenate([g.ravel() for g in clipped.values()])).max() == 0.05


def test_clipped_training_matches_torch_and_leaves_other_parameters_to_the_step(rng):
    model, ref, _ = _model_and_loss(rng)
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 3))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    first = model[0].parameters()                  # only the first layer is clipped
    for _ in range(15):
        lst = ad.WengertList()
        grads = nn.utils.clip_grad_norm_(first, F.mse_loss(model(x, tape=lst), y), 0.2)
        opt.step(grads)
        topt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
        torch.nn.utils.clip_grad_norm_(ref[0].parameters(), 0.2)
        topt.step()
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[k], v.numpy(), rtol=1e-10, atol=1e-13)


def test_clipping_forms_and_errors(rng):
    p, q = nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros((1, 2)))
    given = {p: np.array([3.0, 4.0]), q: np.array([[0.0, 0.0]])}
    g = nn.utils.clip_grad_norm_([p, q], given, 2.5)
    assert g.total_norm == 5.0 and given[p].tolist() == [3.0, 4.0]
    np.testing.assert_allclose(g[p], [1.5, 2.0], rtol=1e-6)
    seq = nn.utils.clip_grad_norm_([p, q], [np.array([0.0, 1e-3]), None], 1.0)
    assert q not in seq and seq[p].tolist() == [0.0, 1e-3]          # under max_norm: as is
    assert nn.utils.clip_grad_norm_([p], {}, 1.0).total_norm == 0.0
    bad = {p: np.array([np.inf, 1.0])}
    with pytest.raises(RuntimeError, match="error_if_nonfinite=False"):
        nn.utils.clip_grad_norm_([p], bad, 1.0, error_if_nonfinite=True)
    t = torch.tensor([np.inf, 1.0], requires_grad=True)
    t.grad = torch.tensor([np.inf, 1.0])
    torch.nn.utils.clip_grad_norm_([t], 1.0)                          # scaled by 1 / inf
    with pytest.warns(RuntimeWarning, match="error_if_nonfinite=True"):
        scaled = nn.utils.clip_grad_norm_([p], bad, 1.0)
    np.testing.assert_array_equal(scaled[p], t.grad.numpy())
    with pytest.raises(TypeError, match="second argument"):
        nn.utils.clip_grad_norm_([p], 1.0, 2.0)                       # torch's order
    with pytest.raises(ValueError, match="1 gradients for 2"):
        nn.utils.clip_grad_norm_([p, q], [np.zeros(2)], 1.0)
    with pytest.raises(ValueError, match="shape"):
        nn.utils.clip_grad_norm_([p], {p: np.zeros(3)}, 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        nn.utils.clip_grad_norm_([p], given, -1.0)
    with pytest.raises(ValueError, match="clip_value"):
        nn.utils.clip_grad_value_([p], given, -1.0)
    with pytest.raises(TypeError, match="nn.Parameter"):
        nn.utils.clip_grad_norm_([np.zeros(2)], given, 1.0)


# ---- initialisers ----

@pytest.fixture
def torch_draws(monkeypatch):
    """torch.nn.init drawing numpy's numbers: Tensor.uniform_/normal_ filled from a
    Generator, as easyad's init draws them."""
    state = {}

    def uniform_(self, a=0.0, b=1.0, generator=None):
        self.copy_(torch.from_numpy(state["rng"].uniform(a, b, size=tuple(self.shape))))
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        self.copy_(torch.from_numpy(state["rng"].normal(mean, std, size=tuple(self.shape))))
        return self
    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    monkeypatch.setattr(torch.Tensor, "normal_", normal_)
    return state


INITS = {
    "xavier_uniform_": dict(gain=1.7),
    "xavier_normal_": dict(gain=0.5),
    "kaiming_uniform_": dict(a=0.2, mode="fan_out", nonlinearity="leaky_relu"),
    "kaiming_normal_": dict(mode="fan_in", nonlinearity="relu"),
    "orthogonal_": dict(gain=2.0),
    "normal_": dict(mean=0.5, std=3.0),
    "uniform_": dict(a=-2.0, b=1.0),
}


@pytest.mark.parametrize("name", INITS)
@pytest.mark.parametrize("shape", [(7, 5), (3, 8, 2, 2)])
def test_init_matches_torch_given_the_same_draws(name, shape, torch_draws):
    kw = dict(INITS[name])
    p = nn.Parameter(np.zeros(shape))
    ours = dict(kw)
    if name == "uniform_":
        ours = {"low": kw["a"], "high": kw["b"]}
    getattr(nn.init, name)(p, generator=np.random.default_rng(7), **ours)
    t = torch.zeros(shape, dtype=torch.float64)
    torch_draws["rng"] = np.random.default_rng(7)
    getattr(torch.nn.init, name)(t, **kw)
    np.testing.assert_allclose(p.data, t.numpy(), rtol=1e-14, atol=1e-15)


def test_init_statistics_and_constants_follow_torch():
    big = (400, 300)
    for name, kw, std in [("xavier_normal_", {}, math.sqrt(2 / 700)),
                          ("kaiming_normal_", dict(nonlinearity="relu"), math.sqrt(2 / 300)),
                          ("xavier_uniform_", {}, math.sqrt(6 / 700) / math.sqrt(3))]:
        p = nn.Parameter(np.zeros(big))
        getattr(nn.init, name)(p, generator=0, **kw)
        t = getattr(torch.nn.init, name)(torch.empty(big, dtype=torch.float64), **kw)
        assert p.data.std() == pytest.approx(std, rel=0.01)
        assert p.data.std() == pytest.approx(t.std().item(), rel=0.02)
    w = nn.init.orthogonal_(nn.Parameter(np.zeros((3, 10))), generator=1).data
    np.testing.assert_allclose(w @ w.T, np.eye(3), atol=1e-13)
    assert np.all(nn.init.ones_(nn.Parameter(np.zeros(3))).data == 1.0)
    assert np.all(nn.init.constant_(nn.Parameter(np.zeros(3)), 0.25).data == 0.25)
    assert nn.init.calculate_gain("selu") == torch.nn.init.calculate_gain("selu")
    assert nn.init.calculate_gain("conv_transpose2d") == 1.0
    with pytest.raises(ValueError, match="fan_in"):
        nn.init.kaiming_normal_(nn.Parameter(np.zeros((2, 2))), mode="fan")
    with pytest.raises(ValueError, match="2 dimensions"):
        nn.init.orthogonal_(nn.Parameter(np.zeros(3)))
    with pytest.raises(ValueError, match="negative slope"):
        nn.init.calculate_gain("leaky_relu", "0.1")


def test_default_layer_initialisation_follows_torch():
    # bounds of torch's defaults: U(+-1/sqrt(fan_in)) for weights and biases
    for layer, fan_in in [(nn.Linear(50, 400, generator=0), 50),
                          (nn.Conv2d(6, 300, 3, generator=0), 54),
                          (nn.ConvTranspose2d(6, 300, 3, generator=0), 2700)]:
        bound = 1 / math.sqrt(fan_in)
        for p in (layer.weight, layer.bias):
            assert np.abs(p.data).max() <= bound and np.abs(p.data).max() > 0.95 * bound
            assert p.data.std() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    emb = nn.Embedding(300, 100, generator=0).weight.data       # torch: N(0, 1)
    assert emb.mean() == pytest.approx(0.0, abs=0.02) and emb.std() == pytest.approx(1.0,
                                                                                    rel=0.02)
    mha = nn.MultiheadAttention(64, 4, generator=0)                # torch's _reset_parameters
    xavier = math.sqrt(6 / (64 + 192))
    assert xavier * 0.95 < np.abs(mha.in_proj_weight.data).max() <= xavier
    assert not mha.in_proj_bias.data.any() and not mha.out_proj.bias.data.any()
    assert np.abs(mha.out_proj.weight.data).max() <= 1 / 8
    norm = nn.LayerNorm(5)
    assert np.all(norm.weight.data == 1.0) and not norm.bias.data.any()
    t = torch.nn.ConvTranspose2d(6, 300, 3)
    assert t.weight.shape == nn.ConvTranspose2d(6, 300, 3).weight.shape
    assert torch.nn.init._calculate_fan_in_and_fan_out(t.weight)[0] == 2700


# ---- checkpoints ----

def _setup(kind, seed):
    model = nn.Sequential(nn.Linear(5, 7, generator=seed), nn.ReLU(),
                          nn.Linear(7, 3, generator=seed + 1))
    if kind == "SGD":
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        sched = optim.SequentialLR(opt, [optim.LinearLR(opt, 0.2, total_iters=2),
                                         optim.CosineAnnealingLR(opt, T_max=5)], [2])
    else:
        opt = optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
        sched = optim.OneCycleLR(opt, max_lr=0.02, total_steps=6)      # cycles beta1
    return model, opt, sched


def _steps(model, opt, sched, loader, n):
    for _ in range(n):
        x, y = next(iter(loader))
        lst = ad.WengertList()
        grads = nn.utils.clip_grad_norm_(model, F.cross_entropy(model(x, tape=lst), y), 1.0)
        opt.step(grads)
        sched.step()


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_checkpoint_resumes_bit_for_bit(kind, tmp_path, rng):
    x, y = rng.standard_normal((40, 5)), rng.integers(0, 3, 40)
    loader = ad.data.DataLoader(x, y, batch_size=8, shuffle=True, seed=5)
    model, opt, sched = _setup(kind, 1)
    _steps(model, opt, sched, loader, 6)                  # uninterrupted
    again, opt2, sched2 = _setup(kind, 1)
    loader2 = ad.data.DataLoader(x, y, batch_size=8, shuffle=True, seed=5)
    _steps(again, opt2, sched2, loader2, 3)
    path = nn.save_checkpoint(tmp_path / "ckpt", model=again, optimizer=opt2,
                              scheduler=sched2, epoch=loader2.epoch, extra={"note": "x"})
    assert path.endswith("ckpt.npz")
    fresh, opt3, sched3 = _setup(kind, 9)                 # other weights: the load counts
    info = nn.load_checkpoint(path, model=fresh, optimizer=opt3, scheduler=sched3)
    assert info == {"epoch": 3, "extra": {"note": "x"}}
    loader3 = ad.data.DataLoader(x, y, batch_size=8, shuffle=True, seed=5)
    loader3.set_epoch(info["epoch"])
    _steps(fresh, opt3, sched3, loader3, 3)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v)
    assert sched3.get_last_lr() == sched.get_last_lr()
    assert opt3.param_groups[0].get("betas") == opt.param_groups[0].get("betas")


def test_checkpoint_is_validated_and_never_unpickled(tmp_path):
    model, opt, sched = _setup("Adam", 1)
    path = nn.save_checkpoint(tmp_path / "c.npz", model=model, optimizer=opt, scheduler=sched)
    other = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match="shape"):
        nn.load_checkpoint(path, model=other)
    with pytest.raises(KeyError, match="missing"):
        nn.load_checkpoint(path, model=nn.Sequential(nn.Linear(5, 7)))
    sgd = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="Adam's state"):
        nn.load_checkpoint(path, optimizer=sgd)
    with pytest.raises(ValueError, match="parameter 0 had shape"):
        nn.load_checkpoint(path, optimizer=optim.Adam(other.parameters()))
    with pytest.raises(TypeError, match="OneCycleLR"):
        nn.load_checkpoint(path, scheduler=optim.StepLR(opt, 2))
    weights = nn.save_checkpoint(tmp_path / "w.npz", model=model)
    with pytest.raises(ValueError, match="holds no optimizer"):
        nn.load_checkpoint(weights, optimizer=opt)
    model.save(tmp_path / "plain.npz")
    with pytest.raises(ValueError, match="not an easyad checkpoint"):
        nn.load_checkpoint(tmp_path / "plain.npz", model=model)
    np.savez(tmp_path / "evil.npz", __checkpoint__=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickled"):
        nn.load_checkpoint(tmp_path / "evil.npz", model=model)
    with pytest.raises(TypeError, match="extra"):
        nn.save_checkpoint(tmp_path / "e.npz", model=model, extra={"f": object()})
    # a failed load wrote nothing
    before = {k: v.copy() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError):
        nn.load_checkpoint(path, model=other)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_docstring_examples_run():
    import doctest
    import importlib
    for name in ("easyad.data", "easyad.nn.utils", "easyad.nn.init",
                 "easyad.optim.lr_scheduler"):
        result = doctest.testmod(importlib.import_module(name),
                                 optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, name
        assert result.attempted > 0 or name == "easyad.nn.init", name


def test_clipping_and_checkpoints_on_every_device(device, tmp_path, rng):
    # clipped gradients come to the host (the update runs in numpy); a checkpoint of a
    # model trained on the device resumes there bit for bit
    x, y = rng.standard_normal((16, 5)), rng.integers(0, 3, 16)

    def run(steps, clip, source=None, seed=1):
        model, opt, _ = _setup("Adam", seed)
        model.to(device)
        if source is not None:
            nn.load_checkpoint(source, model=model, optimizer=opt)
        for _ in range(steps):
            lst = ad.WengertList()
            loss = F.cross_entropy(model(x, tape=lst), y)
            opt.step(nn.utils.clip_grad_norm_(model, loss, 0.1) if clip else loss)
        return model, opt

    host, hopt, _ = _setup("Adam", 1)                    # on the host, the same numbers
    for _ in range(4):
        lst = ad.WengertList()
        hopt.step(nn.utils.clip_grad_norm_(host, F.cross_entropy(host(x, tape=lst), y), 0.1))
    clipped, _ = run(4, clip=True)
    for k, v in host.state_dict().items():
        np.testing.assert_allclose(clipped.state_dict()[k], v, rtol=1e-10, atol=1e-12)
    whole, _ = run(6, clip=False)
    half, opt = run(3, clip=False)
    path = nn.save_checkpoint(tmp_path / "d.npz", model=half, optimizer=opt)
    resumed, _ = run(3, clip=False, source=path, seed=5)
    for k, v in whole.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[k], v)


def test_checkpoint_holds_buffers_and_plateau_state(tmp_path, rng):
    model = nn.Sequential(nn.Linear(3, 4, generator=0), nn.BatchNorm1d(4))
    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    x = rng.standard_normal((6, 3))
    for loss in (1.0, 2.0):
        lst = ad.WengertList()
        opt.step(ad.sum(model(x, tape=lst) ** 2))      # updates the running statistics
        sched.step(loss)
    path = nn.save_checkpoint(tmp_path / "bn.npz", model=model, optimizer=opt, scheduler=sched)
    fresh = nn.Sequential(nn.Linear(3, 4, generator=1), nn.BatchNorm1d(4))
    fopt = optim.SGD(fresh.parameters(), lr=0.1)
    fsched = optim.ReduceLROnPlateau(fopt, patience=0, factor=0.5)
    assert fsched.best == math.inf
    nn.load_checkpoint(path, model=fresh, optimizer=fopt, scheduler=fsched)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v)
    assert "1.running_mean" in model.state_dict()
    assert (fsched.best, fsched.num_bad_epochs, fopt.param_groups[0]["lr"]) == (1.0, 0, 0.05)

"""Neural networks and optimizers (issue 5), validated against PyTorch in float64.

Same initial weights and data on both sides (easyad's initial weights copied into the
PyTorch modules through ``load_state_dict``): forward outputs, losses, the gradients of
inputs and parameters, and the parameters after 50 optimizer steps must match PyTorch's
(rtol 1e-6, most agree to ~1e-14), on the numpy device and on the first OpenCL device
when pyopencl finds one (the ``device`` fixture). Plus: initialisation, seeding, dropout,
modes, Sequential composition, state dicts and files, schedulers, errors.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import nn, optim
from easyad.nn import functional as F

torch.set_default_dtype(torch.float64)

RTOL, ATOL = 1e-6, 1e-12
# the `device` fixture (numpy, and the first OpenCL device) is in conftest.py


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().numpy()
    np.testing.assert_allclose(np.asarray(actual, dtype=float), expected, rtol=rtol, atol=atol)


def to_torch(module, torch_module):
    """``torch_module`` with ``module``'s parameters (state dict names are the same)."""
    torch_module.load_state_dict({k: torch.tensor(v) for k, v in module.state_dict().items()})
    return torch_module


# ---- modules: forward values and gradients of input and parameters ----

MODULES = {
    "Linear": (lambda: nn.Linear(5, 4), lambda: torch.nn.Linear(5, 4)),
    "Linear-no-bias": (lambda: nn.Linear(5, 4, bias=False),
                       lambda: torch.nn.Linear(5, 4, bias=False)),
    "ReLU": (nn.ReLU, torch.nn.ReLU),
    "Tanh": (nn.Tanh, torch.nn.Tanh),
    "Sigmoid": (nn.Sigmoid, torch.nn.Sigmoid),
    "GELU": (nn.GELU, torch.nn.GELU),
    "GELU-tanh": (lambda: nn.GELU("tanh"), lambda: torch.nn.GELU("tanh")),
    "Softmax": (lambda: nn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1)),
    "Identity": (nn.Identity, torch.nn.Identity),
    "Sequential": (lambda: nn.Sequential(nn.Linear(5, 6), nn.GELU(), nn.Linear(6, 3),
                                         nn.Sigmoid()),
                   lambda: torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.GELU(),
                                               torch.nn.Linear(6, 3), torch.nn.Sigmoid())),
}


@pytest.mark.parametrize("name", MODULES)
def test_module_matches_pytorch(name, device, rng):
    make, make_torch = MODULES[name]
    ad.random.seed(1)
    module = make().to(device)
    reference = to_torch(module, make_torch())
    x = rng.standard_normal((7, 5)) * 2.0
    x[0, :3] = [0.0, 30.0, -30.0]                 # a kink and saturation
    w = rng.standard_normal(reference(torch.tensor(x)).shape)

    lst = ad.WengertList()
    xt = ad.Tensor.variable(x, lst, device=device)
    out = module(xt, tape=lst)
    loss = ad.sum(out * w)
    d = loss.derivatives()

    tx = torch.tensor(x, requires_grad=True)
    tout = reference(tx)
    (tout * torch.tensor(w)).sum().backward()
    close(out.value, tout)
    close(d[xt], tx.grad)
    params = dict(module.named_parameters())
    assert set(params) == {k for k, _ in reference.named_parameters()}
    for k, tp in reference.named_parameters():
        close(d[params[k]], tp.grad)


def test_linear_initialisation_is_pytorchs_and_seeded():
    ad.random.seed(3)
    a = nn.Linear(400, 50)
    ad.random.seed(3)
    b = nn.Linear(400, 50)
    c = nn.Linear(400, 50, generator=np.random.default_rng(3))
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    np.testing.assert_array_equal(a.weight.data, c.weight.data)   # same draws, same order
    bound = 1 / math.sqrt(400)
    for p in (a.weight.data, a.bias.data):
        assert p.min() >= -bound and p.max() <= bound
    assert a.weight.data.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)  # uniform
    assert a.weight.shape == (50, 400) and a.weight.dtype == np.float64
    assert nn.Linear(4, 2, dtype=np.float32).weight.dtype == np.float32
    t = torch.nn.Linear(400, 50)                  # PyTorch's draws: same bounds
    assert t.weight.abs().max().item() <= bound and t.weight.abs().max().item() > 0.9 * bound


# ---- losses: values and gradients ----

def _logits_and_targets(rng):
    return rng.standard_normal((6, 4)) * 3, rng.integers(0, 4, 6)


LOSSES = {
    "mse_loss": (lambda rng: (rng.standard_normal((5, 3)), rng.standard_normal((5, 3))),
                 F.mse_loss, torch.nn.functional.mse_loss),
    "l1_loss": (lambda rng: (rng.standard_normal((5, 3)), rng.standard_normal((5, 3))),
                F.l1_loss, torch.nn.functional.l1_loss),
    "cross_entropy": (_logits_and_targets, F.cross_entropy,
                      torch.nn.functional.cross_entropy),
    "cross_entropy-large-logits": (lambda rng: (rng.standard_normal((6, 4)) * 800,
                                                rng.integers(0, 4, 6)),
                                   F.cross_entropy, torch.nn.functional.cross_entropy),
    "cross_entropy-probabilities": (lambda rng: (rng.standard_normal((6, 4)),
                                                 rng.dirichlet(np.ones(4), 6)),
                                    F.cross_entropy, torch.nn.functional.cross_entropy),
    "nll_loss": (lambda rng: (rng.standard_normal((6, 4)), rng.integers(0, 4, 6)),
                 F.nll_loss, torch.nn.functional.nll_loss),
    "binary_cross_entropy": (lambda rng: (rng.uniform(0.02, 0.98, (5, 3)),
                                          rng.uniform(0, 1, (5, 3))),
                             F.binary_cross_entropy,
                             torch.nn.functional.binary_cross_entropy),
    "binary_cross_entropy_with_logits": (
        lambda rng: (np.concatenate([rng.standard_normal(7) * 5, [0.0, 60.0, -60.0, 800.0,
                                                                   -800.0]]),
                     rng.uniform(0, 1, 12)),
        F.binary_cross_entropy_with_logits,
        torch.nn.functional.binary_cross_entropy_with_logits),
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", LOSSES)
def test_loss_matches_pytorch(name, reduction, device, rng):
    make, loss_fn, torch_fn = LOSSES[name]
    x, target = make(rng)
    lst = ad.WengertList()
    xt = ad.Tensor.variable(x, lst, device=device)
    out = loss_fn(xt, target, reduction=reduction)
    tx = torch.tensor(x, requires_grad=True)
    tout = torch_fn(tx, torch.tensor(target), reduction=reduction)
    if reduction == "none":
        w = rng.standard_normal(tout.shape)
        total = ad.sum(out * w)
        (tout * torch.tensor(w)).sum().backward()
        close(out.value, tout)
    else:
        total = out
        tout.backward()
        assert isinstance(out, ad.Record)
        close(out.number, tout.item())
    close(total.derivatives()[xt], tx.grad)


def test_binary_cross_entropy_clamps_like_pytorch():
    p = np.array([0.0, 1.0, 0.5])
    t = np.array([1.0, 0.0, 1.0])
    value = F.binary_cross_entropy(ad.Tensor.constant(p), t, reduction="none").value
    reference = torch.nn.functional.binary_cross_entropy(torch.tensor(p), torch.tensor(t),
                                                         reduction="none")
    close(value, reference)
    assert value[0] == 100.0


def test_pos_weight_and_loss_errors(rng):
    x, t = rng.standard_normal(5), rng.uniform(0, 1, 5)
    close(float(F.binary_cross_entropy_with_logits(x, t, pos_weight=3.0)),
          torch.nn.functional.binary_cross_entropy_with_logits(
              torch.tensor(x), torch.tensor(t), pos_weight=torch.tensor(3.0)).item())
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(x, t, reduction="avg")
    with pytest.raises(ad.ShapeError):
        F.mse_loss(x, t[:3])
    with pytest.raises(IndexError):
        F.cross_entropy(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ad.ShapeError):
        F.cross_entropy(np.zeros((2, 3)), np.array([0, 1, 2]))


# ---- optimizers and schedulers: 50 steps against PyTorch ----

OPTIMIZERS = {
    "SGD": (lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "SGD-momentum-dampening": (
        lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "SGD-nesterov": (
        lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                  weight_decay=1e-2)),
    "Adam": (lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "Adam-amsgrad-l2": (
        lambda p: optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                             amsgrad=True),
        lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                                   amsgrad=True)),
    "AdamW": (lambda p: optim.AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    "RMSprop": (lambda p: optim.RMSprop(p), lambda p: torch.optim.RMSprop(p)),
    "RMSprop-centered-momentum": (
        lambda p: optim.RMSprop(p, lr=0.005, alpha=0.9, momentum=0.5, centered=True,
                                weight_decay=0.01),
        lambda p: torch.optim.RMSprop(p, lr=0.005, alpha=0.9, momentum=0.5, centered=True,
                                      weight_decay=0.01)),
    "SGD-maximize": (lambda p: optim.SGD(p, lr=0.01, maximize=True),
                     lambda p: torch.optim.SGD(p, lr=0.01, maximize=True)),
}
SCHEDULERS = {
    "none": (None, None),
    "StepLR": (lambda o: optim.StepLR(o, step_size=7, gamma=0.5),
               lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    "CosineAnnealingLR": (lambda o: optim.CosineAnnealingLR(o, T_max=20, eta_min=1e-3),
                          lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
                              o, T_max=20, eta_min=1e-3)),
}


def _classifier():
    return (nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU(),
                          nn.Linear(8, 3)),
            torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 3)))


def train_both(make_opt, make_torch_opt, device, rng, steps=50, make_sched=None,
               make_torch_sched=None, loss="cross_entropy"):
    ad.random.seed(2)
    model, reference = _classifier()
    model.to(device)
    to_torch(model, reference)
    x = rng.standard_normal((32, 6))
    y = rng.integers(0, 3, 32) if loss == "cross_entropy" else rng.standard_normal((32, 3))
    loss_fn, torch_loss = (F.cross_entropy, torch.nn.functional.cross_entropy) \
        if loss == "cross_entropy" else (F.mse_loss, torch.nn.functional.mse_loss)
    opt, topt = make_opt(model.parameters()), make_torch_opt(reference.parameters())
    sched = make_sched(opt) if make_sched else None
    tsched = make_torch_sched(topt) if make_torch_sched else None
    tx, ty = torch.tensor(x), torch.tensor(y)
    for _ in range(steps):
        lst = ad.WengertList()
        value = loss_fn(model(x, tape=lst), y)
        opt.step(value.derivatives())
        topt.zero_grad()
        tvalue = torch_loss(reference(tx), ty)
        tvalue.backward()
        topt.step()
        close(value.number, tvalue.item())
        if sched:
            sched.step()
            tsched.step()
            assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-15)
    return model, reference, value.number


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_50_steps_match_pytorch(name, device, rng):
    model, reference, _ = train_both(*OPTIMIZERS[name], device, rng)
    for k, tp in reference.state_dict().items():
        close(model.state_dict()[k], tp)


@pytest.mark.parametrize("scheduler", ["StepLR", "CosineAnnealingLR"])
def test_scheduled_training_matches_pytorch(scheduler, rng):
    model, reference, last = train_both(*OPTIMIZERS["SGD-nesterov"], "numpy", rng,
                                        make_sched=SCHEDULERS[scheduler][0],
                                        make_torch_sched=SCHEDULERS[scheduler][1],
                                        loss="mse_loss")
    for k, tp in reference.state_dict().items():
        close(model.state_dict()[k], tp)


@pytest.mark.parametrize("scheduler", ["StepLR", "CosineAnnealingLR"])
def test_scheduler_learning_rates_match_pytorch(scheduler):
    make, make_torch = SCHEDULERS[scheduler]
    p, tp = nn.Parameter(np.zeros(1)), torch.zeros(1, requires_grad=True)
    opt = optim.Adam([{"params": [p]}, {"params": [nn.Parameter(np.zeros(1))], "lr": 0.5}])
    topt = torch.optim.Adam([{"params": [tp]}, {"params": [torch.zeros(1)], "lr": 0.5}])
    sched, tsched = make(opt), make_torch(topt)
    for _ in range(70):                          # past T_max: the cosine comes back up
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [g["lr"] for g in topt.param_groups], rel=1e-12)
        topt.step()
        sched.step()
        tsched.step()


def test_optimizer_step_forms_and_errors(rng):
    layer = nn.Linear(3, 2)
    x = rng.standard_normal((4, 3))
    before = layer.weight.data.copy()
    opt = optim.SGD(layer, lr=0.1)                # a module stands for its parameters
    lst = ad.WengertList()
    loss = ad.sum(layer(x, tape=lst))
    g = loss.derivatives()[layer.weight]
    opt.step(loss)                                # the loss Record: derivatives taken
    close(layer.weight.data, before - 0.1 * g, rtol=1e-14)
    opt.step({layer.weight: np.ones((2, 3))})     # a mapping: the bias is left alone
    close(layer.weight.data, before - 0.1 * g - 0.1, rtol=1e-14)
    bias = layer.bias.data.copy()
    grads = [np.zeros((2, 3)), np.ones(2)]
    opt.step(grads)                               # a sequence in parameter order
    close(layer.bias.data, bias - 0.1, rtol=1e-14)
    np.testing.assert_array_equal(grads[1], 1.0)  # gradients are only read
    lst = ad.WengertList()
    d = ad.sum(layer(x, tape=lst)).derivatives()
    g = d[layer.weight]
    for kind in (optim.SGD(layer, lr=0.1, momentum=0.5, maximize=True), optim.Adam(layer),
                 optim.RMSprop(layer, weight_decay=0.1), optim.SGD(layer, lr=0.1)):
        kind.step(d)
        kind.step(d)
        np.testing.assert_array_equal(d[layer.weight], g)
    lst = ad.WengertList()
    loss = ad.sum(nn.Linear(3, 2)(x, tape=lst))   # another model's loss
    with pytest.raises(ValueError, match="recorded"):
        opt.step(loss.derivatives())
    with pytest.raises(ValueError, match="recorded"):
        loss.derivatives()[layer.weight]
    with pytest.raises(ValueError, match="more than one"):
        optim.SGD([layer.weight, layer.weight])
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD(layer.parameters(), nesterov=True)
    with pytest.raises(ValueError, match="empty"):
        optim.Adam([])


def test_frozen_parameters_and_shared_use(rng):
    layer = nn.Linear(3, 3)
    layer.bias.requires_grad = False
    x = rng.standard_normal((2, 3))
    lst = ad.WengertList()
    y = layer(layer(x, tape=lst))                 # the same weight used twice
    d = ad.sum(y * y).derivatives()
    tl = to_torch(layer, torch.nn.Linear(3, 3))
    ty = tl(tl(torch.tensor(x)))
    (ty * ty).sum().backward()
    close(d[layer.weight], tl.weight.grad)        # both uses summed
    np.testing.assert_array_equal(d[layer.bias], 0.0)
    bias = layer.bias.data.copy()
    optim.SGD(layer.parameters(), lr=1.0).step(d)
    np.testing.assert_array_equal(layer.bias.data, bias)


# ---- dropout, modes ----

def test_dropout_masks_scaling_and_eval(device, rng):
    x = rng.standard_normal((40, 50)) + 3.0
    drop = nn.Dropout(0.3, generator=11)
    lst = ad.WengertList()
    xt = ad.Tensor.variable(x, lst, device=device)
    out = drop(xt)
    keep = np.random.default_rng(11).random(x.shape) < 0.7    # the documented mask
    close(out.value, np.where(keep, x / 0.7, 0.0), rtol=1e-15)
    assert 0.25 < 1 - keep.mean() < 0.35
    close(ad.sum(out).derivatives()[xt], keep / 0.7, rtol=1e-15)
    # PyTorch with the same mask gives the same output
    tout = torch.tensor(x) * torch.tensor(keep.astype(float)) / (1 - 0.3)
    close(out.value, tout)
    again = drop(ad.Tensor.constant(x, device=device)).value
    assert not np.array_equal(again, out.value)    # a new mask every call
    model = nn.Sequential(nn.Linear(50, 5), nn.Dropout(0.5))
    assert model.eval() is model and not model[1].training
    np.testing.assert_array_equal(model[1](x), x)
    model.train()
    assert model[1].training and model.training
    np.testing.assert_array_equal(nn.Dropout(1.0)(ad.Tensor.constant(x)).value, 0.0)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_dropout_draws_from_ad_random_when_no_generator():
    x = np.ones((10, 10))
    ad.random.seed(4)
    a = nn.Dropout(0.5)(ad.Tensor.constant(x)).value
    ad.random.seed(4)
    b = nn.Dropout(0.5)(ad.Tensor.constant(x)).value
    np.testing.assert_array_equal(a, b)


# ---- composition, naming, state dicts and files ----

def test_tuples_lists_and_functions_compose(rng):
    ad.random.seed(0)
    nested = nn.Sequential((nn.Linear(3, 4), ad.tanh), [nn.Linear(4, 2), nn.Sigmoid()])
    assert [k for k, _ in nested.named_parameters()] == [
        "0.0.weight", "0.0.bias", "1.0.weight", "1.0.bias"]
    flat = nn.Sequential([nested[0][0], nn.Tanh(), nested[1][0], nn.Sigmoid()])
    x = rng.standard_normal((5, 3))
    close(nested(x).value, flat(x).value, rtol=1e-15)
    assert len(flat) == 4 and isinstance(flat[1:], nn.Sequential) and len(flat[1:]) == 3
    assert "Linear(in_features=3, out_features=4, bias=True)" in repr(nested)
    assert isinstance(nn.as_module((nn.ReLU(),)), nn.Sequential)
    with pytest.raises(TypeError):
        nn.as_module(3)


class TwoLayer(nn.Module):
    """A user-defined model: only the first layer is handed the list."""

    def __init__(self):
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x, tape=None):
        return self.fc2(ad.tanh(self.fc1(x, tape)))


def test_custom_module_names_modes_and_tape_inference(rng):
    model = TwoLayer()
    names = [k for k, _ in model.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    reference = torch.nn.Module()
    reference.fc1, reference.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    to_torch(model, reference)
    x = rng.standard_normal((3, 4))
    lst = ad.WengertList()
    loss = ad.sum(model(x, tape=lst))
    d = loss.derivatives()
    reference.fc2(torch.tanh(reference.fc1(torch.tensor(x)))).sum().backward()
    for k, tp in reference.named_parameters():
        close(d[dict(model.named_parameters())[k]], tp.grad)
    out = model(x)                                # no list: constants, nothing recorded
    assert isinstance(out, ad.Tensor) and out.tape is None
    assert [n for n, _ in model.named_modules()] == ["", "fc1", "fc2"]


def test_state_dict_save_load(tmp_path, rng):
    ad.random.seed(5)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = rng.standard_normal((2, 3))
    path = tmp_path / "model.npz"
    model.save(path)
    ad.random.seed(6)
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert not np.allclose(other(x).value, model(x).value)
    assert other.load(path) is other
    np.testing.assert_array_equal(other(x).value, model(x).value)
    state = model.state_dict()
    state["0.bias"][:] = 0.0                      # copies: the model is untouched
    assert not np.all(model[0].bias.data == 0.0)
    # a PyTorch state dict, converted to numpy, loads as it is
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                    torch.nn.Linear(4, 2))
    model.load_state_dict({k: v.numpy() for k, v in reference.state_dict().items()})
    close(model(x).value, reference(torch.tensor(x)))
    with pytest.raises(KeyError):
        model.load_state_dict({"0.weight": np.zeros((4, 3))})
    with pytest.raises(ValueError, match="shape"):
        model.load_state_dict({**model.state_dict(), "0.bias": np.zeros(5)})
    model.load_state_dict({"0.bias": np.ones(4)}, strict=False)
    np.testing.assert_array_equal(model[0].bias.data, 1.0)


def test_parameters_rebind_per_list_and_generation():
    p = nn.Parameter(np.array([1.0, 2.0]))
    lst = ad.WengertList()
    assert p.tensor(lst) is p.tensor(lst)
    first = p.tensor(lst)
    lst.clear()
    assert p.bound(lst) is None and p.tensor(lst) is not first
    other = ad.WengertList()
    assert p.tensor(other).tape is other
    assert p.tensor().tape is None                 # a constant for inference


# ---- devices and dtypes ----

def test_float32_training_follows_float64(rng):
    ad.random.seed(7)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model32 = nn.Sequential(nn.Linear(6, 16, dtype=np.float32), nn.Tanh(),
                            nn.Linear(16, 3, dtype=np.float32))
    model32.load_state_dict(model.state_dict())
    x, y = rng.standard_normal((32, 6)), rng.integers(0, 3, 32)
    opts = [optim.Adam(m.parameters(), lr=0.01) for m in (model, model32)]
    for _ in range(20):
        for m, opt in zip((model, model32), opts):
            lst = ad.WengertList()
            loss = F.cross_entropy(m(x, tape=lst), y)
            opt.step(loss.derivatives())
    assert model32[0].weight.dtype == np.float32
    close(model32[0].weight.data, model[0].weight.data, rtol=1e-3, atol=1e-4)


# ---- the README's example and the examples ----

def test_readme_example_trains():
    import pathlib
    import re
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
                 if "from easyad import nn" in b)
    ns = {}
    exec(compile(block, "README.md", "exec"), ns)
    assert ns["loss"].number < 0.01                  # y = x0 x1 is learnt
    assert ns["d"][ns["model"][0].weight].shape == (16, 2)


@pytest.mark.parametrize("example,args", [("regression", ["--steps", "60"]),
                                          ("classifier", ["--epochs", "2"])])
def test_examples_run(example, args, tmp_path):
    pytest.importorskip("tqdm")
    pytest.importorskip("matplotlib")
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / f"{example}.py"
    spec = importlib.util.spec_from_file_location(f"example_{example}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(args + ["--out", str(tmp_path)])
    assert (tmp_path / f"{example}_loss.png").stat().st_size > 0
    assert (tmp_path / f"{example}.npz").is_file()


def test_docstring_examples_run():
    import doctest
    import importlib
    names = ["easyad.random", "easyad.nn._parameter", "easyad.nn._module",
             "easyad.nn._layers", "easyad.nn.functional", "easyad.nn.init",
             "easyad.optim._optimizer", "easyad.optim.lr_scheduler"]
    attempted = 0
    for name in names:
        result = doctest.testmod(importlib.import_module(name),
                                 optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted >= 20


# ---- checkpoints, init, module lists ----

def test_checkpoint_resumes_training_exactly(tmp_path, rng):
    x, y = rng.standard_normal((16, 6)), rng.integers(0, 3, 16)

    def fresh():
        ad.random.seed(9)
        model = _classifier()[0]
        opt = optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
        return model, opt, optim.CosineAnnealingLR(opt, T_max=15)

    def train(model, opt, sched, steps):
        for _ in range(steps):
            lst = ad.WengertList()
            opt.step(F.cross_entropy(model(x, tape=lst), y).derivatives())
            sched.step()

    model, opt, sched = fresh()
    train(model, opt, sched, 10)
    model.save(tmp_path / "model.npz")
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    assert set(saved_opt["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    assert saved_opt["param_groups"][0]["params"] == list(range(6))
    train(model, opt, sched, 7)
    model2, opt2, sched2 = fresh()
    model2.load(tmp_path / "model.npz")
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    train(model2, opt2, sched2, 7)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(model2.state_dict()[k], v)
    assert sched2.get_last_lr() == sched.get_last_lr()
    with pytest.raises(ValueError, match="groups"):
        optim.Adam(nn.Linear(2, 2).parameters()).load_state_dict(saved_opt)


def test_init_functions_follow_pytorch():
    for name, param in [("linear", None), ("tanh", None), ("relu", None),
                        ("leaky_relu", 0.2), ("sigmoid", None)]:
        assert nn.init.calculate_gain(name, param) == pytest.approx(
            torch.nn.init.calculate_gain(name, param))
    p = nn.Parameter(np.zeros((30, 20)))
    nn.init.xavier_uniform_(p, gain=2.0, generator=np.random.default_rng(0))
    bound = 2.0 * math.sqrt(6.0 / 50)
    assert np.abs(p.data).max() <= bound and np.abs(p.data).max() > 0.9 * bound
    nn.init.kaiming_uniform_(p, generator=1)
    assert np.abs(p.data).max() <= math.sqrt(2.0) * math.sqrt(3.0 / 20)
    assert np.all(nn.init.zeros_(p).data == 0.0)


class Stack(nn.Module):
    def __init__(self):
        self.blocks = [nn.Linear(3, 3), nn.Linear(3, 2)]
        self.scales = [nn.Parameter(np.ones(3)), nn.Parameter(np.ones(2))]

    def forward(self, x, tape=None):
        x = self.blocks[0](x, tape) * self.scales[0].tensor(tape)
        return self.blocks[1](x) * self.scales[1].tensor(tape)


def test_lists_of_modules_and_parameters_are_found(rng):
    model = Stack()
    assert [k for k, _ in model.named_parameters()] == [      # own ones first, as in PyTorch
        "scales.0", "scales.1", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
        "blocks.1.bias"]
    lst = ad.WengertList()
    d = ad.sum(model(rng.standard_normal((4, 3)), tape=lst)).derivatives()
    assert all(d[p].shape == p.shape for p in model.parameters())


class TwoHeads(nn.Module):
    def __init__(self):
        self.body = nn.Linear(4, 6)
        self.used = nn.Linear(6, 2)
        self.unused = nn.Linear(6, 2)

    def forward(self, x, tape=None):
        h = ad.tanh(self.body(x, tape))
        return self.used(h), self.unused(h)


def test_parameters_no_derivative_reaches_are_skipped_like_pytorch(rng):
    # recorded in the forward pass but not on the loss's path: PyTorch's grad stays None
    # and its optimizers leave the parameter alone (no weight decay, no moments)
    model = TwoHeads()
    reference = torch.nn.Module()
    reference.body, reference.used, reference.unused = (torch.nn.Linear(4, 6),
                                                        torch.nn.Linear(6, 2),
                                                        torch.nn.Linear(6, 2))
    to_torch(model, reference)
    opt = optim.AdamW(model.parameters(), lr=0.01)
    topt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    x = rng.standard_normal((8, 4))
    for _ in range(5):
        lst = ad.WengertList()
        used, _ = model(x, tape=lst)
        d = ad.sum(used * used).derivatives()
        assert model.unused.weight.gradient(d) is None
        np.testing.assert_array_equal(d[model.unused.weight], 0.0)
        opt.step(d)
        topt.zero_grad()
        h = torch.tanh(reference.body(torch.tensor(x)))
        tused = reference.used(h)
        reference.unused(h)
        (tused * tused).sum().backward()
        topt.step()
    for k, tp in reference.state_dict().items():
        close(model.state_dict()[k], tp)
    assert model.unused.weight not in opt.state


def test_a_training_step_leaves_no_reference_cycles(device):
    """Each step's WengertList (activations, adjoints) is freed as soon as the last name
    for it goes, by reference counting, not later by the garbage collector."""
    import gc
    ad.random.seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Dropout(0.2), nn.Linear(8, 8),
                          nn.Sigmoid(), nn.ReLU(), nn.Linear(8, 3), nn.LogSoftmax()).to(device)
    opt = optim.Adam(model.parameters())
    x, y = np.random.default_rng(0).random((5, 3)), np.array([0, 1, 2, 0, 1])

    def step():
        lst = ad.WengertList()
        out = model(x, tape=lst)
        loss = (F.cross_entropy(out, y) + F.mse_loss(out, np.zeros((5, 3)))
                + F.binary_cross_entropy_with_logits(out, np.ones((5, 3)))
                + F.l1_loss(out, np.ones((5, 3)))
                + F.binary_cross_entropy(F.sigmoid(out), np.ones((5, 3))))
        opt.step(loss.derivatives())
    step()              # a first step compiles the device's kernels and fills caches
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step()
        step()
        gc.collect()
        names = {getattr(o, "__qualname__", type(o).__name__) for o in gc.garbage}
        assert gc.garbage == [], sorted(names)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()

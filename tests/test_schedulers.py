"""The schedulers of issue 28 (LinearLR, SequentialLR, OneCycleLR, ReduceLROnPlateau)
against torch 2.13's: the learning rates (and the cycled momentum) of every parameter group
after every step, to 1e-12, over hundreds of steps; and training under OneCycleLR."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import nn, optim
from easyad.nn import functional as F

TS = torch.optim.lr_scheduler


def _pair(kind, **options):
    """An easyad and a torch optimizer over two parameter groups (lrs 0.1 and 0.5)."""
    ours = getattr(optim, kind)([{"params": [nn.Parameter(np.zeros(2))]},
                                 {"params": [nn.Parameter(np.zeros(3))], "lr": 0.5}],
                                lr=0.1, **options)
    theirs = getattr(torch.optim, kind)([{"params": [torch.zeros(2, requires_grad=True)]},
                                         {"params": [torch.zeros(3, requires_grad=True)],
                                          "lr": 0.5}], lr=0.1, **options)
    return ours, theirs


def _same_groups(opt, topt, what):
    for g, tg in zip(opt.param_groups, topt.param_groups):
        for key in ("lr", "momentum", "betas"):
            if key in tg:
                assert np.array(g[key]) == pytest.approx(np.array(tg[key]), rel=1e-12,
                                                         abs=0), f"{key} {what}"


def _run(make, make_torch, steps, kind="SGD", options=None, metrics=None):
    opt, topt = _pair(kind, **({"momentum": 0.9} if options is None else options))
    sched, tsched = make(opt), make_torch(topt)
    _same_groups(opt, topt, "after construction")
    for k in range(steps):
        topt.step()                       # no gradients: only keeps torch's order check quiet
        if metrics is None:
            sched.step()
            tsched.step()
        else:
            sched.step(metrics[k])
            tsched.step(metrics[k])
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12, abs=0), k
        _same_groups(opt, topt, f"at step {k}")
    return sched, tsched


LINEAR = {
    "default": {},
    "warmup": dict(start_factor=0.01, total_iters=40),
    "decay": dict(start_factor=1.0, end_factor=0.05, total_iters=150),
}


@pytest.mark.parametrize("name", LINEAR)
def test_linear_lr_matches_torch(name):
    kw = LINEAR[name]
    _run(lambda o: optim.LinearLR(o, **kw), lambda o: TS.LinearLR(o, **kw), 300)


def test_sequential_warmup_then_cosine_matches_torch():
    def make(mod, o):
        cls = optim if mod == "ad" else TS
        return cls.SequentialLR(o, [cls.LinearLR(o, start_factor=0.1, total_iters=10),
                                    cls.CosineAnnealingLR(o, T_max=90, eta_min=1e-4)],
                                milestones=[10])
    _run(lambda o: make("ad", o), lambda o: make("torch", o), 400)   # past T_max too


def test_sequential_of_three_matches_torch():
    def make(mod, o):
        cls = optim if mod == "ad" else TS
        return cls.SequentialLR(o, [cls.LinearLR(o, start_factor=0.2, total_iters=4),
                                    cls.StepLR(o, step_size=3, gamma=0.7),
                                    cls.CosineAnnealingLR(o, T_max=30)], milestones=[6, 20])
    _run(lambda o: make("ad", o), lambda o: make("torch", o), 120)


ONECYCLE = {
    "cos-sgd": ("SGD", dict(max_lr=1.0, total_steps=300)),
    "linear-sgd": ("SGD", dict(max_lr=[1.0, 2.0], total_steps=250, anneal_strategy="linear",
                               pct_start=0.25, div_factor=10.0, final_div_factor=100.0)),
    "three-phase-adam": ("Adam", dict(max_lr=0.01, epochs=10, steps_per_epoch=30,
                                      three_phase=True, base_momentum=0.8,
                                      max_momentum=[0.9, 0.95])),
    "linear-three-phase-adamw": ("AdamW", dict(max_lr=0.02, total_steps=200, three_phase=True,
                                               anneal_strategy="linear")),
    "rmsprop": ("RMSprop", dict(max_lr=0.05, total_steps=100, pct_start=0.5)),
    "no-momentum-cycle": ("SGD", dict(max_lr=0.3, total_steps=120, cycle_momentum=False)),
}


@pytest.mark.parametrize("name", ONECYCLE)
def test_one_cycle_matches_torch(name):
    kind, kw = ONECYCLE[name]
    options = {"momentum": 0.9} if kind == "SGD" else {}
    sched, tsched = _run(lambda o: optim.OneCycleLR(o, **kw), lambda o: TS.OneCycleLR(o, **kw),
                         sched_steps(kw), kind, options)
    # one step past the end: both refuse
    with pytest.raises(ValueError, match="total_steps"):
        sched.step()
    with pytest.raises(ValueError):
        tsched.step()


def sched_steps(kw):
    return kw.get("total_steps") or kw["epochs"] * kw["steps_per_epoch"]


def _metrics(seed, n=300):
    # a falling loss with plateaus and noise: reductions, cooldowns and recoveries all happen
    rng = np.random.default_rng(seed)
    steps = np.where(rng.random(n) < 0.3, -rng.random(n) * 0.05, rng.random(n) * 0.01)
    return (2.0 + np.cumsum(steps)).tolist()


PLATEAU = {
    "defaults": dict(),
    "min-rel": dict(factor=0.5, patience=3, threshold=1e-3),
    "min-abs-cooldown": dict(factor=0.7, patience=2, threshold=5e-3, threshold_mode="abs",
                             cooldown=4),
    "max-rel": dict(mode="max", factor=0.3, patience=1, min_lr=1e-3),
    "max-abs-min-lrs": dict(mode="max", factor=0.5, patience=0, threshold_mode="abs",
                            threshold=0.0, min_lr=[1e-2, 2e-2], eps=1e-3),
}


@pytest.mark.parametrize("name", PLATEAU)
def test_reduce_on_plateau_matches_torch(name):
    kw = PLATEAU[name]
    metrics = _metrics(len(name))
    if kw.get("mode") == "max":
        metrics = [-m for m in metrics]
    sched, tsched = _run(lambda o: optim.ReduceLROnPlateau(o, **kw),
                         lambda o: TS.ReduceLROnPlateau(o, **kw), len(metrics),
                         metrics=metrics)
    assert sched.get_last_lr() != [0.1, 0.5], "the schedule never reduced: a weak test"
    assert (sched.best, sched.num_bad_epochs, sched.cooldown_counter) == \
        (tsched.best, tsched.num_bad_epochs, tsched.cooldown_counter)


def test_one_cycle_training_matches_torch():
    # momentum cycling reaches the updates: SGD with Nesterov momentum and Adam
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((32, 4)), rng.standard_normal((32, 2))
    for kind, options in (("SGD", dict(momentum=0.9, nesterov=True)), ("Adam", {})):
        model = nn.Sequential(nn.Linear(4, 8, generator=1), nn.Tanh(), nn.Linear(8, 2,
                                                                                 generator=2))
        ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                  torch.nn.Linear(8, 2)).double()
        ref.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
        opt = getattr(optim, kind)(model.parameters(), lr=0.1, **options)
        topt = getattr(torch.optim, kind)(ref.parameters(), lr=0.1, **options)
        sched = optim.OneCycleLR(opt, max_lr=0.05, total_steps=40)
        tsched = TS.OneCycleLR(topt, max_lr=0.05, total_steps=40)
        for _ in range(40):
            lst = ad.WengertList()
            opt.step(F.mse_loss(model(x, tape=lst), y).derivatives())
            topt.zero_grad()
            torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
            topt.step()
            sched.step()
            tsched.step()
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(model.state_dict()[k], v.detach().numpy(), rtol=1e-10,
                                       atol=1e-13)


def test_scheduler_state_round_trips():
    opt, _ = _pair("SGD", momentum=0.9)
    sched = optim.SequentialLR(opt, [optim.LinearLR(opt, total_iters=3),
                                     optim.CosineAnnealingLR(opt, T_max=10)], milestones=[3])
    for _ in range(5):
        sched.step()
    state = sched.state_dict()
    opt2, _ = _pair("SGD", momentum=0.9)
    again = optim.SequentialLR(opt2, [optim.LinearLR(opt2, total_iters=3),
                                      optim.CosineAnnealingLR(opt2, T_max=10)], milestones=[3])
    again.load_state_dict(state)
    opt2.load_state_dict(opt.state_dict())
    for _ in range(8):
        sched.step()
        again.step()
        assert again.get_last_lr() == sched.get_last_lr()
    with pytest.raises(ValueError, match="2 schedulers"):
        optim.SequentialLR(opt2, [optim.LinearLR(opt2)], milestones=[]).load_state_dict(state)


def test_scheduler_errors_name_the_problem():
    opt, _ = _pair("SGD")
    other, _ = _pair("SGD")
    with pytest.raises(ValueError, match="start_factor"):
        optim.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="total_iters"):
        optim.LinearLR(opt, total_iters=0)
    with pytest.raises(ValueError, match="milestones"):
        optim.SequentialLR(opt, [optim.LinearLR(opt), optim.StepLR(opt, 2)], milestones=[])
    with pytest.raises(ValueError, match="increasing"):
        optim.SequentialLR(opt, [optim.LinearLR(opt), optim.StepLR(opt, 2),
                                 optim.StepLR(opt, 3)], milestones=[5, 5])
    with pytest.raises(ValueError, match="another optimizer"):
        optim.SequentialLR(opt, [optim.LinearLR(opt), optim.StepLR(other, 2)], milestones=[3])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        optim.SequentialLR(opt, [optim.LinearLR(opt), optim.ReduceLROnPlateau(opt)],
                           milestones=[3])
    with pytest.raises(TypeError, match="optimizer"):
        optim.LinearLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    with pytest.raises(ValueError, match="total_steps"):
        optim.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        optim.OneCycleLR(opt, max_lr=1.0, total_steps=10, anneal_strategy="cosine")
    with pytest.raises(ValueError, match="2 parameter groups"):
        optim.OneCycleLR(opt, max_lr=[1.0, 2.0, 3.0], total_steps=10)
    plain = optim.SGD([nn.Parameter(np.zeros(1))], lr=0.1)
    del plain.defaults["momentum"]
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        optim.OneCycleLR(plain, max_lr=1.0, total_steps=10)
    with pytest.raises(ValueError, match="mode"):
        optim.ReduceLROnPlateau(opt, mode="least")
    with pytest.raises(ValueError, match="threshold_mode"):
        optim.ReduceLROnPlateau(opt, threshold_mode="relative")
    with pytest.raises(ValueError, match="factor"):
        optim.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="nan"):
        optim.ReduceLROnPlateau(opt).step(math.nan)

"""A training step recorded once and replayed for every batch (``ad.record`` of tensor
code): the regression MLP of ``regression.py`` trained with Adam on the mean squared
error, the loss recorded once by the parameters and replayed for each batch as generated
C; the same training is run eagerly (a WengertList per step) beside it, and the two must
end with the same parameters (to 1e-9). Prints the time per step of both. With
``--optimizer sgd`` the replayed step is ``sgd_step``: plain gradient descent inside the
replayed program, the parameters updated in place by its generated C.

    python examples/replayed_training.py [--steps 300] [--batch 64] [--seed 0]
                                         [--optimizer adam|sgd]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import easyad as ad
from easyad import nn, optim


def make_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((n, 5))
    y = np.stack([np.sin(x[:, 0] + x[:, 1]) / 2 + x[:, 2] / 4, np.tanh(x[:, 3] * x[:, 4])], 1)
    return x, 0.9 * np.tanh(y)


SGD_LR = 0.05


def build(seed: int, optimizer: str) -> tuple[nn.Module, optim.Optimizer]:
    model = nn.Sequential(nn.Linear(5, 32, generator=seed), nn.Tanh(),
                          nn.Linear(32, 32, generator=seed + 1), nn.Tanh(),
                          nn.Linear(32, 2, generator=seed + 2))
    if optimizer == "sgd":
        return model, optim.SGD(model.parameters(), lr=SGD_LR)
    return model, optim.Adam(model.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    batches = [make_data(rng, args.batch) for _ in range(args.steps)]

    # replayed: the loss by the parameters, recorded once at the first batch
    model, opt = build(args.seed, args.optimizer)
    named = dict(model.named_parameters())

    def loss(params, x, y):
        return nn.mse_loss(nn.functional_call(model, params, x), y)
    started = time.perf_counter()
    step = ad.record(loss, {k: p.data for k, p in named.items()}, *batches[0])
    step.value_and_gradient({k: p.data for k, p in named.items()}, *batches[0])
    recorded = time.perf_counter() - started
    started = time.perf_counter()
    for x, y in batches:
        params = {k: p.data for k, p in named.items()}
        if args.optimizer == "sgd":      # the update in the program, in place
            value = step.sgd_step(params, x, y, lr=SGD_LR)
        else:
            value, grads = step.value_and_gradient(params, x, y)
            opt.step([grads[k] for k in named])
    replayed = (time.perf_counter() - started) / args.steps

    # eager: the same training, one WengertList per step
    twin, twin_opt = build(args.seed, args.optimizer)
    started = time.perf_counter()
    for x, y in batches:
        lst = ad.WengertList()
        eager_loss = nn.mse_loss(twin(x, tape=lst), y)
        twin_opt.step(eager_loss.derivatives())
    eager = (time.perf_counter() - started) / args.steps

    for (name, p), q in zip(named.items(), twin.parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=1e-9, atol=1e-9, err_msg=name)
    print(f"{args.steps} steps, batch {args.batch}: final loss {value:.5f} "
          f"(eager {eager_loss.number:.5f})")
    print(f"record + compile once: {recorded * 1e3:.1f} ms; per step: replayed "
          f"{replayed * 1e6:.0f} us, eager {eager * 1e6:.0f} us "
          f"({eager / replayed:.1f}x); same parameters to 1e-9")
    return float(value)


if __name__ == "__main__":
    main()

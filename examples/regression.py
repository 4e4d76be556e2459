"""Regression: a small MLP fits a function of 5 inputs, the shape of dfdx's
``examples/regression.rs``: ((Linear(5, 32), ReLU), (Linear(32, 32), ReLU),
(Linear(32, 2), Tanh)) trained with SGD (Nesterov momentum) on the mean squared error.

The data are made here (no downloads): x ~ N(0, 1)^5 and two targets in (-1, 1),
y = (sin(x0 + x1) / 2 + x2 / 4, tanh(x3 * x4)) squashed by 0.9. Training shows a tqdm
progress bar with the loss; the loss curve (train, and test every epoch) is saved as a
PNG with matplotlib's Agg backend, and the trained model as .npz.

    python examples/regression.py [--steps 1500] [--out examples/out] [--device numpy]
"""
from __future__ import annotations

import argparse
import pathlib

import matplotlib
import numpy as np
from tqdm import tqdm

import easyad as ad
from easyad import nn, optim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def make_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((n, 5))
    y = np.stack([np.sin(x[:, 0] + x[:, 1]) / 2 + x[:, 2] / 4, np.tanh(x[:, 3] * x[:, 4])], 1)
    return x, 0.9 * np.tanh(y)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("examples/out"))
    parser.add_argument("--device", default="numpy", help="numpy, opencl, opencl:N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    ad.random.seed(args.seed)                       # initial weights and batches
    rng = ad.random.generator()
    x_train, y_train = make_data(rng, 2048)
    x_test, y_test = make_data(rng, 512)

    # tuples compose in order, as in dfdx
    model = nn.Sequential((nn.Linear(5, 32), nn.ReLU()),
                          (nn.Linear(32, 32), nn.ReLU()),
                          (nn.Linear(32, 2), nn.Tanh())).to(args.device)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    schedule = optim.CosineAnnealingLR(opt, T_max=args.steps)

    losses, tests = [], []
    bar = tqdm(range(args.steps), desc="regression", unit="step")
    for step in bar:
        batch = rng.integers(0, len(x_train), args.batch)
        lst = ad.WengertList()                      # one training step: three lines
        loss = nn.mse_loss(model(x_train[batch], tape=lst), y_train[batch])
        opt.step(loss.derivatives())
        schedule.step()
        losses.append(loss.number)
        if step % 50 == 0 or step == args.steps - 1:
            test = float(nn.mse_loss(model(x_test), y_test))   # no list: inference
            tests.append((step, test))
            bar.set_postfix(loss=f"{loss.number:.4f}", test=f"{test:.4f}")
    bar.close()

    args.out.mkdir(parents=True, exist_ok=True)
    model.save(args.out / "regression.npz")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(losses, lw=0.6, alpha=0.6, label="train (batch)")
    ax.plot(*zip(*tests), lw=2, label="test")
    ax.set(xlabel="step", ylabel="mean squared error", yscale="log",
           title="easyad.nn: MLP 5-32-32-2 regression")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "regression_loss.png", dpi=120)
    baseline = float(np.mean((y_test - y_train.mean(0)) ** 2))
    print(f"test MSE {tests[-1][1]:.5f} (predicting the mean: {baseline:.5f}); "
          f"wrote {args.out / 'regression_loss.png'} and {args.out / 'regression.npz'}")
    return tests[-1][1]


if __name__ == "__main__":
    main()

"""Classifier: three interleaved spirals in the plane, separated by an MLP with GELU and
dropout, trained with AdamW on the cross-entropy; the data are made here (no downloads).

Training shows a tqdm progress bar (loss, accuracy); then the model is saved to .npz,
loaded into a fresh model, and must give the same test accuracy. The figure (matplotlib,
Agg backend) has the loss curve and the decision regions with the test points.

    python examples/classifier.py [--epochs 60] [--out examples/out] [--device numpy]
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

CLASSES = 3


def spirals(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points per class on CLASSES noisy spiral arms."""
    label = np.repeat(np.arange(CLASSES), n)
    radius = np.tile(np.linspace(0.05, 1.0, n), CLASSES)
    angle = label * 2 * np.pi / CLASSES + 4.0 * radius + rng.normal(0, 0.2, label.size)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return x, label


def make_model(device: str) -> nn.Module:
    return nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, CLASSES)).to(device)


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    predicted = model(x).value.argmax(axis=1)      # no list: inference
    model.train()
    return float(np.mean(predicted == y))


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("examples/out"))
    parser.add_argument("--device", default="numpy", help="numpy, opencl, opencl:N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    ad.random.seed(args.seed)                     # weights, dropout masks, data, batches
    rng = ad.random.generator()
    x_train, y_train = spirals(rng, 300)
    x_test, y_test = spirals(rng, 100)

    model = make_model(args.device)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    schedule = optim.StepLR(opt, step_size=max(1, args.epochs // 3), gamma=0.3)

    losses = []
    batches = -(-len(x_train) // args.batch)
    bar = tqdm(total=args.epochs * batches, desc="classifier", unit="step")
    for _epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        for k in range(batches):
            batch = order[k * args.batch:(k + 1) * args.batch]
            lst = ad.WengertList()                  # one training step: three lines
            loss = nn.cross_entropy(model(x_train[batch], tape=lst), y_train[batch])
            opt.step(loss.derivatives())
            losses.append(loss.number)
            bar.update()
        schedule.step()
        bar.set_postfix(loss=f"{np.mean(losses[-batches:]):.3f}",
                        acc=f"{accuracy(model, x_test, y_test):.3f}")
    bar.close()

    test_accuracy = accuracy(model, x_test, y_test)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save(args.out / "classifier.npz")
    restored = make_model(args.device).load(args.out / "classifier.npz")
    assert accuracy(restored, x_test, y_test) == test_accuracy, "save/load changed the model"

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    left.plot(losses, lw=0.5, alpha=0.5, label="batch")
    smooth = np.convolve(losses, np.ones(batches) / batches, mode="valid")
    left.plot(np.arange(len(smooth)) + batches - 1, smooth, lw=2, label="epoch mean")
    left.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="training loss")
    left.legend()
    grid = np.linspace(-1.2, 1.2, 200)
    gx, gy = np.meshgrid(grid, grid)
    model.eval()
    regions = model(np.stack([gx.ravel(), gy.ravel()], 1)).value.argmax(1).reshape(gx.shape)
    right.contourf(gx, gy, regions, levels=np.arange(CLASSES + 1) - 0.5, cmap="Pastel1",
                   alpha=0.8)
    right.scatter(x_test[:, 0], x_test[:, 1], c=y_test, cmap="Set1", s=10,
                  edgecolors="k", linewidths=0.3)
    right.set(title=f"decision regions, test accuracy {test_accuracy:.1%}", aspect="equal")
    fig.tight_layout()
    fig.savefig(args.out / "classifier_loss.png", dpi=120)
    print(f"test accuracy {test_accuracy:.1%}; wrote {args.out / 'classifier_loss.png'} and "
          f"{args.out / 'classifier.npz'}")
    return test_accuracy


if __name__ == "__main__":
    main()

"""A small CNN on real data: scikit-learn's bundled handwritten digits (``load_digits``:
1,797 images of 8x8 pixels, no download), trained with Adam on minibatches to at least
97% test accuracy, in two ways:

- **eager**: each step records the loss on a fresh WengertList and sweeps it backward
  (``loss.derivatives()``);
- **replayed**: the loss by the parameters is recorded once (``ad.record``) and every
  step replays that program (``value_and_gradient``) on the next batch; Adam then
  updates the parameters from the replayed gradients.

Both start from the same weights and see the same batches (``ad.data.DataLoader``,
shuffled from a seed). A tqdm bar shows the loss and
the test accuracy; the figure (matplotlib, Agg backend) has the loss per step and the test
accuracy per epoch of both. A full run exits non-zero if a mode misses the accuracy target.

    python examples/digits_cnn.py [--mode both|eager|replayed] [--epochs 20] [--out DIR]
                                  [--dtype float32|float64] [--quick]

Why one BLAS thread (``--blas-threads 1``): every product here is small (at most 32x144 by
144x1024), and a second OpenBLAS thread on a busy 2-core machine waits for a core more
than it computes: the 16->32 convolution measured 10-15 ms with two threads against
0.1-0.4 ms with one, and a whole epoch 1.5 s against 0.4 s.
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import matplotlib
import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

import easyad as ad
from easyad import nn, optim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

TARGET = 0.97          # test accuracy a full run must reach, in each mode
CLASSES = 10


def load(dtype: type, seed: int) -> tuple[np.ndarray, ...]:
    """The digits as (N, 1, 8, 8) in [0, 1], split 80/20 by a seeded permutation; the
    labels as integers and one-hot."""
    from sklearn.datasets import load_digits     # bundled with scikit-learn: no download
    digits = load_digits()
    x = (digits.images / 16.0).astype(dtype)[:, None]
    y = digits.target
    order = np.random.default_rng(seed).permutation(len(x))
    train, test = order[:int(0.8 * len(x))], order[int(0.8 * len(x)):]
    return x[train], y[train], x[test], y[test]


def make_model(dtype: type, seed: int) -> nn.Module:
    ad.random.seed(seed)                           # the same initial weights in every mode
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),   # 8 -> 4
        nn.Conv2d(16, 32, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),  # 4 -> 2
        nn.Flatten(), nn.Linear(32 * 2 * 2, CLASSES, dtype=dtype))


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(model(x).value.argmax(axis=1) == y))     # no list: inference


def train(mode: str, data: tuple[np.ndarray, ...], args: argparse.Namespace
          ) -> dict[str, object]:
    x_train, y_train, x_test, y_test = data
    dtype = x_train.dtype.type
    # one-hot targets in both modes, so both differentiate the same expression: a replayed
    # program takes float inputs (integer labels would be part of the recording)
    onehot = np.eye(CLASSES, dtype=dtype)[y_train]
    model = make_model(dtype, args.seed)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    schedule = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    named = dict(model.named_parameters())
    # the same batches in every mode (the order is a function of the seed and the epoch);
    # whole batches only: a replayed program keeps the shapes it was recorded with
    loader = ad.data.DataLoader(x_train, onehot, batch_size=args.batch, shuffle=True,
                                seed=args.seed, drop_last=True)
    batches = min(len(loader), 4) if args.quick else len(loader)

    started = time.perf_counter()
    step = None
    if mode == "replayed":
        def loss_of(params: dict, x: np.ndarray, target: np.ndarray) -> object:
            return nn.cross_entropy(nn.functional_call(model, params, x), target)
        step = ad.record(loss_of, {k: p.data for k, p in named.items()},
                         x_train[:args.batch], onehot[:args.batch])

    losses: list[float] = []
    accuracies: list[float] = []
    stepping = first = 0.0   # the first step (with the recording) apart from the rest
    bar = tqdm(total=args.epochs * batches, desc=f"digits {mode}", unit="step")
    for _epoch in range(args.epochs):
        for i, (xb, tb) in enumerate(loader):
            if i == batches:
                break
            begun = time.perf_counter()
            if step is None:
                lst = ad.WengertList()
                loss = nn.cross_entropy(model(xb, tape=lst), tb)
                opt.step(loss.derivatives())
                losses.append(loss.number)
            else:
                value, grads = step.value_and_gradient(
                    {k: p.data for k, p in named.items()}, xb, tb)
                opt.step([grads[k] for k in named])
                losses.append(float(value))
            if len(losses) == 1:        # replayed: the recording and its compilation
                first = time.perf_counter() - started
            else:
                stepping += time.perf_counter() - begun
            bar.update()
        schedule.step()
        accuracies.append(accuracy(model, x_test, y_test))
        bar.set_postfix(loss=f"{np.mean(losses[-batches:]):.3f}", test=f"{accuracies[-1]:.3f}")
    bar.close()
    seconds = time.perf_counter() - started
    return {"losses": losses, "accuracies": accuracies, "seconds": seconds,
            "first_ms": 1e3 * first, "step_ms": 1e3 * stepping / max(1, len(losses) - 1),
            "parameters": {k: p.data.copy() for k, p in named.items()}}


def plot(results: dict[str, dict], path: pathlib.Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, r in results.items():      # replayed dashed: the two curves nearly coincide
        ls = "--" if mode == "replayed" else "-"
        left.plot(r["losses"], lw=0.8, ls=ls, label=mode)
        right.plot(np.arange(1, len(r["accuracies"]) + 1), r["accuracies"], marker="o",
                   ls=ls, label=f"{mode}: {r['accuracies'][-1]:.1%}")
    left.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="training loss")
    right.axhline(TARGET, color="grey", ls="--", lw=0.8)
    right.set(xlabel="epoch", ylabel="accuracy", title="test accuracy (360 digits)")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("both", "eager", "replayed"), default="both")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="folder of the figure (default: a new temporary folder)")
    parser.add_argument("--quick", action="store_true",
                        help="one epoch of four steps (for the tests; no accuracy target)")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 1
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="easyad-digits-"))
    data = load(np.dtype(args.dtype).type, args.seed)
    modes = ("eager", "replayed") if args.mode == "both" else (args.mode,)
    with threadpool_limits(args.blas_threads):
        results = {mode: train(mode, data, args) for mode in modes}

    for mode, r in results.items():
        print(f"{mode:>8}: test accuracy {r['accuracies'][-1]:.1%} after {args.epochs} "
              f"epochs, {r['seconds']:.1f} s in all; first step {r['first_ms']:.0f} ms, then "
              f"{r['step_ms']:.2f} ms per step")
    if len(results) == 2:
        e, r = results["eager"], results["replayed"]
        gap = max(float(np.max(np.abs(e["parameters"][k] - r["parameters"][k])))
                  for k in e["parameters"])
        print(f"replayed steps took {r['step_ms'] / e['step_ms']:.2f}x the eager ones; "
              f"first loss {e['losses'][0]:.6f} eager, {r['losses'][0]:.6f} replayed; "
              f"final parameters differ by at most {gap:.1e}")
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "digits_cnn.png")
    print(f"wrote {out / 'digits_cnn.png'}")
    missed = [m for m, r in results.items() if r["accuracies"][-1] < TARGET]
    if missed and not args.quick:
        raise SystemExit(f"digits_cnn: {', '.join(missed)} missed the {TARGET:.0%} test "
                         f"accuracy target")
    return results


if __name__ == "__main__":
    main()

"""The Hessian of an MLP loss with respect to all its parameters, against torch.func.

Issue 14's acceptance check: Sequential(Linear(784, 32), Tanh, Linear(32, 10)) with
softmax cross-entropy on a batch of 16, float64; ``ad.hessian`` of the loss as a function
of the parameter dict (``ad.nn.functional_call``) against ``torch.func.hessian`` of the
same loss (``torch.func.functional_call``), block by block. 25,450 parameters: each
Hessian is 648 million numbers (5.2 GB), so this is a script (minutes, ~16 GB of memory),
not a test; tests/test_transforms_torch.py checks the same on a small MLP.

    python benchmarks/validate_mlp_hessian.py [--hidden 32] [--batch 16]
"""
from __future__ import annotations

import argparse
import gc
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=784)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    a = parser.parse_args()

    import torch
    from torch import func as tf

    import easyad as ad

    rng = np.random.default_rng(14)
    model = ad.nn.Sequential(ad.nn.Linear(a.inputs, a.hidden, generator=1), ad.nn.Tanh(),
                             ad.nn.Linear(a.hidden, a.classes, generator=2))
    params = {k: p.data for k, p in model.named_parameters()}
    X = rng.normal(size=(a.batch, a.inputs))
    labels = rng.integers(0, a.classes, size=a.batch)
    count = sum(p.size for p in params.values())

    def ours(p):
        return ad.nn.cross_entropy(ad.nn.functional_call(model, p, X), labels)

    reference = torch.nn.Sequential(torch.nn.Linear(a.inputs, a.hidden), torch.nn.Tanh(),
                                    torch.nn.Linear(a.hidden, a.classes)).double()
    names = dict(zip(params, (n for n, _ in reference.named_parameters())))
    tX, tlabels = torch.tensor(X), torch.tensor(labels)

    def theirs(p):
        out = tf.functional_call(reference, {names[k]: v for k, v in p.items()}, (tX,))
        return torch.nn.functional.cross_entropy(out, tlabels)

    tp = {k: torch.tensor(v) for k, v in params.items()}
    print(f"MLP {a.inputs}-{a.hidden}-{a.classes}, batch {a.batch}: {count} parameters, "
          f"Hessian {count}^2 = {count * count / 1e6:.0f} million entries")
    start = time.perf_counter()
    H_torch = tf.hessian(theirs)(tp)
    t_torch = time.perf_counter() - start
    print(f"torch.func.hessian: {t_torch:.1f} s")
    start = time.perf_counter()
    H_ours = ad.hessian(ours)(params)
    t_ours = time.perf_counter() - start
    print(f"ad.hessian:         {t_ours:.1f} s")
    worst, scale = 0.0, 0.0
    for i in params:
        for j in params:
            mine, ref = H_ours[i][j], H_torch[i][j].numpy()
            assert mine.shape == ref.shape, (i, j, mine.shape, ref.shape)
            mine, ref = mine.reshape(-1), ref.reshape(-1)
            step = 1 << 22                           # in slices: a block is up to 5 GB
            for k in range(0, mine.size, step):
                worst = max(worst, float(np.max(np.abs(mine[k:k + step] - ref[k:k + step]))))
                scale = max(scale, float(np.max(np.abs(ref[k:k + step]))))
            del mine, ref
            H_ours[i][j] = H_torch[i][j] = None
            gc.collect()
    print(f"max |ours - torch| = {worst:.3g} (largest entry {scale:.3g}); "
          f"{'MATCH' if worst <= 1e-10 * max(1.0, scale) else 'MISMATCH'} at 1e-10")


if __name__ == "__main__":
    main()

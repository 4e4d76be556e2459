"""A replayed program with cumprod and prod, before and after their fused C lowering
(``compiler/program/table_c.py``), and torch.

    python benchmarks/products_replayed.py [rounds]

The model: a defaultable bond's price from n periods' hazard rates h (a point), with
survival probabilities S = cumprod(1 - h), discount factors D and cash flows c:
``sum(c * D * S) + R * sum(D * (S_prev - S))`` (the recovery R paid in the period of
default, S_prev the survival to the period's start) plus the final survival prod(1 - h).
Timed: the gradient at one point (``value_and_gradient``), and at B = 1000 points
(``value_and_gradient`` of a batch), and torch's batched autograd (the model on rows).
"before" is this checkout with the lowering switched off (``table_c.lower`` returning
nothing: each op a Python step between the C segments, and a batch one replay per point,
as before the lowering); "after" as it is. Medians of
wall time over interleaved rounds, one thread (torch too).
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import easyad as ad
from easyad.compiler.program import table_c

B = 1000


def model(n: int):
    rng = np.random.default_rng(n)
    c = np.full(n, 0.05 / 4)
    c[-1] += 1.0
    D = np.exp(-0.03 * np.arange(1, n + 1) / 4)
    R = 0.4

    def f(h):
        S = ad.cumprod(1.0 - h)
        S_prev = ad.concatenate([np.ones(1), S[:-1]])
        return ad.sum(c * D * S) + R * ad.sum(D * (S_prev - S)) + ad.prod(1.0 - h)
    h = rng.uniform(0.001, 0.02, size=n)
    H = rng.uniform(0.001, 0.02, size=(B, n))
    return f, h, H, (c, D, R)


def torch_batch(n: int, consts):
    """torch's gradients at every point: the model over a batch of rows (cumprod along
    axis 1) and one backward (the rows are independent; torch.func.vmap of grad took
    13.7 s at n = 1000: its cumprod backward has no batching rule)."""
    import torch
    torch.set_num_threads(1)
    c, D, R = (torch.tensor(a) if isinstance(a, np.ndarray) else a for a in consts)

    def run(H):
        h = H.detach().requires_grad_(True)
        S = torch.cumprod(1.0 - h, 1)
        S_prev = torch.cat([torch.ones(h.shape[0], 1, dtype=h.dtype), S[:, :-1]], 1)
        v = (c * D * S).sum(1) + R * (D * (S_prev - S)).sum(1) + torch.prod(1.0 - h, 1)
        (g,) = torch.autograd.grad(v.sum(), h)
        return v.detach(), g
    return run


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cells(before, after, h, H, tb, tH, rounds: int) -> dict[str, float]:
    """Median seconds of each cell, the cells interleaved in each round."""
    calls = {"one before": (lambda: before.value_and_gradient(h), 200),
             "one after": (lambda: after.value_and_gradient(h), 200),
             "batch before": (lambda: before.value_and_gradient(H), 1),
             "batch after": (lambda: after.value_and_gradient(H), 5),
             "torch": (lambda: tb(tH), 5)}
    cells: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, (fn, repeats) in calls.items():
            cells[k].append(timed(fn, repeats))
    return {k: statistics.median(v) for k, v in cells.items()}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    lower = table_c.lower
    rows = []
    for n in (100, 1000):
        f, h, H, consts = model(n)
        table_c.lower = lambda plan: {}          # before: no lowering
        before = ad.record(f, h, tensor=True)
        before.value_and_gradient(h)
        table_c.lower = lower
        after = ad.record(f, h, tensor=True)
        after.value_and_gradient(h)
        assert after._bound["gradient"].batchable()
        vb, gb = before.value_and_gradient(H[:50])
        va, ga = after.value_and_gradient(H[:50])
        np.testing.assert_allclose(ga, gb, rtol=1e-13, atol=1e-15)
        tb = torch_batch(n, consts)
        import torch
        tH = torch.tensor(H)
        np.testing.assert_allclose(after.value_and_gradient(H)[1], tb(tH)[1].numpy(),
                                   rtol=1e-12, atol=1e-15)
        rows.append((n, _cells(before, after, h, H, tb, tH, rounds)))
    print(f"| n | one point before (us) | after (us) | B={B} before (ms) | after (ms) | "
          "speed-up | torch batched (ms) | after/torch |")
    print("|---|---|---|---|---|---|---|---|")
    for n, m in rows:
        print(f"| {n} | {m['one before'] * 1e6:.1f} | {m['one after'] * 1e6:.1f} | "
              f"{m['batch before'] * 1e3:.1f} | {m['batch after'] * 1e3:.2f} | "
              f"{m['batch before'] / m['batch after']:.0f}x | {m['torch'] * 1e3:.2f} | "
              f"{m['batch after'] / m['torch']:.2f}x |")


if __name__ == "__main__":
    main()

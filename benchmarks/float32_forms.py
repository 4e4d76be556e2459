"""The rule table's float32 forms in the replayed MLP step, paired in one process: the
same float32 step (784-128-10, tanh, softmax cross-entropy, ``sgd_step``, batch 64) built
twice, with the float32 forms (tanh in float: tanhf, its slope from one expf) and without
(``compiler.program.float32.FORMS`` emptied before recording: tanh and its slope in double,
as before), timed in alternating windows of the process's CPU time on one core, so load
from other processes affects both sides alike.

    python benchmarks/float32_forms.py --rounds 30 --pin 0
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import easyad as ad  # noqa: E402
from easyad import nn  # noqa: E402
from easyad.compiler.program import float32  # noqa: E402

SIZES, BATCH, LR = (784, 128, 10), 64, 0.01


def step(forms: bool, seed: int = 0):
    """A prepared sgd_step on its own model (FORMS emptied while it records if not forms)."""
    ad.random.seed(seed)
    model = nn.Sequential(nn.Linear(SIZES[0], SIZES[1], dtype=np.float32), nn.Tanh(),
                          nn.Linear(SIZES[1], SIZES[2], dtype=np.float32))
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[2], BATCH)
    named = dict(model.named_parameters())

    def loss(params, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, params, x), y)
    kept = float32.FORMS
    if not forms:
        float32.FORMS = {}
    try:
        F = ad.record(loss, {k: p.data for k, p in named.items()}, x, y)
        F.sgd_step(named, x, y, lr=LR)
    finally:
        float32.FORMS = kept
    return lambda: F.sgd_step(named, x, y, lr=LR)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--pin", type=int, default=None)
    args = ap.parse_args()
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    sides = {"float32 forms": step(True), "in double (before)": step(False)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    rng = np.random.default_rng(0)
    for _ in range(args.rounds):
        for name in rng.permutation(list(sides)):
            f = sides[name]
            start = time.process_time()
            for _ in range(args.calls):
                f()
            times[name].append((time.process_time() - start) / args.calls * 1e6)
    ratios = [a / b for a, b in zip(times["float32 forms"], times["in double (before)"])]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.calls} calls")
    for name, t in times.items():
        q = statistics.quantiles(t, n=4)
        print(f"{name}: CPU {statistics.median(t):.1f} us per step ({q[0]:.1f}-{q[2]:.1f})")
    q = statistics.quantiles(ratios, n=4)
    print(f"forms / before: {statistics.median(ratios):.3f}x ({q[0]:.3f}-{q[2]:.3f})")


if __name__ == "__main__":
    main()

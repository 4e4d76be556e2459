"""Eager value and gradient of prod and cumprod: this checkout against another one (the
older pairwise composition) and torch, interleaved.

    python benchmarks/products_eager.py /path/to/other/checkout [rounds]

Each round runs a child per checkout (PYTHONPATH set to it), in turn; a child times each
case (``sum(w * f(x))`` then its gradient: easyad on a fresh WengertList per call, torch
on a leaf made once with its ``.grad`` cleared) in CPU time, the median over repeats, and
the table shows per case the median over rounds in microseconds, and the ratios.
Torch is timed in this checkout's children (its thread count set to 1, as easyad's
numpy is single-threaded here).
"""
from __future__ import annotations

import ast
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CASES = [("prod", None, (1000,)), ("prod", None, (100000,)),
         ("prod", 1, (10, 100)), ("prod", 1, (100, 1000)),
         ("cumprod", None, (1000,)), ("cumprod", None, (100000,)),
         ("cumprod", 1, (10, 100)), ("cumprod", 1, (100, 1000))]


def _repeats(size: int) -> int:
    return 200 if size <= 1000 else 20


def _easyad_step(name: str, axis: int | None, x: Any, w: Any) -> Callable[[], None]:
    import easyad as ad
    f = getattr(ad, name)

    def step() -> None:
        t = ad.Tensor.variable(x, ad.WengertList())
        ad.sum(f(t, axis=axis) * w).derivatives()
    return step


def _torch_step(name: str, axis: int | None, x: Any, w: Any) -> Callable[[], None]:
    import torch
    torch.set_num_threads(1)
    tx, tw, f = torch.tensor(x, requires_grad=True), torch.tensor(w), getattr(torch, name)

    def step() -> None:
        tx.grad = None
        if axis is None:
            y = f(tx) if name == "prod" else f(tx.reshape(-1), 0)
        else:
            y = f(tx, axis)
        (y * tw).sum().backward()
    return step


def child(with_torch: bool) -> None:
    import numpy as np

    out = {}
    for name, axis, shape in CASES:
        rng = np.random.default_rng(0)
        x = rng.uniform(0.9, 1.1, size=shape)        # products stay near 1: no overflow
        w = rng.normal(size=np.shape(getattr(np, name)(x, axis=axis)))
        label = f"{name} axis={axis} {'x'.join(map(str, shape))}"
        repeats = _repeats(math.prod(shape))
        out[f"easyad {label}"] = _median(_easyad_step(name, axis, x, w), repeats)
        if with_torch:
            out[f"torch {label}"] = _median(_torch_step(name, axis, x, w), repeats)
    print(repr(out))


def _median(step, repeats: int) -> float:
    step()                                           # the first call builds what it needs
    times = []
    for _ in range(repeats):
        start = time.process_time_ns()
        step()
        times.append((time.process_time_ns() - start) / 1e3)
    return statistics.median(times)


def main() -> None:
    here = str(pathlib.Path(__file__).resolve().parent.parent)
    other = str(pathlib.Path(sys.argv[1]).resolve())
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    found: dict[str, list[dict[str, float]]] = {here: [], other: []}
    for _ in range(rounds):
        for tree in (other, here):
            env = dict(os.environ, PYTHONPATH=tree)
            args = [sys.executable, __file__, "--child"] + (["torch"] if tree == here else [])
            text = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True,
                                  check=True).stdout
            found[tree].append(ast.literal_eval(text.strip().splitlines()[-1]))
    print("| case | torch us | new us | old us | new/torch | old/torch | old/new |")
    print("|---|---|---|---|---|---|---|")
    for name, axis, shape in CASES:
        label = f"{name} axis={axis} {'x'.join(map(str, shape))}"
        new = statistics.median(r[f"easyad {label}"] for r in found[here])
        old = statistics.median(r[f"easyad {label}"] for r in found[other])
        ref = statistics.median(r[f"torch {label}"] for r in found[here])
        print(f"| {label} | {ref:.0f} | {new:.0f} | {old:.0f} | {new / ref:.1f} | "
              f"{old / ref:.1f} | {old / new:.1f} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:3] == ["torch"])
    else:
        main()

"""The fused C and OpenCL sources of recorded programs that use each structural op
(reshape, transpose, sum, mean, where, max/min, getitem, matmul): value, gradient and HVP
programs, on numpy and the first OpenCL device, written to one file. Run it in two
checkouts and diff the files: moving an op into the op table must leave them byte for
byte the same (its composite records the primitives the old code did).

    python benchmarks/structural_fused_sources.py OUT.txt
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np

import easyad as ad

X = np.random.default_rng(0).normal(size=(3, 4))
W = np.arange(12.0).reshape(4, 3)

PROGRAMS = {
    "reshape": lambda t: ad.sum(ad.sin(t.reshape(4, 3)) * W),
    "transpose": lambda t: ad.sum(ad.sin(t.T) * W),
    "transpose3": lambda t: ad.sum(ad.sin(t.reshape(3, 2, 2).transpose(2, 0, 1))),
    "sum": lambda t: ad.sum(ad.sin(t.sum(axis=0)) * 2.0) + ad.sum(
        ad.exp(t).sum(axis=1, keepdims=True)),
    "mean": lambda t: ad.sum(ad.sin(t.mean(axis=(0, 1), keepdims=True))) + t.mean(),
    "where": lambda t: ad.sum(ad.where(t > 0, ad.sin(t), t * t)),
    "max": lambda t: ad.sum(ad.sin(t.max(axis=1))) + ad.exp(t).min(),
    "getitem": lambda t: ad.sum(ad.sin(t[1:3, ::2])) + ad.sum(t[[0, 2], 1]),
    "matmul": lambda t: ad.sum(ad.sin(t @ t.T)),
}


def main(path: str) -> None:
    devices = ["numpy"] + [d.name for d in ad.devices() if d.kind == "opencl"][:1]
    out = []
    for name, f in PROGRAMS.items():
        for device in devices:
            T = ad.record(f, X, tensor=True, device=device)
            T(X), T.gradient(X), T.hessian(X)      # each program is built when first used
            for key in sorted(T._bound):
                source = str(getattr(T._bound[key], "source", None))
                out.append(f"==== {name} {device} {key}\n{source}\n")
                print(name, device, key, hashlib.sha1(source.encode()).hexdigest()[:10])
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))


if __name__ == "__main__":
    main(sys.argv[1])

"""Eager scaled_dot_product_attention, forward and forward+backward: easyad against torch
on the CPU with the same number of threads, interleaved (as benchmarks/conv.py).

    python benchmarks/attention.py [--threads 1] [--rounds 9] [--dtype float32] [--causal]

The case of issue 28: sequence 128, d 64, batch 32 x 8 heads (as benchmarks/gpu_layers.py):
q, k, v of shape (32, 8, 128, 64). easyad: ``nn.functional.scaled_dot_product_attention``
on constant tensors (forward) or on a fresh WengertList per call, then the derivatives of
``sum(out * g)`` for q, k and v; torch: ``torch.nn.functional.scaled_dot_product_attention``
(its CPU kernel, fused where torch has one), leaves made once, ``.grad`` cleared. Each
round times every (case, library) pair once, in turn; the table gives medians and
quartiles in ms and the ratio of medians (easyad / torch). The thread count is set for
both before numpy is imported; the load average is printed (a shared machine's figures
move by tens of percent between runs).
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    _args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _args.add_argument("--threads", type=int, default=1)
    _args.add_argument("--rounds", type=int, default=9)
    _args.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    _args.add_argument("--causal", action="store_true", help="is_causal=True")
    ARGS = _args.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)        # before numpy starts its BLAS

import numpy as np  # noqa: E402

import _interleaved  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

SHAPE = (32, 8, 128, 64)


def _cases(dtype: str, causal: bool) -> dict[str, dict[str, object]]:
    import torch
    import torch.nn.functional as TF

    import easyad as ad
    from easyad import nn

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.normal(size=SHAPE).astype(dtype) for _ in range(4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tg = torch.tensor(g)
    cq, ck, cv = (ad.Tensor.constant(a) for a in (q, k, v))
    attend = nn.functional.scaled_dot_product_attention

    def ours() -> None:
        attend(cq, ck, cv, is_causal=causal)

    def ours_grad() -> None:
        lst = ad.WengertList()
        Q, K, V = (ad.Tensor.variable(a, lst) for a in (q, k, v))
        ad.sum(attend(Q, K, V, is_causal=causal) * g).derivatives()

    def theirs() -> None:
        with torch.no_grad():
            TF.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def theirs_grad() -> None:
        for t in (tq, tk, tv):
            t.grad = None
        TF.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tg)

    return {"attention forward": {"easyad": ours, "torch": theirs},
            "attention forward+backward": {"easyad": ours_grad, "torch": theirs_grad}}


def main() -> None:
    import torch
    torch.set_num_threads(ARGS.threads)
    cases = _cases(ARGS.dtype, ARGS.causal)
    times = _interleaved.measure(cases, ARGS.rounds)
    print(f"q, k, v {SHAPE} (batch, heads, sequence, d), {ARGS.dtype}, "
          f"{'causal, ' if ARGS.causal else ''}{ARGS.threads} thread(s), {ARGS.rounds} "
          f"rounds; {_interleaved.load()}; torch {torch.__version__}, "
          f"numpy {np.__version__}\n")
    print("\n".join(_interleaved.easyad_vs_torch(cases, times)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

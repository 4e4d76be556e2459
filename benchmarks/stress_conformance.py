"""Stress: the conformance suite's checks (tests/_conformance.py) on many more points.

The test suite (tests/test_conformance.py) runs every row of the rule table through every
engine at ~35-180 points per row, one seed, and the selections on one 16 x 8 point. This
sweep repeats it for several seeds with many more ordinary points per row, and the
selections (sum, amax/amin, maximum/minimum, where, abs over exp values with ties and
near-ties) at shapes whose rows do not fill a vector (remainders), in float64 and
float32, on numpy and on every working OpenCL device (TraceTensor on OpenCL too, which
the tests leave out for time). It prints every disagreement and
exits 1 if there is one (the known ones of tests/_conformance.py are left out there too).

    python benchmarks/stress_conformance.py                      # 3 seeds, ~5-10 min
    python benchmarks/stress_conformance.py --seeds 1 --ordinary 64 --no-opencl
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402

import easyad as ad  # noqa: E402
from easyad import _rules  # noqa: E402

import _conformance as c  # noqa: E402


def sweep_rules(seed: int, ordinary: int, devices: list[str]) -> list[str]:
    table = {r.name: c.samples(r, seed=seed, ordinary=ordinary)
             for r in _rules.DIFFERENTIATED_RULES}
    lines: list[str] = []
    scalar = {r.name: {"Trace": c.scalar_engine("trace")(r, table[r.name]),
                       "Record": c.scalar_engine("record")(r, table[r.name]),
                       "VM": c.replay_engine(False)(r, table[r.name]),
                       "compiled": c.replay_engine(True)(r, table[r.name])}
              for r in _rules.DIFFERENTIATED_RULES}
    for r in _rules.DIFFERENTIATED_RULES:
        lines += c.check_scalar(r, table[r.name], scalar[r.name])
        lines += c.check_derivatives(r, table[r.name], scalar[r.name]["Trace"])
    for dtype in (np.float64, np.float32):
        engines = {"eager": c.eager_tensors(table, "numpy", dtype),
                   "eager strided": c.eager_tensors(table, "numpy", dtype, "strided"),
                   "TraceTensor": c.trace_tensors(table, "numpy", dtype),
                   "fused C": c.recorded_tensors(table, "numpy", dtype, True, "big-endian"),
                   "unfused replay": c.recorded_tensors(table, "numpy", dtype, False)}
        for device in devices:
            engines[f"eager {device}"] = c.eager_tensors(table, device, dtype)
            engines[f"TraceTensor {device}"] = c.trace_tensors(table, device, dtype)
            engines[f"fused {device}"] = c.recorded_tensors(table, device, dtype, True)
        for r in _rules.DIFFERENTIATED_RULES:
            lines += c.check_tensor(r, table[r.name], dtype,
                                    {e: res[r.name] for e, res in engines.items()},
                                    scalar[r.name]["Trace"], "eager")
    return lines


def sweep_selections(seed: int, devices: list[str]) -> list[str]:
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    for rows, cols in ((16, 8), (12, 13), (33, 9), (12, 67)):   # rows >= 12, cols >= 8
        x = c.selection_points(rng, rows, cols)
        for dtype in (np.float64, np.float32):
            engines = c.selection_engines(x * 0.5, "numpy", dtype)
            for device in devices:
                for name, run in c.selection_engines(x * 0.5, device, dtype).items():
                    if name != "unfused":
                        engines[f"{name} {device}"] = run
            found = c.check_selections(x, engines, rtol=c.RTOL[np.dtype(dtype)])
            lines += [f"[{rows}x{cols} {np.dtype(dtype)}] {line}" for line in found]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ordinary", type=int, default=256,
                        help="ordinary points per rule (the tests take 12)")
    parser.add_argument("--no-opencl", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ad.KernelFallbackWarning)
    devices = [] if args.no_opencl else [d.name for d in ad.devices() if d.kind == "opencl"]
    print(f"rules: {len(_rules.DIFFERENTIATED_RULES)}, seeds: {args.seeds}, ordinary points: "
          f"{args.ordinary}, OpenCL devices: {devices or 'none'}", flush=True)
    problems = 0
    with np.errstate(all="ignore"):
        for seed in range(100, 100 + args.seeds):
            start = time.perf_counter()
            lines = sweep_rules(seed, args.ordinary, devices) + sweep_selections(seed, devices)
            for line in lines:
                print(line)
            problems += len(lines)
            print(f"seed {seed}: {len(lines)} disagreements "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""The timing loop of the print-only layer benchmarks (conv.py, attention.py,
recurrent.py): every (case, library) callable once per round, in turn, so a load that
comes and goes reaches all of them alike; wall times kept per round."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable


def measure(cases: dict[str, dict[str, Callable[[], object]]], rounds: int
            ) -> dict[tuple[str, str], list[float]]:
    """Seconds per call of every (case, library), one call each per round, after one
    warm-up call each (imports, first allocations, jit)."""
    for fns in cases.values():
        for fn in fns.values():
            fn()
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for case, fns in cases.items():
            for lib, fn in fns.items():
                start = time.perf_counter()
                fn()
                times.setdefault((case, lib), []).append(time.perf_counter() - start)
    return times


def cell(seconds: list[float]) -> tuple[str, float]:
    """("q1, **median**, q3" in ms, the median in ms)."""
    q1, med, q3 = statistics.quantiles([1e3 * t for t in seconds], n=4)
    return f"{q1:.1f}, **{med:.1f}**, {q3:.1f}", med


def load() -> str:
    """The load average and core count, for the header line."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


def easyad_vs_torch(cases: dict[str, dict[str, Callable[[], object]]],
                    times: dict[tuple[str, str], list[float]]) -> list[str]:
    """The markdown table of easyad against torch, case by case, with the ratio of the
    medians."""
    lines = ["| case | easyad ms (q1, median, q3) | torch ms (q1, median, q3) | ratio |",
             "|---|---|---|---|"]
    for case in cases:
        (ours, a), (theirs, b) = cell(times[(case, "easyad")]), cell(times[(case, "torch")])
        lines.append(f"| {case} | {ours} | {theirs} | {a / b:.2f} |")
    return lines


def median(call: Callable[[], object], rounds: int) -> float:
    """The median seconds of ``rounds`` calls of one variant in a row, after one warm-up
    call: for variants that cannot take turns in one loop (the batch scripts switch
    easyad's batched path off between them)."""
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

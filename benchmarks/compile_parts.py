"""What two of ``F.compile()``'s choices cost, each against its alternative in one process,
interleaved round by round (a loaded machine shifts both alike); CPU seconds of the
process and its children (gcc's), a fresh cache for every compile; prints medians and
quartiles, writes nothing.

- ``link``: Rosenbrock's gradient at n = 10 compiled with session 15's link (``-lm``) and
  the whole ``_helpers.h``, with the link of ``library._LINK`` (-nostdlib on Linux), and
  with that link and only the helpers the program reaches (``prelude._used_helpers``);
  CasADi's JIT build with the same gcc flags (``bench_replay._jit``) in the same rounds.
- ``fusion``: the same gradient rendered with each loop on its own (``fusion.MOST = 1``,
  as before session 17), with consecutive loops of one trip count fused
  (``compiler/tape/fusion.py``: the reverse sweep's from ``REVERSE_FROM`` iterations on)
  and with every reverse loop fused too, against CasADi's JIT build, in the same rounds.
- ``calls``: the bound gradient's time per call (``F.bind_gradient(x, g)``, CPU) at n =
  10, 100, 1000 and 10^4 with each loop alone and fused, and CasADi's JIT buffer call,
  interleaved (--n is ignored; the gradients of the two easyad builds agree bit for bit).
- ``hvp``: ``F.compile(hessian=True)`` of Rosenbrock (n = 10) with the HVP through step
  calls and row tables (``INLINE_HVP = 0``) and as configured (entry by entry when
  small): the compile's CPU seconds and ``F.hvp(x, v)``'s time per call (2,000 calls a
  round); both HVPs agree bit for bit.

    python benchmarks/compile_parts.py [--rounds 25] [--n 10] [link|fusion|calls|hvp ...]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_replay as b  # noqa: E402

import easyad as ad  # noqa: E402
from easyad.compiler.tape import fusion, library  # noqa: E402
from easyad.compiler.tape import prelude as P  # noqa: E402
from easyad.compiler.tape import second_order_renderer as sor  # noqa: E402


def _cpu() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _show(label: str, values: list[float], scale: float, unit: str) -> str:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{label} {median * scale:.3f} [{q1 * scale:.3f}, {q3 * scale:.3f}] {unit}"


def _fresh_compile(n: int, **options: bool) -> tuple[ad.Function, float]:
    os.environ["EASYAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="easyad-parts-")
    F = ad.record(b.rosenbrock, np.ones(n))
    start = _cpu()
    F.compile(**options)
    seconds = _cpu() - start
    if not F.compiled:
        raise RuntimeError("F.compile() found no working C compiler")
    return F, seconds


def _compiles(rounds: int, n: int, configs: dict, use: Callable[[Any], None],
              restore: Callable[[], None]) -> None:
    """F.compile() at n under each config (``use`` sets it; None: CasADi's JIT build),
    interleaved, the order reversed every other round; ``restore`` puts the defaults back."""
    ca = b._casadi()
    if ca is None:
        configs = {k: v for k, v in configs.items() if v is not None}
    entries = len(ad.record(b.rosenbrock, np.ones(n)))
    seconds: dict[str, list[float]] = {k: [] for k in configs}
    try:
        for r in range(rounds):
            for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
                if configs[name] is None:
                    start = _cpu()
                    b._casadi_function(ca, n, "gradient", b._jit(entries))
                    seconds[name].append(_cpu() - start)
                    continue
                use(configs[name])
                seconds[name].append(_fresh_compile(n)[1])
    finally:
        restore()
    print(f"F.compile() of Rosenbrock's gradient, n = {n}: CPU ms, median [q1, q3] over "
          f"{rounds} interleaved rounds")
    for name, values in seconds.items():
        print("  " + _show(f"{name:32s}", values, 1e3, "ms"))


def link(rounds: int, n: int) -> None:
    trimmed, fast = P._used_helpers, library._LINK

    def use(config: Any) -> None:
        library._LINK, P._used_helpers = config

    def restore() -> None:
        library._LINK, P._used_helpers = fast, trimmed
    _compiles(rounds, n, {"-lm, whole helpers": (("-lm",), lambda helpers, names: helpers),
                          "library._LINK": (fast, lambda helpers, names: helpers),
                          "library._LINK, trimmed helpers": (fast, trimmed),
                          "casadi JIT": None}, use, restore)


def fused(rounds: int, n: int) -> None:
    most, reverse = fusion.MOST, fusion.REVERSE_FROM

    def use(config: Any) -> None:
        fusion.MOST, fusion.REVERSE_FROM = config

    def restore() -> None:
        fusion.MOST, fusion.REVERSE_FROM = most, reverse
    _compiles(rounds, n, {"each loop alone": (1, reverse),
                          "fused, reverse loops < 16 apart": (most, 16),
                          f"fused, reverse from {reverse} (default)": (most, reverse),
                          "casadi JIT": None}, use, restore)


def calls(rounds: int, _n: int) -> None:
    ca = b._casadi()
    for n, count in ((10, 20000), (100, 20000), (1000, 3000), (10000, 300)):
        x = np.random.default_rng(n).uniform(-1, 1, n)
        bound = {}
        most = fusion.MOST
        try:
            for name, value in (("each loop alone", 1), ("fused", most)):
                fusion.MOST = value
                F = _fresh_compile(n)[0]
                g = np.empty(n)
                bound[name] = (F.bind_gradient(x.copy(), g), g)
        finally:
            fusion.MOST = most
        if ca is not None:
            F, _ = b._casadi_function(ca, n, "gradient", b._jit(len(ad.record(b.rosenbrock, x))))
            bound["casadi JIT buffer call"] = b._buffer_call(F, x)
        for call, _ in bound.values():
            call()
        first, second = (bound[k][1] for k in ("each loop alone", "fused"))
        assert first.tobytes() == second.tobytes(), "the two builds' gradients differ"
        times: dict[str, list[float]] = {k: [] for k in bound}
        for r in range(rounds):
            for name in (list(bound) if r % 2 == 0 else list(bound)[::-1]):
                call = bound[name][0]
                start = time.process_time()
                for _ in range(count):
                    call()
                times[name].append((time.process_time() - start) / count)
        print(f"bound gradient, n = {n}: CPU per call, median [q1, q3] over {rounds} "
              f"interleaved rounds of {count} calls")
        for name, values in times.items():
            print("  " + _show(f"{name:24s}", values, 1e9, "ns"))


def hvp(rounds: int, n: int) -> None:
    configured = sor.INLINE_HVP
    configs = {"steps + row tables": 0, f"INLINE_HVP = {configured}": configured}
    compiles: dict[str, list[float]] = {k: [] for k in configs}
    made = {}
    try:
        for r in range(max(3, rounds // 3)):
            for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
                sor.INLINE_HVP = configs[name]
                made[name], seconds = _fresh_compile(n, hessian=True)
                compiles[name].append(seconds)
    finally:
        sor.INLINE_HVP = configured
    rng = np.random.default_rng(0)
    x, v = rng.normal(size=n), rng.normal(size=n)
    first, second = (made[k].hvp(x, v) for k in configs)
    assert first.tobytes() == second.tobytes(), "the two HVPs differ"
    calls: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(rounds):
        for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
            F, count = made[name], 2000
            start = time.perf_counter()
            for _ in range(count):
                F.hvp(x, v)
            calls[name].append((time.perf_counter() - start) / count)
    print(f"Rosenbrock n = {n}, compile(hessian=True): F.hvp(x, v) per call and the "
          f"compile's CPU seconds, median [q1, q3], interleaved")
    for name in configs:
        print(f"  {name:20s} " + _show("F.hvp", calls[name], 1e6, "us") + "   "
              + _show("compile", compiles[name], 1.0, "s"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", default=["link", "fusion", "calls", "hvp"],
                        help="link, fusion, calls, hvp")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()
    parts = {"link": link, "fusion": fused, "calls": calls, "hvp": hvp}
    unknown = set(args.parts) - set(parts)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: choose from {', '.join(parts)}")
    for part in args.parts:
        parts[part](args.rounds, args.n)


if __name__ == "__main__":
    main()

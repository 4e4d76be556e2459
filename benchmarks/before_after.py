"""Before/after: easyad's own benchmark rows from two checkouts, run interleaved.

    python benchmarks/before_after.py BEFORE AFTER [--only core,replay] [--rounds N]
                                       [--quick] [--output FILE] [--opencl]

BEFORE and AFTER are each a checkout (a path whose ``easyad`` has its core built) or a
git commit of this repository. A commit is exported with ``git archive`` into
``$TMPDIR/easyad-before-after/<hash>`` and its core built there once
(``python setup.py -q build_ext --inplace``, with this interpreter: it needs Cython), then
reused by later runs; no git worktree is registered.

What runs: the benchmark modules of *this* checkout (``bench_core``, ``bench_replay``,
``bench_tensor_eager``, ``bench_tensor_replay``, ``bench_nn``), each in a subprocess
that imports the easyad of the checkout under test (its root first on ``PYTHONPATH``;
the child checks ``easyad.__file__``). The child gives ``run(ctx)`` a context whose
``measure()`` times only easyad's variants (a peer's, named ``torch``, ``jax``,
``casadi``..., is dropped; the plain-float and plain-numpy baselines stay, as controls
that show the machine's drift) and keeps the per-call median of each. So both sides run
the very same benchmark code, and peers cost nothing but their set-up (jax, autograd and
``ad`` are not even imported: ``UNIMPORTED``). A module that
needs a module easyad has since moved finds it under its old name (``MOVED`` below). If
the older easyad lacks an API a case uses, the child stops there and its cases are
reported "not in before" (with the error), not as a failure of the tool.

How: ``--rounds`` rounds; in each, every module runs once on each side, the two
subprocesses back to back, in the order A B in even rounds and B A in odd ones (A B B A
A B ...), so a load that rises or falls over the run reaches both sides alike. Each
subprocess is pinned to one CPU (``--cpu``) with BLAS and OpenMP on one thread. For each
case the per-round ratio after / before is formed from the two adjacent subprocesses;
the report gives its median and quartiles over rounds, and both sides' median times.

Verdict per case: **slower** when the median ratio exceeds 1 + ``--tolerance`` (0.05)
*and* the first quartile of the per-round ratios is above 1 (the middle half of the rounds
all saw after slower); **faster** the mirror image (median below 1 / (1 + tolerance),
third quartile below 1); otherwise "same" (the difference is within the noise). The
exit status is 1 when any easyad case is slower (controls are never flagged).

Sizes: the modules' ``--quick`` sizes (``ctx.quick``: elementwise chains of 10^6 values,
not 10^7), so that the default 4 rounds take 10-20 minutes; ``--full-sizes`` for the
full ones. ``--opencl`` keeps the OpenCL rows; by default the child hides OpenCL devices
(PoCL on a shared CPU is its own benchmark family, and the replay module's 10^6-point
OpenCL batch needs gigabytes). ``--quick`` runs 2 rounds of 5 windows of 5 ms, for the
test. Exit status: 0, 1 when a case is slower, 2 when a module measured nothing on a side.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODULES = {"core": "bench_core", "replay": "bench_replay", "eager": "bench_tensor_eager",
           "tensor_replay": "bench_tensor_replay", "nn": "bench_nn"}
# a variant whose name mentions one of these is a peer's, never timed here
PEERS = ("torch", "jax", "casadi", "autograd", "ad (pypi)", "pytorch")
# peers whose import the child refuses (their set-up is all they would cost: no easyad
# row depends on them); torch and casadi stay, bench_replay times easyad only with them
UNIMPORTED = ("jax", "jaxlib", "autograd", "ad")
# a variant with none of easyad's code on its path: shown as a control of the drift
CONTROLS = ("float, ", "numpy", "multiply", "divide")
# modules that moved since: new name -> old name (tried when the new one is missing)
MOVED = {"easyad.recorded.rows": "easyad.replay",
         "easyad.compiler.tape.library": "easyad._compile",
         "easyad.compiler.tape.render_cl": "easyad.tensor._replay_cl"}
# the locals of measure()'s caller that tell apart the cases of a module (n, dtype, ...):
# only those each module sets before every measure() (a loop variable set later in the
# loop body would carry over from the previous case)
CASE_LOCALS = {"core": (), "nn": (), "replay": ("what", "n", "B"),
               "eager": ("kind", "label", "dtype", "n"),
               "tensor_replay": ("kind", "bits", "n", "count")}
OTHER_LOCALS = ("what", "kind", "label", "bits", "dtype", "n", "count", "B")


# ---- statistics and the verdict (tests/test_before_after.py) ----

def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), inclusive method; one value: itself."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def round_ratios(before: list[float | None], after: list[float | None]) -> list[float]:
    """after / before of each round where both sides measured the case."""
    return [a / b for a, b in zip(after, before) if a is not None and b is not None and b > 0]


def verdict(ratios: list[float], tolerance: float = 0.05) -> str:
    """'slower', 'faster' or 'same' (see the module's docstring)."""
    if len(ratios) < 3:     # no quartiles worth the name
        return "n/a" if not ratios else "too few rounds"
    q1, median, q3 = quartiles(ratios)
    if median > 1 + tolerance and q1 > 1:
        return "slower"
    if median < 1 / (1 + tolerance) and q3 < 1:
        return "faster"
    return "same"


def is_peer(name: str) -> bool:
    lowered = name.lower()
    return any(peer in lowered for peer in PEERS)


def is_control(name: str) -> bool:
    variant = name.rsplit(" :: ", 1)[-1]
    return variant.startswith(CONTROLS)


# ---- the child: one module, one checkout ----

def _case_prefix(frame, names: tuple[str, ...]) -> str:
    """'n=100, dtype=float32' from the locals of the function that called measure()."""
    parts = []
    for key in names:
        value = frame.f_locals.get(key)
        if isinstance(value, type) and hasattr(value, "dtype"):    # np.float64 ...
            value = value.__name__
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _alias(new: str, old: str) -> None:
    """Make ``import new`` find module ``old`` when ``new`` does not exist (yet): the
    benchmark modules of this checkout name easyad's modules where they are now."""
    try:
        importlib.import_module(new)
        return
    except ImportError:
        pass
    try:
        module = importlib.import_module(old)
    except ImportError:
        return      # neither: the module's own import error will say so
    parts = new.split(".")
    for i in range(len(parts) - 1, 0, -1):    # the missing packages above it, empty
        name = ".".join(parts[:i])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
        parent = sys.modules[name]
        child = sys.modules.get(".".join(parts[:i + 1]), module)
        setattr(parent, parts[i], child)
    sys.modules[new] = module


class _Refuse:
    """A meta path finder that makes ``import jax`` (etc.) fail as if not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in UNIMPORTED:
            raise ModuleNotFoundError(f"{name}: not imported by before_after.py")
        return None


def _child(module_key: str, checkout: str, out: str, quick: bool, rounds: int,
           seconds: float, opencl: bool, verbose: bool, cpu: int, bench_dir: str) -> None:
    os.sched_setaffinity(0, {cpu})     # before numpy and easyad's pool count the cores
    sys.path.insert(0, str(HERE))      # run.py, the harness
    sys.path.insert(0, bench_dir)      # the benchmark modules (HERE unless a test's)
    # only the checkout's easyad: an editable install's finder would otherwise supply a
    # subpackage an older easyad lacks from the installed checkout, silently mixing two
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "editable" not in getattr(f, "__name__", type(f).__name__).lower()]
    sys.path[:] = [p for p in sys.path if not (Path(p or ".") / "easyad").is_dir()
                   or Path(p or ".").resolve() == Path(checkout).resolve()]
    sys.meta_path.insert(0, _Refuse())
    try:
        import easyad
    except Exception as error:     # the checkout's core not built, or broken
        Path(out).write_text(json.dumps({"cases": {}, "error": f"import easyad: {error!r}"}))
        return
    where = Path(easyad.__file__).resolve()
    if Path(checkout).resolve() not in where.parents:
        raise SystemExit(f"imported easyad from {where}, not from {checkout}: PYTHONPATH "
                         f"must put the checkout first")
    for new, old in MOVED.items():
        _alias(new, old)
    if not opencl:
        every = easyad.devices
        easyad.devices = lambda *a, **k: [d for d in every(*a, **k) if d.kind != "opencl"]
    import run as harness

    cases: dict[str, float] = {}      # the median over the inner rounds
    best: dict[str, float] = {}       # the minimum (--statistic min)

    class Ctx(harness.Context):
        def cold_cache(self):      # compile times are not compared here: keep the cache
            return contextlib.nullcontext(os.environ.get("EASYAD_CACHE_DIR"))

        def log(self, message: str) -> None:
            if verbose:
                super().log(message)

        def measure(self, variants, rounds=None, seconds=None):
            prefix = _case_prefix(sys._getframe(1),
                                  CASE_LOCALS.get(module_key, OTHER_LOCALS))
            kept = {name: fn for name, fn in variants.items() if not is_peer(name)}
            timings = super().measure(kept, None, seconds) if kept else None
            fill = [1.0] * self.rounds
            per_call = {name: (timings.per_call[name] if name in kept else
                               (timings.per_call[next(iter(kept))] if kept else fill))
                        for name in variants}
            for name in kept:
                key = f"{prefix} :: {name}" if prefix else name
                while key in cases:        # the same case again: number it
                    key += " (again)"
                cases[key] = statistics.median(timings.per_call[name])
                best[key] = min(timings.per_call[name])
            return harness.Timings(per_call, {}, self.rounds)

    ctx = Ctx(quick, rounds, seconds, 0)
    error = None
    try:
        importlib.import_module(MODULES.get(module_key, module_key)).run(ctx)
    except BaseException as raised:    # SystemExit too: a module refusing to time
        error = f"{type(raised).__name__}: {raised}"
    strays = sorted(name for name, module in list(sys.modules.items())
                    if name.startswith("easyad") and getattr(module, "__file__", None)
                    and Path(checkout).resolve() not in Path(module.__file__).resolve().parents)
    if strays:     # refuse figures from a mix of two easyads
        cases, best = {}, {}
        error = f"easyad modules from outside {checkout}: {', '.join(strays)}"
    Path(out).write_text(json.dumps({"cases": cases, "best": best, "error": error}))


# ---- the parent ----

def resolve(spec: str, python: str) -> tuple[Path, str]:
    """(checkout path, its commit or 'working tree') for a path or a commit."""
    path = Path(spec)
    if path.is_dir():
        try:
            head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--",
                                    "easyad"], capture_output=True, text=True).stdout.strip()
        except OSError:     # no git: the path is still a checkout
            head = dirty = ""
        marker = path / ".before_after_built"     # an export made by an earlier run
        label = (head or (marker.read_text().strip() if marker.exists() else ""))[:10] \
            or "not a git checkout"
        if dirty:
            label += " with uncommitted changes in easyad/"
        return path.resolve(), label
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify",
                            f"{spec}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"{spec!r} is neither a directory nor a commit of {ROOT}: "
                         f"{found.stderr.strip()}")
    commit = found.stdout.strip()
    target = Path(tempfile.gettempdir()) / "easyad-before-after" / commit
    marker = target / ".before_after_built"
    if not marker.exists():
        print(f"exporting {commit[:10]} to {target} and building its core (~1 min)",
              file=sys.stderr, flush=True)
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
        if archive.wait():
            raise SystemExit(f"git archive {commit} failed")
        build = subprocess.run([python, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=target, capture_output=True, text=True)
        if build.returncode:
            raise SystemExit(f"building the core of {commit[:10]} in {target} failed:\n"
                             f"{build.stderr[-3000:]}")
        marker.write_text(commit + "\n")
    return target, commit[:10]


def run_child(python: str, module_key: str, checkout: Path, cache: Path, args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", POCL_KERNEL_CACHE="0",
               EASYAD_CACHE_DIR=str(cache))
    command = [python, str(Path(__file__).resolve()), "--child", module_key,
               str(checkout), out, str(args.inner_rounds), str(args.seconds),
               str(int(not args.full_sizes)), str(int(args.opencl)), str(int(args.verbose)),
               str(args.cpu), str(args.bench_dir)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        result = json.loads(Path(out).read_text() or "{}") if Path(out).exists() else {}
        if done.returncode or not result:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            result = {"cases": result.get("cases", {}),
                      "error": f"exit {done.returncode}: {last}"}
            sys.stderr.write(f"{module_key} on {checkout} failed:\n{done.stderr[-3000:]}\n")
        elif args.verbose:
            sys.stderr.write(done.stderr)
    except subprocess.TimeoutExpired:
        result = {"cases": {}, "error": f"timed out after {args.timeout} s"}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(out)
    return result


def collect(args, sides: dict[str, Path], modules: list[str], after_round=None) -> dict:
    """timings[module][side] = list over rounds of {case: seconds}; errors likewise.
    ``after_round(data)`` is called after each round (a partial report survives a kill)."""
    caches = {side: Path(tempfile.mkdtemp(prefix=f"easyad-ba-cache-{side}-"))
              for side in sides}
    timings = {m: {side: [] for side in sides} for m in modules}
    errors: dict[tuple[str, str], str] = {}
    started = time.perf_counter()
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for module in modules:
            for side in order:
                result = run_child(args.python, module, sides[side], caches[side], args)
                timings[module][side].append(
                    result.get("best", {}) if args.statistic == "min" else result["cases"])
                if result.get("error"):
                    errors.setdefault((module, side), result["error"])
        print(f"  round {r + 1}/{args.rounds} ({time.perf_counter() - started:.0f} s, "
              f"{_load()})", file=sys.stderr, flush=True)
        data = {"timings": timings, "errors": errors, "rounds_done": r + 1,
                "seconds": time.perf_counter() - started}
        if after_round is not None:
            after_round(data)
    return data


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def table(data: dict, tolerance: float) -> tuple[list[str], list[str]]:
    """The report's rows and the easyad cases found slower."""
    lines = ["| module | case | before (median) | after (median) | after / before "
             "(median) | middle 50% of rounds | rounds | verdict | over controls |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    slower = []
    for module, sides in data["timings"].items():
        names: list[str] = []
        for per_round in sides["after"] + sides["before"]:
            names += [name for name in per_round if name not in names]
        drift = control_drift(sides, [n for n in names if is_control(n)])
        for name in names:
            before = [r.get(name) for r in sides["before"]]
            after = [r.get(name) for r in sides["after"]]
            ratios = round_ratios(before, after)
            label = name + (" (control)" if is_control(name) else "")
            if not any(b is not None for b in before):
                why = data["errors"].get((module, "before"), "").replace("|", "/")
                lines.append(f"| {module} | {label} | not in before | "
                             f"{_time(statistics.median(a for a in after if a))} | | | | "
                             f"{why[:120]} | |")
                continue
            if not any(a is not None for a in after):
                lines.append(f"| {module} | {label} | | | | | | not in after | |")
                continue
            adjusted = [a / b / d for a, b, d in zip(after, before, drift)
                        if a is not None and b and d]
            over = f"{statistics.median(adjusted):.3f}" if adjusted and not \
                is_control(name) else ""
            q1, median, q3 = quartiles(ratios) if ratios else (0.0, 0.0, 0.0)
            result = verdict(ratios, tolerance)
            if result == "slower" and not is_control(name):
                slower.append(f"{module}: {name} ({median:.2f}x)")
            shown = f"**{result}**" if result in ("slower", "faster") else result
            lines.append(
                f"| {module} | {label} | "
                f"{_time(statistics.median(b for b in before if b is not None))} | "
                f"{_time(statistics.median(a for a in after if a is not None))} | "
                f"{median:.3f} | {q1:.3f}-{q3:.3f} | {len(ratios)} | {shown} | {over} |")
    return lines, slower


def control_drift(sides: dict, controls: list[str]) -> list[float | None]:
    """Per round, the geometric mean of the controls' after / before in this module: the
    drift between the two subprocesses that no easyad code caused (None without
    controls). "over controls" divides each round's ratio by it."""
    drift: list[float | None] = []
    for b, a in zip(sides["before"], sides["after"]):
        logs = [math.log(a[c] / b[c]) for c in controls if a.get(c) and b.get(c)]
        drift.append(math.exp(sum(logs) / len(logs)) if logs else None)
    return drift


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        module, checkout, out, rounds, seconds, quick, opencl, verbose, cpu, where = \
            argv[1:11]
        _child(module, checkout, out, quick == "1", int(rounds), float(seconds),
               opencl == "1", verbose == "1", int(cpu), where)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", nargs="?",
                        help="a checkout path or a commit (e.g. 742a92a)")
    parser.add_argument("after", nargs="?", help="a checkout path or a commit (e.g. .)")
    parser.add_argument("--from-raw", type=Path, metavar="JSON",
                        help="run nothing: the report of an earlier run's --raw file")
    parser.add_argument("--only", default=",".join(MODULES),
                        help=f"modules, comma-separated (default: {','.join(MODULES)})")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of one subprocess per module and side (default 4)")
    parser.add_argument("--inner-rounds", type=int, default=3,
                        help="timing rounds inside each subprocess (default 3)")
    parser.add_argument("--seconds", type=float, default=0.05,
                        help="seconds a variant is timed for per inner round (0.05)")
    parser.add_argument("--statistic", choices=("median", "min"), default="median",
                        help="per subprocess and case: the median of the inner rounds "
                             "(default) or their minimum (steadier on a loaded machine, "
                             "where a median includes time the process waited for a CPU)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="a median ratio above 1 + this may be a regression (0.05)")
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds of 5 windows of 5 ms (for the test)")
    parser.add_argument("--full-sizes", action="store_true",
                        help="the modules' full sizes (chains of 10^7 values, not 10^6: "
                             "about 3 times as long)")
    parser.add_argument("--opencl", action="store_true", help="keep the OpenCL rows")
    parser.add_argument("--cpu", type=int, default=None,
                        help="pin each subprocess to this CPU (default: the last one)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the subprocesses (and of a commit's build)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds one subprocess may take")
    parser.add_argument("--output", type=Path,
                        help="also write the report here (after every round: partial)")
    parser.add_argument("--raw", type=Path,
                        help="write every subprocess's medians here, as JSON")
    parser.add_argument("--bench-dir", type=Path, default=HERE,
                        help="where the benchmark modules are (default: this folder); "
                             "--only may then name any bench_*.py there by its stem")
    parser.add_argument("--verbose", action="store_true", help="show the modules' logs")
    args = parser.parse_args(argv)
    if args.from_raw:
        return from_raw(args, argv)
    if not (args.before and args.after):
        parser.error("name the two sides: BEFORE AFTER (paths or commits)")
    if args.quick:
        args.rounds = min(args.rounds, 2)
        args.inner_rounds, args.seconds = 5, 0.005
    if args.cpu is None:
        args.cpu = max(os.sched_getaffinity(0))
    modules = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = {m for m in modules if m not in MODULES
               and not (args.bench_dir / f"{m}.py").is_file()}
    if unknown:
        parser.error(f"unknown module(s) {', '.join(sorted(unknown))}; known: "
                     f"{', '.join(MODULES)}")
    (before, before_id), (after, after_id) = (resolve(args.before, args.python),
                                              resolve(args.after, args.python))
    sides = {"before": before, "after": after}
    load_start = _load()
    command = "python benchmarks/before_after.py " + " ".join(argv)
    ids = {"before": before_id, "after": after_id}

    def write(data):
        text, _ = report(args, data, sides, ids, command, load_start)
        if args.output:
            args.output.write_text(text, encoding="utf-8")
        if args.raw:
            args.raw.write_text(json.dumps(
                {**data, "errors": {f"{m} {s}": e for (m, s), e in data["errors"].items()},
                 "sides": {k: str(v) for k, v in sides.items()}, "ids": ids,
                 "command": command, "rounds": args.rounds, "load_start": load_start,
                 "cpu": args.cpu, "inner_rounds": args.inner_rounds,
                 "seconds_per_window": args.seconds, "statistic": args.statistic},
                indent=1))

    data = collect(args, sides, modules, write)
    text, code = report(args, data, sides, ids, command, load_start)
    print(text)
    return code


def from_raw(args, argv: list[str]) -> int:
    """Print (and --output) the report of a --raw file, with this version's table."""
    raw = json.loads(args.from_raw.read_text())
    data = {"timings": raw["timings"], "rounds_done": raw["rounds_done"],
            "seconds": raw["seconds"],
            "errors": {tuple(k.split(" ", 1)): v for k, v in raw["errors"].items()}}
    for key, field, default in (("rounds", "rounds", raw["rounds_done"]),
                                ("cpu", "cpu", "?"), ("inner_rounds", "inner_rounds", 3),
                                ("seconds", "seconds_per_window", 0.05),
                                ("statistic", "statistic", "median")):
        setattr(args, key, raw.get(field, default))
    args.before, args.after = (args.before or raw["sides"]["before"],
                               args.after or raw["sides"]["after"])
    command = raw.get("command", "(not recorded)") + \
        f"`, rendered by `python benchmarks/before_after.py {' '.join(argv)}"
    text, code = report(args, data, {k: Path(v) for k, v in raw["sides"].items()},
                        raw["ids"], command, raw.get("load_start", "load ?"))
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    return code


def report(args, data: dict, sides: dict[str, Path], ids: dict[str, str], command: str,
           load_start: str) -> tuple[str, int]:
    """The Markdown report and the exit status."""
    lines, slower = table(data, args.tolerance)
    now = datetime.datetime.now(datetime.timezone.utc)
    partial = (f" (partial: {data['rounds_done']} of {args.rounds} rounds)"
               if data["rounds_done"] < args.rounds else "")
    report = [
        "# easyad before/after: the same benchmark code on two versions of easyad", "",
        "Generated by `benchmarks/before_after.py`; do not edit by hand.", "",
        f"- command: `{command}`",
        f"- date: {now:%Y-%m-%d %H:%M} UTC; {data['seconds'] / 60:.1f} min{partial}",
        f"- before: `{args.before}` = {ids['before']} ({sides['before']})",
        f"- after: `{args.after}` = {ids['after']} ({sides['after']})",
        f"- machine: {os.cpu_count()} CPUs, subprocesses pinned to CPU {args.cpu}, one "
        f"thread each; {load_start} at the start, {_load()} at the end",
        f"- method: {data['rounds_done']} rounds, each running every module once per side in "
        f"alternating order (A B, B A, ...); inside a subprocess {args.inner_rounds} "
        f"timing rounds of ~{args.seconds:g} s per variant, their {args.statistic} per "
        f"case; the ratio "
        f"after / before per round, then its median and quartiles over rounds. Verdict: "
        f"slower if the median > {1 + args.tolerance:g} and the first quartile > 1; "
        f"faster in mirror; else same. Controls (plain floats, numpy) run no easyad code: "
        f"their spread is the noise; \"over controls\" is the median over rounds of the "
        f"ratio divided by that round's geometric mean of the module's control ratios "
        f"(where a module has controls).", "",
        *lines, ""]
    for (module, side), error in sorted(data["errors"].items()):
        report.append(f"- {module}, {side}: stopped early: {error[:300]}")
    failed = [f"{module} ({side})" for module, by_side in data["timings"].items()
              for side, per_round in by_side.items() if not any(per_round)]
    report.append("")
    report.append("Slower: " + ("; ".join(slower) if slower else "none") + ".")
    if failed:
        report.append("FAILED (no case measured): " + ", ".join(failed) + ".")
    return "\n".join(report) + "\n", 2 if failed else 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())

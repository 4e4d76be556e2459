"""Run easyad's benchmarks: ``python benchmarks/run.py [--quick] [--only core,...]``.

Every ``benchmarks/bench_*.py`` is a benchmark module and is found by name, in sorted
order. A module defines

    NAME        short name, used by --only and for the result file results/NAME.md
    TITLE       one line, the heading of its report
    LIBRARIES   distribution names whose versions its report lists (peers included)
    run(ctx)    measures, and returns (Markdown body, list of the targets it missed)

and times code only through ``ctx.measure`` (below), so every benchmark follows the same
method: all variants interleaved in one process, many rounds, each round timing every
variant for a fixed number of calls in a freshly shuffled order, and medians reported.
The machines these run on are shared and noisy; a median over interleaved rounds is
what survives that, a single best-of-N does not.

A run prints its reports; with --write it also writes results/NAME.md for each module it
ran (with the date, the machine, the library versions and the commit measured), the
committed results; it refuses to run from a checkout with uncommitted changes, whose
figures no commit could reproduce. --quick runs fewer, shorter rounds and never writes.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import importlib
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (rounds, seconds one variant is timed for in one round)
FULL = (30, 0.15)
QUICK = (5, 0.02)


@dataclass
class Timings:
    """Per-call seconds of each variant, one entry per round (rounds line up by index)."""

    per_call: dict[str, list[float]]
    calls: dict[str, int]          # calls timed per round, fixed after calibration
    rounds: int

    def median(self, name: str) -> float:
        return statistics.median(self.per_call[name])

    def ratios(self, numerator: str, denominator: str) -> list[float]:
        """The per-round ratios (each pair timed in the same round)."""
        return [a / b for a, b in zip(self.per_call[numerator], self.per_call[denominator])]

    def ratio(self, numerator: str, denominator: str) -> float:
        """Median over rounds of the per-round ratio."""
        return statistics.median(self.ratios(numerator, denominator))

    def ratio_quartiles(self, numerator: str, denominator: str) -> tuple[float, float]:
        """First and third quartile of the per-round ratios: how firm the median is."""
        return quartiles(self.ratios(numerator, denominator))


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


class Context:
    """Settings of this run and the one timing method all benchmarks use."""

    def __init__(self, quick: bool, rounds: int, seconds: float, seed: int) -> None:
        self.quick = quick
        self.rounds = rounds
        self.seconds = seconds
        self.seed = seed

    @contextlib.contextmanager
    def cold_cache(self):
        """A fresh, empty $EASYAD_CACHE_DIR for the block, removed after it: a compile time
        measured inside is a real compile (gcc), not a hit in the on-disk cache of
        compiled programs that every later run finds (easyad/compiler/tape/library.py).
        Every compile time a report states is measured this way."""
        old = os.environ.get("EASYAD_CACHE_DIR")
        fresh = tempfile.mkdtemp(prefix="easyad-bench-cold-")
        os.environ["EASYAD_CACHE_DIR"] = fresh
        try:
            yield fresh
        finally:
            if old is None:
                os.environ.pop("EASYAD_CACHE_DIR", None)
            else:
                os.environ["EASYAD_CACHE_DIR"] = old
            shutil.rmtree(fresh, ignore_errors=True)   # loaded libraries stay mapped

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def _calls_for(self, function: Callable[[], object]) -> int:
        """How many calls take about ctx.seconds (at least 1), found once, then fixed."""
        timer = timeit.Timer(function)
        calls = 1
        while True:
            elapsed = timer.timeit(calls)
            if elapsed >= self.seconds / 5 or calls >= 10**7:
                break
            calls *= 10 if elapsed < self.seconds / 50 else 2
        return max(1, round(calls * self.seconds / max(elapsed, 1e-9)))

    def measure(self, variants: dict[str, Callable[[], object]], rounds: int | None = None,
                seconds: float | None = None) -> Timings:
        """Time zero-argument callables interleaved: ctx.rounds rounds, shuffled each round.

        Each round times every variant with timeit (the garbage collector off while it
        runs, as timeit does) for the same fixed number of calls; the result keeps the
        per-call time of every variant in every round. rounds and seconds override the
        run's settings (shorter windows, more rounds: a ratio whose two sides must see the
        same machine speed, on a machine whose speed drifts).
        """
        names = list(variants)
        for function in variants.values():   # warm up: imports, caches, freelists
            for _ in range(3):
                function()
        saved = self.seconds
        if seconds is not None and not self.quick:
            self.seconds = seconds
        try:
            calls = {name: self._calls_for(variants[name]) for name in names}
        finally:
            self.seconds = saved
        rounds = self.rounds if rounds is None or self.quick else rounds
        per_call: dict[str, list[float]] = {name: [] for name in names}
        shuffler = random.Random(self.seed)
        started = time.perf_counter()
        for r in range(rounds):
            order = names[:]
            shuffler.shuffle(order)
            for name in order:
                gc.collect()
                elapsed = timeit.Timer(variants[name]).timeit(calls[name])
                per_call[name].append(elapsed / calls[name])
            if not self.quick and (r + 1) % (10 if rounds <= 50 else 50) == 0:
                self.log(f"  round {r + 1}/{rounds} "
                         f"({time.perf_counter() - started:.0f} s)")
        return Timings(per_call, calls, rounds)


# ---- the environment a report states ----

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


# the commit --commit names, for a copy of a checkout without .git (set before any read)
GIVEN_COMMIT: list[str] = []


@functools.lru_cache(maxsize=None)
def git_revision(root: Path = ROOT) -> str:
    """``git describe`` of the checkout, read once per run: the first results file a run
    writes would otherwise make every later one say "-dirty"."""
    if GIVEN_COMMIT:
        return GIVEN_COMMIT[0][:7]
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


class DirtyTree(RuntimeError):
    """--write from a checkout whose figures no commit could reproduce."""


def clean_commit(root: Path = ROOT) -> str:
    """The full hash of HEAD, which the results files record; raises DirtyTree unless the
    checkout is a git work tree with no change to a tracked file and no untracked file
    (ignored build outputs aside): a results file must name the code it measured."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=30)
    try:
        head, status = git("rev-parse", "--verify", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError) as error:
        raise DirtyTree(f"--write needs git to name the commit measured ({error})") from None
    if head.returncode or status.returncode:
        raise DirtyTree(f"--write needs a git checkout with a commit: {root} is not one "
                        f"({(head.stderr or status.stderr).strip()})")
    changed = [line for line in status.stdout.splitlines() if line.strip()]
    if changed:     # "XY path" lines
        raise DirtyTree(
            f"--write refused: the checkout has {len(changed)} uncommitted change(s) "
            f"({', '.join(line[3:] for line in changed[:5])}"
            f"{', ...' if len(changed) > 5 else ''}); commit or stash them first, so that "
            f"the results name the commit they measured (runs without --write print only)")
    return head.stdout.strip()


def header(module, ctx: Context, command: str, commit: str | None = None) -> str:
    versions = [f"easyad {version_of('easyad')} (git {git_revision()})"]
    versions += [f"{name} {version_of(name)}" for name in module.LIBRARIES if name != "easyad"]
    now = datetime.datetime.now().astimezone()
    lines = [
        f"# {module.TITLE}",
        "",
        f"- date: {now:%Y-%m-%d %H:%M %Z}",
        f"- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{cpu_model()}, {platform.system()} {platform.machine()}",
        f"- Python: {platform.python_implementation()} {platform.python_version()}",
        f"- libraries: {', '.join(versions)}",
        *([f"- commit: {commit} (a clean checkout)"] if commit else []),
        f"- command: `{command}`",
        f"- method: {ctx.rounds} rounds; each round times every variant with timeit for a "
        f"fixed number of calls (about {ctx.seconds:g} s each), in a freshly shuffled order; "
        f"medians of the per-call times, ratios taken per round then median'd",
    ]
    return "\n".join(lines)


# ---- discovery and the command line ----

def discover() -> list[str]:
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {QUICK[0]} rounds of ~{QUICK[1]} s; prints only")
    parser.add_argument("--only", default="",
                        help="comma-separated NAMEs to run (default: all); see --list")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--rounds", type=int, help="rounds (overrides the default)")
    parser.add_argument("--seconds", type=float,
                        help="seconds one variant is timed for in one round")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round order")
    parser.add_argument("--write", action="store_true",
                        help="write NAME.md into --output (the committed results): only "
                             "when asked, so a run leaves the clone clean")
    parser.add_argument("--output", type=Path, default=HERE / "results",
                        help="folder for NAME.md (default: benchmarks/results)")
    parser.add_argument("--commit", metavar="HASH",
                        help="with --write in a copy of a clean checkout that has no .git "
                             "(the GPU machine: benchmarks/gpu.sh prepare records it): the "
                             "commit measured")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)

    # compile times a report states are cold: PoCL's on-disk kernel cache off for the run
    # (read when the OpenCL platform starts, after this); easyad's own cache: cold_cache()
    os.environ.setdefault("POCL_KERNEL_CACHE", "0")
    sys.path.insert(0, str(HERE))
    modules = [importlib.import_module(stem) for stem in discover()]
    if args.list:
        for m in modules:
            print(f"{m.NAME:10} {m.TITLE}")
        return 0
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = wanted - {m.NAME for m in modules}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))} "
                     f"(known: {', '.join(m.NAME for m in modules)})")
    if wanted:
        modules = [m for m in modules if m.NAME in wanted]

    commit = None
    if args.write and not args.quick:
        try:     # before any module runs: writing the first results file dirties the tree
            commit = clean_commit()
        except DirtyTree as error:
            if not args.commit:
                parser.error(str(error))
            commit = args.commit
            GIVEN_COMMIT.append(commit)
    git_revision()     # read now, before a results file is written
    rounds, seconds = QUICK if args.quick else FULL
    ctx = Context(args.quick, args.rounds or rounds, args.seconds or seconds, args.seed)
    command = "python benchmarks/run.py" + (" " + " ".join(sys.argv[1:]) if argv is None
                                            and sys.argv[1:] else "")
    missed_all: list[str] = []
    for module in modules:
        ctx.log(f"== {module.NAME}: {module.TITLE}")
        started = time.perf_counter()
        body, missed = module.run(ctx)
        ctx.log(f"   ({time.perf_counter() - started:.0f} s)")
        text = header(module, ctx, command, commit) + "\n\n" + body.rstrip() + "\n"
        print(text)
        if args.write and not args.quick:
            args.output.mkdir(parents=True, exist_ok=True)
            path = args.output / f"{module.NAME}.md"
            path.write_text(text, encoding="utf-8")
            ctx.log(f"   wrote {path}")
        missed_all += [f"{module.NAME}: {m}" for m in missed]
    if missed_all:
        ctx.log("missed targets:\n  " + "\n  ".join(missed_all))
    return 1 if (missed_all and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())

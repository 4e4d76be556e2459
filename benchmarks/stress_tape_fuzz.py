"""Stress: fuzz the ways a tape enters easyad (ad.load, unpickling) for a long time.

Runs tests/_tape_fuzz.py (the same mutations as the short run in the test suite) in a child
process, so that a crash (segfault, abort) is reported as one instead of ending this
script, and prints the child's summary: batches, examples, how many loaded equal to the
original and how many raised ad.TapeFormatError. Exit status 0 when no case failed.

    python benchmarks/stress_tape_fuzz.py                  # 10 minutes
    python benchmarks/stress_tape_fuzz.py --seconds 60 --seed 7
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--examples", type=int, default=500, help="examples per batch")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-X", "faulthandler", os.path.join(ROOT, "tests", "_tape_fuzz.py"),
               "--seconds", str(args.seconds), "--seed", str(args.seed),
               "--examples", str(args.examples)]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr[-20000:])
    if done.returncode < 0:
        print(f"CRASH: the fuzz process died of {signal.Signals(-done.returncode).name}",
              file=sys.stderr)
        return 2
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

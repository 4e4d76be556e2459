"""``python -m easyad`` (easyad/__main__.py), run as a user runs it: in a subprocess, every
number it prints checked against an independent reference (math, sympy, finite
differences, counts derived from the programs by hand) or against the other numbers it
prints (timings cannot have a reference; their ratios must be the ratios shown)."""
import ast
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "easyad", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def tour():
    result = _run()
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _section(text, number):
    start = text.index(f"\n{number}. ")
    end = text.find(f"\n{number + 1}. ", start)
    return text[start:end if end >= 0 else None]


def _numbers(line):
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", line)]


def test_cartesian_values_and_derivatives(tour):
    part = _section(tour, 1)
    r, a = 1.0, 2.0
    x, y = _numbers(re.search(r"floats:.*", part).group(0))
    assert x == pytest.approx(r * math.cos(a), abs=5e-7)
    assert y == pytest.approx(r * math.sin(a), abs=5e-7)
    exact = {"dx/dr": math.cos(a), "dy/dr": math.sin(a), "dx/da": -r * math.sin(a),
             "dy/da": r * math.cos(a)}
    for key, value in exact.items():
        row = re.search(rf"^\s+{re.escape(key)}\s+(.*)$", part, flags=re.M).group(1)
        forward, reverse, by_hand = _numbers(row)
        for printed in (forward, reverse, by_hand):      # 6 decimals
            assert printed == pytest.approx(value, abs=5e-7), (key, row)
    # 2 variables + cos, mul, sin, mul; 33 bytes per entry, room for 64 entries at first
    assert "The tape holds 6 entries in 2112 bytes" in part
    by_name = ast.literal_eval(re.search(r"by name: (\{.*\})", part).group(1))
    assert by_name == pytest.approx({"r": math.cos(a), "a": -r * math.sin(a)}, rel=1e-15)


def test_forward_vs_reverse_table_is_consistent(tour):
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+) us\s+([\d.]+) us\s+([\d.]+)x$",
                      _section(tour, 2), flags=re.M)
    assert [int(n) for n, *_ in rows] == [1, 4, 16, 64, 256]
    for _, forward, reverse, ratio in rows:
        forward, reverse, ratio = float(forward), float(reverse), float(ratio)
        # the printed ratio is forward / reverse, within the rounding of the three figures
        low, high = (forward - 0.05) / (reverse + 0.05), (forward + 0.05) / max(reverse - 0.05,
                                                                                  1e-9)
        assert low - 0.05 <= ratio <= high + 0.05, (forward, reverse, ratio)


def test_replay_counts_and_rates(tour):
    part = _section(tour, 3)
    n, rows = 100, 10_000
    assert f"Rosenbrock (n = {n}) at {rows} points" in part
    line = re.search(r"record once: .*", part).group(0)
    # the tape: n inputs, then per term x_i**2, x_(i+1) - ., .**2, 100 * ., 1 - x_i, .**2,
    # the term's sum and the running total (0.0 + the first term included)
    assert f"({n + 8 * (n - 1)} entries)" in line
    total_ms, per_point_us = _numbers(line.split("replay all")[1])[1:3]
    assert per_point_us == pytest.approx(total_ms * 1e3 / rows, abs=0.051)
    again_us, slower = _numbers(re.search(r"recording anew.*", part).group(0))[:2]
    assert slower == pytest.approx(again_us * rows / (total_ms * 1e3), rel=0.01, abs=1.0)


def test_taylor_derivatives_match_sympy(tour):
    sympy = pytest.importorskip("sympy")
    part = _section(tour, 4)
    lines = [line for line in part.splitlines() if line.strip()]
    printed = _numbers(lines[1])
    t = sympy.Symbol("t")
    f = sympy.exp(sympy.sin(t))
    exact = [float(sympy.diff(f, t, k).subs(t, sympy.Rational(1, 2))) for k in range(7)]
    assert len(printed) == 7
    for k, (got, want) in enumerate(zip(printed, exact)):
        assert got == pytest.approx(want, abs=5e-7), k
    assert _numbers(lines[2].split(":")[1]) == pytest.approx(exact[:3], abs=5e-7)


def test_tensor_gradient_matches_finite_differences(tour):
    part = _section(tour, 5)
    W = np.random.default_rng(1).normal(size=(3, 4))
    x = np.linspace(-1.0, 1.0, 4)

    def f(v):
        return float(np.sum(np.tanh(W @ v) ** 2))
    h = 1e-6
    reference = np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(4)])
    got = re.search(r"on (\S+): d/dx sum\(tanh\(W x\)\^2\) = \[(.*)\]", part)
    by_hand = re.search(r"by hand \(numpy\):\s+\[(.*)\]\s+\(max difference (\S+)\)", part)
    assert got and by_hand, part
    np.testing.assert_allclose(_numbers(got.group(2)), reference, atol=2e-6)
    np.testing.assert_allclose(_numbers(by_hand.group(1)), reference, atol=2e-6)
    assert float(by_hand.group(2)) < 1e-12
    report = part.split("devices found")[1]
    assert f"{got.group(1)}:" in report          # it ran on a device the report lists


def test_devices_command_and_require_opencl():
    import easyad as ad
    plain = _run("devices")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("numpy:")
    required = _run("devices", "--require-opencl")
    has_opencl = any(d.kind == "opencl" for d in ad.devices())
    assert required.returncode == (0 if has_opencl else 1), required.stderr
    assert ("no OpenCL device works here" in required.stderr) == (not has_opencl)

"""benchmarks/before_after.py: its statistics and verdict on synthetic timings, its
aliases for moved modules, and one --quick run of a tiny benchmark module with the same
checkout on both sides (the ratios must then be near 1)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("before_after",
                                              ROOT / "benchmarks" / "before_after.py")
ba = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ba)


def test_quartiles_match_hand_computed_values():
    # inclusive method on 1..5: positions 1 + (n-1)/4 = 2 and 4 -> 2 and 4
    assert ba.quartiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (2.0, 3.0, 4.0)
    # 1, 2, 3, 4: q1 at position 1.75 -> 1.75, median 2.5, q3 at 3.25 -> 3.25
    assert ba.quartiles([4.0, 3.0, 2.0, 1.0]) == (1.75, 2.5, 3.25)
    assert ba.quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_round_ratios_pair_rounds_and_skip_missing_ones():
    before = [2.0, None, 4.0, 1.0]
    after = [3.0, 5.0, None, 1.5]
    assert ba.round_ratios(before, after) == [1.5, 1.5]


@pytest.mark.parametrize("ratios, expected", [
    ([1.20, 1.25, 1.30, 1.22], "slower"),         # every round slower, by > 5%
    ([0.80, 0.85, 0.82, 0.90], "faster"),
    ([1.04, 1.03, 1.05, 1.04], "same"),            # firm but under the tolerance
    ([0.70, 1.40, 1.30, 0.90, 1.20], "same"),      # median 1.2 but the middle half has 1
    ([1.1, 0.95, 1.3, 1.2, 1.15, 1.25], "slower"),  # q1 = 1.1125 > 1, median 1.175
    ([], "n/a"),
    ([1.5, 1.6], "too few rounds"),                # quartiles of two values mean little
])
def test_verdict(ratios, expected):
    assert ba.verdict(ratios, 0.05) == expected


def test_verdict_tolerance_is_used():
    assert ba.verdict([1.08, 1.09, 1.10], 0.05) == "slower"
    assert ba.verdict([1.08, 1.09, 1.10], 0.10) == "same"


def test_peers_and_controls_are_told_apart():
    assert ba.is_peer("torch forward + backward")
    assert ba.is_peer("casadi JIT (buffer)") and ba.is_peer("PyTorch CPU, float64")
    assert ba.is_peer("ad (PyPI): adnumber, .d(x)") and ba.is_peer("jax")
    assert not ba.is_peer("easyad Record: backward only") and not ba.is_peer("replayed")
    assert ba.is_control("float, generic (ad.sin ...)")
    assert ba.is_control("n=100 :: numpy") and ba.is_control("dtype=float32 :: multiply")
    assert not ba.is_control("easyad numpy, float64") and not ba.is_control("n=10 :: eager")


def test_table_reports_slower_missing_and_controls():
    before = [{"a": 1.0, "float, x": 1.0}, {"a": 1.0, "float, x": 1.0},
              {"a": 1.0, "float, x": 1.0}]
    after = [{"a": 1.3, "b": 2.0, "float, x": 1.5}, {"a": 1.2, "b": 2.0, "float, x": 1.4},
             {"a": 1.25, "b": 2.0, "float, x": 1.6}]
    data = {"timings": {"core": {"before": before, "after": after}},
            "errors": {("core", "before"): "AttributeError: no ad.b"}}
    lines, slower = ba.table(data, 0.05)
    text = "\n".join(lines)
    row_a = next(line for line in lines if "| a |" in line)
    assert "1.250" in row_a and "**slower**" in row_a and "| 3 |" in row_a
    row_b = next(line for line in lines if "| b |" in line)
    assert "not in before" in row_b and "AttributeError: no ad.b" in row_b
    assert "float, x (control)" in text
    assert slower == ["core: a (1.25x)"]          # a control is never a regression


def test_alias_finds_a_moved_module_under_its_new_name():
    name = "easyad_before_after_test.moved.here"
    try:
        ba._alias(name, "json")
        import json
        module = importlib.import_module(name)
        assert module is json
        from easyad_before_after_test.moved import here   # noqa: F401 (the import works)
        assert here is json
    finally:
        for key in [k for k in sys.modules if k.startswith("easyad_before_after_test")]:
            del sys.modules[key]


TINY = '''
import easyad as ad

NAME = "tiny"


def run(ctx):
    for n in (50,):
        x = [0.5] * n
        ctx.measure({"easyad grad": lambda: ad.grad(lambda v: sum(t * t for t in v))(x),
                     "torch grad": lambda: 1 / 0})     # a peer: never called
    return "", []
'''


def test_quick_run_same_checkout_gives_ratios_near_one(tmp_path):
    (tmp_path / "bench_tiny.py").write_text(textwrap.dedent(TINY))
    report = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "before_after.py"), str(ROOT), str(ROOT),
         "--quick", "--statistic", "min", "--only", "bench_tiny", "--bench-dir", str(tmp_path),
         "--output", str(report)],
        capture_output=True, text=True, timeout=120)
    # exit 1 means a case was found slower: possible by chance on a loaded machine
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    text = report.read_text()
    assert "torch" not in text.split("| --- |")[-1]           # the peer was not timed
    row = next(line for line in text.splitlines() if "n=50 :: easyad grad" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    ratio, rounds, result = float(cells[4]), int(cells[6]), cells[7]
    assert rounds == 2
    # the same code on both sides; the bounds leave room for a machine shared by many
    assert 0.4 < ratio < 2.5, row
    assert result == "too few rounds"         # 2 rounds: no verdict


def test_report_names_both_sides_and_fails_a_side_that_measured_nothing():
    import argparse
    args = argparse.Namespace(rounds=3, tolerance=0.05, before="742a92a", after=".",
                              cpu=1, inner_rounds=3, seconds=0.05, statistic="median")
    data = {"timings": {"nn": {"before": [{}, {}], "after": [{"x": 1.0}, {"x": 1.1}]}},
            "errors": {("nn", "before"): "exit 1: ImportError: no easyad.nn"},
            "rounds_done": 2, "seconds": 60.0}
    text, code = ba.report(args, data, {"before": Path("/b"), "after": Path("/a")},
                           {"before": "742a92ad86", "after": "1f326f88de"}, "cmd", "load 1")
    assert code == 2
    assert "partial: 2 of 3 rounds" in text and "742a92ad86" in text and "1f326f88de" in text
    assert "FAILED (no case measured): nn (before)." in text
    assert "ImportError: no easyad.nn" in text

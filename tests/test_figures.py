"""Every figure the docs state is rendered from benchmarks/results/*.md and is current, and
the results files name a clean commit (benchmarks/run.py --write refuses a dirty tree)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "docs"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import _benchmarks  # noqa: E402
import run as bench_run  # noqa: E402


@pytest.mark.parametrize("page", _benchmarks.PAGES)
def test_every_figure_is_rendered_and_current(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    if page in ("README.md", "docs/performance.md", "docs/record-replay.md", "docs/nn.md"):
        assert _benchmarks.MARKER.search(text), f"{page} renders no figure"
    assert _benchmarks.unrendered(text) == [], (
        f"{page} states figures no results file backs: mark them up (docs/_benchmarks.py)")
    assert _benchmarks.render(text, RESULTS) == text, (
        f"{page}: a figure differs from its results file: python docs/_benchmarks.py --render")


def test_every_page_is_checked():
    assert {"README.md", "docs/performance.md", "docs/record-replay.md",
            "docs/forward-vs-reverse.md"} <= set(_benchmarks.PAGES)


def test_a_changed_results_file_makes_the_page_stale(tmp_path):
    # the check compares with the file: a new measurement changes the rendered value
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    core = results / "core.md"
    row = next(line for line in core.read_text().splitlines()
               if line.startswith("| easyad Trace: value + derivative |"))
    cells = row.split("|")
    cells[3] = " 1.23x "     # the ratio column
    core.write_text(core.read_text().replace(row, "|".join(cells)))
    page = (ROOT / "README.md").read_text(encoding="utf-8")
    fresh = _benchmarks.render(page, results)
    assert fresh != page
    marker = '<!--fig core "easyad Trace: value + derivative" "ratio vs floats (median)"-->'
    assert f"{marker}1.23<!--/fig-->" in fresh


def test_markers_read_cells_lines_sections_and_formats(tmp_path):
    (tmp_path / "demo.md").write_text(
        "# demo\n\n- date: 2026-01-02 03:04 UTC\n\nbuild took 7.61 s and 2.5 s\n\n"
        "## first\n\n| case | time | ratio |\n| --- | ---: | ---: |\n"
        "| a long case | 1,234.5 ms | 0.25x (0.20-0.30) |\n| a | 2 ms | 3.5x |\n\n"
        "## second\n\n| case | ratio |\n| --- | --- |\n| a | 9.75x |\n")
    def fig(spec):
        return _benchmarks.figure(tmp_path, spec)
    assert fig('demo "a long" time') == "1,234.5"
    assert fig('demo "a long" ratio 3') == "0.30"
    assert fig('demo "first § a" ratio') == "3.5"        # exact first cell wins
    assert fig('demo "second § a" ratio 1 .1f') == "9.8"
    assert fig('demo "build took" - 2') == "2.5"
    assert fig("demo date") == "2026-01-02"
    for spec, problem in [('demo a ratio', "2 rows match"), ('nothere a b', "no results file"),
                          ('demo "a long" ratio 9', "not a number 9"),
                          ('demo "no such row" ratio', "0 rows match"),
                          ('demo "a long', "No closing quotation")]:
        with pytest.raises(_benchmarks.FigureError, match=problem):
            fig(spec)


def test_figures_typed_in_by_hand_are_found():
    found = _benchmarks.unrendered(
        "Replay is about 32x faster, 1.1-3x slower, 18 us against 2.5 ms; 0.96 in a run.\n"
        "Targets (<= 1.5x, >= 30x) and `code 2.5x` are not figures; neither is\n"
        '<!--fig core "x" y-->7.5<!--/fig-->x.\n```python\nt = 3.5  # 4 ms\n```\n')
    assert [f.split(" in:")[0] for f in found] == ["'32x'", "'1.1'", "'3x'", "'18 us'",
                                                   "'2.5 ms'", "'0.96'"]


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                        "HOME": str(cwd), "PATH": "/usr/bin:/bin"})


def test_results_name_a_clean_commit(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    with pytest.raises(bench_run.DirtyTree, match="not one"):
        bench_run.clean_commit(tmp_path)                 # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert bench_run.clean_commit(tmp_path) == head and len(head) == 40
    (tmp_path / "a.py").write_text("x = 2\n")            # a change to a tracked file
    with pytest.raises(bench_run.DirtyTree, match=r"1 uncommitted change\(s\) \(a.py\)"):
        bench_run.clean_commit(tmp_path)
    _git(tmp_path, "checkout", "a.py")
    (tmp_path / "new.py").write_text("")                 # an untracked file
    with pytest.raises(bench_run.DirtyTree, match="new.py"):
        bench_run.clean_commit(tmp_path)


def test_write_refuses_a_dirty_tree_before_measuring(monkeypatch, capsys):
    def dirty(root=None):
        raise bench_run.DirtyTree("--write refused: the checkout has 1 uncommitted change(s)")
    monkeypatch.setattr(bench_run, "clean_commit", dirty)
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")    # main sets it: undone after the test
    measured = []
    monkeypatch.setattr(bench_run, "discover", lambda: measured.append(1) or [])
    with pytest.raises(SystemExit) as exit_:
        bench_run.main(["--write"])
    assert exit_.value.code == 2 and "uncommitted" in capsys.readouterr().err


# ---- what the benchmarks measure ----

def test_cold_cache_makes_a_compile_real(tmp_path, monkeypatch):
    """A compile time measured in ctx.cold_cache() is gcc's, not a hit in the disk cache
    an earlier run filled (which took 0.003 s where a compile takes about 0.1 s)."""
    import numpy as np

    import easyad as ad
    from easyad.compiler.tape import library
    if library.compiler() is None:
        pytest.skip("no C compiler on this machine")
    warm = tmp_path / "warm"
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(warm))
    ad.record(lambda x: x[0] * x[1] + ad.sin(x[0]), np.ones(2)).compile()
    assert list(warm.rglob("*.so"))                  # the user's cache holds the program
    compiles = []
    real = library._compile
    monkeypatch.setattr(library, "_compile", lambda *a: compiles.append(a[4]) or real(*a))
    ctx = bench_run.Context(quick=True, rounds=1, seconds=0.01, seed=0)
    with ctx.cold_cache() as fresh:
        assert os.environ["EASYAD_CACHE_DIR"] == fresh and not os.listdir(fresh)
        F = ad.record(lambda x: x[0] * x[1] + ad.sin(x[0]), np.ones(2)).compile()
        assert F.compiled and F.gradient(np.array([2.0, 3.0])).tolist() == [
            3.0 + np.cos(2.0), 2.0]
    assert len(compiles) == 1 and compiles[0].startswith(fresh)   # compiled, not loaded
    assert os.environ["EASYAD_CACHE_DIR"] == str(warm) and not os.path.exists(fresh)


def test_casadis_jit_gets_the_flags_easyad_compiles_with(monkeypatch, tmp_path):
    """The compiled rows compare code, not compiler settings: CasADi's JIT flags are the
    ones easyad's build passes to gcc (captured from a build), at both levels."""
    import bench_replay
    from easyad.compiler.tape import library
    if library.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path))
    used = []
    # a stand-in compiler that notes its flags and reports success (nothing is loaded)
    monkeypatch.setattr(library, "_compile",
                        lambda argv, flags, *rest: used.append(flags) is None)
    for entries in (100, library._BIG):
        used.clear()
        assert library.build(f"int easyad_probe_{entries};", entries).startswith(str(tmp_path))
        easyads = [f for f in used[0] if f not in ("-fPIC", "-shared", "-w", "-std=gnu99")]
        assert "-march=native" in easyads
        options = bench_replay._jit(entries)
        assert options["jit"] and options["compiler"] == "shell"
        assert options["jit_options"]["flags"] == easyads, entries


def test_written_results_name_their_commit(tmp_path, monkeypatch):
    (tmp_path / "bench_fake_for_test.py").write_text(
        'NAME = "fake"\nTITLE = "a fake benchmark"\nLIBRARIES = ["easyad"]\n'
        'def run(ctx):\n    return "| a | b |\\n| --- | --- |\\n| x | 1.5x |\\n", []\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bench_run, "discover", lambda: ["bench_fake_for_test"])
    monkeypatch.setattr(bench_run, "clean_commit", lambda root=None: "ab" * 20)
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")    # main sets it: undone after the test
    assert bench_run.main(["--write", "--output", str(tmp_path / "out"), "--rounds", "1"]) == 0
    text = (tmp_path / "out" / "fake.md").read_text()
    assert f"- commit: {'ab' * 20} (a clean checkout)" in text
    assert _benchmarks.figure(tmp_path / "out", "fake x b") == "1.5"

"""The documentation site builds in strict mode and documents every public name.

The same build as ``make docs`` (sphinx-build -W: every warning is an error), into a temp
directory; a few seconds. Also: the committed figures exist and the benchmark plot script
reads the results files.
"""
from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import easyad as ad

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = ["index", "getting-started", "forward-vs-reverse", "generic", "higher-order", "tensors",
         "linalg", "scientific",
         "checkpointing", "implicit", "vmap", "sparse", "distributed",
         "nn",
         "record-replay", "user-operations", "errors", "conventions", "performance", "api",
         "internals"]
FIGURES = ["forward_vs_reverse.png", "tape.svg", "benchmark_ratios.png"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not result.stderr.strip(), result.stderr  # strict: not even a quiet warning
    return out / "html"


@pytest.mark.parametrize("page", PAGES)
def test_page_is_built(site, page):
    assert (site / f"{page}.html").is_file()


def test_every_page_is_in_the_navigation(site):
    index = (site / "index.html").read_text()
    for page in PAGES[1:]:
        assert f'href="{page}.html"' in index, page
    sources = {p.stem for p in DOCS.glob("*.md")} | {p.stem for p in DOCS.glob("*.rst")}
    assert sources == set(PAGES), "a docs page without a toctree entry, or a missing one"


def test_api_reference_documents_every_public_name(site):
    api = (site / "api.html").read_text()
    documented = set(re.findall(r'<dt class="sig sig-object py" id="easyad\.(\w+)"', api))
    documented |= set(re.findall(r'id="module-easyad\.(\w+)"', api))  # ad.nn, ad.optim...
    missing = set(ad.__all__) - documented
    assert not missing, f"not in docs/api.rst: {sorted(missing)}"


def test_api_reference_shows_the_compiled_docstrings(site):
    api = (site / "api.html").read_text()
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", api)).split())
    for cls in ("Trace", "Record", "WengertList", "Derivatives", "Comparison"):
        assert f'id="easyad.{cls}"' in api, cls
        doc = getattr(ad, cls).__doc__
        lines = [line.strip() for line in doc.splitlines() if line.strip()]
        summary = lines[1] if "(" in lines[0] and lines[0].startswith(cls) else lines[0]
        assert " ".join(summary.split()[:6]) in text, (cls, summary)
    for name in ("Record.derivatives", "WengertList.to_dot", "Derivatives.by_name", "sin"):
        assert f'id="easyad.{name}"' in api, name


def test_figures_are_committed_and_shown(site):
    for name in FIGURES:
        assert (DOCS / "images" / name).is_file(), name
        assert (site / "_images" / name).is_file(), name


def test_performance_page_includes_the_results_files(site):
    page = (site / "performance.html").read_text()
    for path in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert f"benchmarks/results/{path.name}" in page
        date = re.search(r"^- date: (.+)$", path.read_text(), flags=re.M)
        assert date and date.group(1) in page, path.name


def test_benchmark_plot_script_reads_the_results(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "ratios.png"
    result = subprocess.run([sys.executable, str(DOCS / "scripts" / "benchmark_plot.py"),
                             "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.stat().st_size > 1000


def test_the_site_loads_no_external_script(site):
    """Math renders offline: MathJax from the site's own _static (sphinx-mathjax-offline),
    and no page loads a script from elsewhere."""
    if importlib.util.find_spec("sphinx-mathjax-offline") is None:
        pytest.skip("sphinx-mathjax-offline is not installed (pip install "
                    "sphinx-mathjax-offline, or make docs): MathJax comes from a CDN")
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    external = []
    for page in site.glob("*.html"):
        for src in re.findall(r'<script[^>]*\bsrc="([^"]+)"', page.read_text()):
            if re.match(r"(https?:)?//", src):
                external.append((page.name, src))
    assert not external, external

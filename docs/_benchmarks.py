"""The benchmark result files, read at docs build time (called from conf.py).

Every ``benchmarks/results/*.md`` that exists (written by ``make bench``, with its date,
machine, versions and command in its header) is copied into
``docs/_generated/benchmark_results.md``, headings moved under the performance page's,
which includes that file. No figure is typed into the docs by hand: the figures the prose
states are markers rendered from those files (``render``; ``python docs/_benchmarks.py
--render`` rewrites them, ``python docs/_benchmarks.py`` checks them).
"""
from __future__ import annotations

import pathlib
import re
import shlex

HEADING_LEVEL = 3  # the results files' titles become ### headings on the performance page


def _demote(text: str, level: int) -> str:
    # the file's heading levels, in order, become level, level + 1, ... (no level skipped)
    levels = sorted({len(h) for h in re.findall(r"^(#+) ", text, flags=re.M)})
    depth = {n: level + i for i, n in enumerate(levels)}
    return re.sub(r"^(#+) ", lambda m: "#" * depth[len(m.group(1))] + " ", text, flags=re.M)


def write_includes(results: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    files = sorted(results.glob("*.md"))
    parts = [f"<!-- generated from {len(files)} file(s) of benchmarks/results/ "
             f"by docs/_benchmarks.py -->\n"]
    for path in files:
        parts.append(f"{_demote(path.read_text(), HEADING_LEVEL).rstrip()}\n\n"
                     f"*(file: `benchmarks/results/{path.name}`)*\n")
    if not files:
        parts.append("No benchmark results have been written yet: run `make bench`.\n")
    out.mkdir(exist_ok=True)
    target = out / "benchmark_results.md"
    text = "\n".join(parts)
    if not target.exists() or target.read_text() != text:  # keep Sphinx's cache valid
        target.write_text(text)
    return files


# ---- figures in prose, rendered from the results files ----
#
# A figure the docs state is written as a marker around its value:
#
#     <!--fig replay "gradient n=1000: replay vs record again" figure-->54.0<!--/fig-->
#
# naming the results file (benchmarks/results/replay.md), the row (its first cell: exact,
# else the one row whose first cell contains it) and the column (a header name) of the
# table the figure is read from, optionally which number of that cell (1-based; default
# 1) and a format (Python's, e.g. .1f; default: the number as the file writes it).
# "HEADING § ROW" looks only under the heading that contains HEADING. The
# column "-" reads a line outside the tables instead: the one line containing the row
# text, numbers counted after it. ``<!--fig FILE date-->`` is the file's date. HTML
# comments show on neither GitHub nor the docs site, so a reader sees only the value; the
# markers let ``python docs/_benchmarks.py --render`` rewrite every value after `make
# bench-write`, and tests/test_figures.py fail while any value is stale or any figure is
# typed in without a marker.

MARKER = re.compile(r"<!--fig (?P<spec>[^>]*?)-->(?P<value>[^<]*)<!--/fig-->")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
_ROOT = pathlib.Path(__file__).resolve().parent.parent
# the pages whose figures are rendered and checked (tests/test_figures.py): the README and
# every page of the documentation site
PAGES = ["README.md", *sorted(p.relative_to(_ROOT).as_posix()
                              for p in (_ROOT / "docs").glob("*.md"))]


class FigureError(LookupError):
    """A marker names a file, row, column or number that the results files do not have."""


def tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of ``text``: lists of rows of stripped cells (header first)."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def _section(text: str, heading: str, where: str) -> str:
    """The part of ``text`` under the one heading containing ``heading``."""
    parts = re.split(r"^(?=#+ )", text, flags=re.M)
    found = [part for part in parts if heading in part.split("\n", 1)[0]]
    if len(found) != 1:
        raise FigureError(f"{where}: {len(found)} headings contain {heading!r} (need one)")
    return found[0]


def _cell(text: str, row: str, column: str, where: str) -> str:
    if "§" in row:      # "heading § row": the row of a table under that heading
        heading, row = (part.strip() for part in row.split("§", 1))
        text = _section(text, heading, where)
    candidates = []   # (exact?, cell) of every row of a table with that column
    for table in tables(text):
        header = table[0]
        if column not in header:
            continue
        index = header.index(column)
        for cells in table[1:]:
            if index < len(cells) and row in cells[0]:
                candidates.append((cells[0] == row, cells[index]))
    exact = [cell for is_exact, cell in candidates if is_exact]
    found = exact or [cell for _, cell in candidates]
    if len(found) != 1:
        raise FigureError(f"{where}: {len(found)} rows match {row!r} in a table with a "
                          f"column {column!r} (need exactly one): quote more of the row's "
                          f"first cell, or fix the marker after the results file changed")
    return found[0]


def _line(text: str, key: str, where: str) -> str:
    found = [line for line in text.splitlines() if key in line and not line.startswith("|")]
    if len(found) != 1:
        raise FigureError(f"{where}: {len(found)} lines outside the tables contain {key!r} "
                          f"(need exactly one)")
    return found[0].split(key, 1)[1]


def figure(results: pathlib.Path, spec: str) -> str:
    """The value a marker's spec names, as the page shows it (see the comment above)."""
    try:
        words = shlex.split(spec)
    except ValueError as error:
        raise FigureError(f"marker <!--fig {spec}-->: {error}") from None
    where = f"marker <!--fig {spec}-->"
    if not words:
        raise FigureError(f"{where}: names no results file")
    path = results / f"{words[0]}.md"
    if not path.is_file():
        raise FigureError(f"{where}: no results file {path.name} in {results}")
    text = path.read_text(encoding="utf-8")
    if words[1:] == ["date"]:
        date = re.search(r"^- date: (\d{4}-\d\d-\d\d)", text, flags=re.M)
        if not date:
            raise FigureError(f"{where}: {path.name} has no '- date:' line")
        return date.group(1)
    if len(words) not in (3, 4, 5):
        raise FigureError(f"{where}: expected FILE ROW COLUMN [N] [FORMAT] or FILE date")
    row, column = words[1], words[2]
    nth = int(words[3]) if len(words) > 3 else 1
    fmt = words[4] if len(words) > 4 else ""
    source = _line(text, row, where) if column == "-" else _cell(text, row, column, where)
    numbers = NUMBER.findall(source)
    if not 1 <= nth <= len(numbers):
        raise FigureError(f"{where}: {source.strip()!r} has {len(numbers)} number(s), "
                          f"not a number {nth}")
    number = numbers[nth - 1]
    return format(float(number.replace(",", "")), fmt) if fmt else number


def render(text: str, results: pathlib.Path) -> str:
    """``text`` with every marker's value read again from the results files."""
    return MARKER.sub(lambda m: f"<!--fig {m.group('spec')}-->"
                                f"{figure(results, m.group('spec'))}<!--/fig-->", text)


# Figures in prose that no results file measures: constants of the code and targets.
# Each is an exact phrase of a page; anything else that looks like a measurement must be
# a marker.
NOT_MEASURED = [
    "33 bytes",             # a tape entry's size (the struct's), a doctest asserts it
    "40 bytes",             # the memory target, a property the tests check
    "grown 1.2x",           # the growth factor of the tape's arrays, a constant
    "grow by 1.2x",
    "up to 2x within seconds",  # how a shared machine's speed moves (why the method is so)
    "3.10+",                # Python's version
    "PoCL 3.1",             # the OpenCL driver's versions
    "PoCL 3.0",
    "x = -0.0",             # a value in conventions.md's table, not a measurement
    "about 35 s on 2 cores",    # how long a build takes (internals.md), not easyad's speed
    "(about 15 s)",         # how long a figure script runs (forward-vs-reverse.md)
    "PyTorch 2.13",         # the version the tests compare with
    "middle 50%",           # the name of a statistic
]
_FIGURE = re.compile(r"(?<![\w.^*/])\d[\d,]*(?:\.\d+)?\s?(?:x|×|ms|us|µs|ns|s|%|GFLOP/s)"
                     r"(?![\w])|(?<![\w.^*/])\d+\.\d+(?![\w.])")
_TARGET = re.compile(r"(?:<=|>=|<|>|≤|≥)\s*\d")


def unrendered(text: str) -> list[str]:
    """The figures in ``text`` outside markers, code, links and the allowed phrases."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)      # code blocks
    text = MARKER.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)                    # inline code
    text = re.sub(r"\]\([^)]*\)", "]", text)               # link targets
    text = re.sub(r"\$[^$\n]*\$", "", text)                # math
    for phrase in NOT_MEASURED:
        text = text.replace(phrase, "")
    found = []
    for line in text.splitlines():
        line = re.sub(r"(?:<=|>=|<|>|≤|≥)\s*[\d.]+\s?(?:x|%|B)?", "", line)   # targets
        found += [f"{m.group(0)!r} in: {line.strip()[:100]}" for m in _FIGURE.finditer(line)]
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse
    root = _ROOT
    parser = argparse.ArgumentParser(description="Render (--render) or check the figures "
                                     "of " + ", ".join(PAGES) + " from benchmarks/results.")
    parser.add_argument("--render", action="store_true", help="rewrite the pages' values")
    args = parser.parse_args(argv)
    problems = []
    for page in PAGES:
        path = root / page
        text = path.read_text(encoding="utf-8")
        try:
            fresh = render(text, root / "benchmarks" / "results")
        except FigureError as error:
            problems.append(f"{page}: {error}")
            continue
        if fresh != text and args.render:
            path.write_text(fresh, encoding="utf-8")
            print(f"rendered {page}")
        elif fresh != text:
            problems.append(f"{page}: stale figures (run python docs/_benchmarks.py --render)")
        problems += [f"{page}: not rendered from a results file: {f}" for f in unrendered(text)]
    print("\n".join(problems) or "every figure is rendered from benchmarks/results")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

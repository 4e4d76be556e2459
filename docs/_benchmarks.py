"""The benchmark result files, read at docs build time (called from conf.py).

Every ``benchmarks/results/*.md`` that exists (written by ``make bench``, with its date,
machine, versions and command in its header) is copied into
``docs/_generated/benchmark_results.md``, headings moved under the performance page's,
which includes that file. No figure is typed into the docs by hand.
"""
from __future__ import annotations

import pathlib
import re

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

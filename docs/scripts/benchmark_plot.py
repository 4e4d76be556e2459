"""Plot the main ratios of the benchmark result files (benchmarks/results/*.md).

Every table of every results file that has a "ratio" column becomes one panel: a bar per row
(log scale), read from the file, with the file's date in the title. Writes
docs/images/benchmark_ratios.png (committed). Run it after ``make bench``:

    .venv/bin/python docs/scripts/benchmark_plot.py [--results DIR] [--output PATH]
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
from _benchmarks import tables  # noqa: E402  (the one reader of the results' tables)

def ratio_panels(path: pathlib.Path) -> list[tuple[str, str, list[str], list[float]]]:
    """(title, ratio column name, row labels, ratios) for each table with a ratio column."""
    text = path.read_text()
    date = re.search(r"^- date: (.+)$", text, flags=re.M)
    title = text.splitlines()[0].lstrip("# ").split(":")[0]
    panels = []
    for table in tables(text):
        header, rows = table[0], table[1:]
        columns = [i for i, name in enumerate(header) if name.lower().startswith("ratio")]
        if not columns:
            continue
        labels, ratios = [], []
        for row in rows:
            number = re.match(r"[\d,.]+", row[columns[0]].replace(",", ""))
            if number:
                labels.append(row[0])
                ratios.append(float(number.group(0).rstrip(".")))
        panels.append((f"{title} ({path.name}, {date.group(1) if date else 'undated'})",
                       header[columns[0]], labels, ratios))
    return panels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--output", type=pathlib.Path,
                        default=ROOT / "docs" / "images" / "benchmark_ratios.png")
    args = parser.parse_args(argv)
    panels = [p for path in sorted(args.results.glob("*.md")) for p in ratio_panels(path)]
    if not panels:
        raise SystemExit(f"no table with a ratio column in {args.results}/*.md")
    height = sum(0.9 + 0.32 * len(labels) for _, _, labels, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, height), squeeze=False)
    for ax, (title, column, labels, ratios) in zip(axes[:, 0], panels):
        y = range(len(labels))[::-1]
        colors = ["C0" if "easyad" in label else "C7" if label.startswith("float") else "C3"
                  for label in labels]
        ax.barh(list(y), ratios, color=colors)
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=0.8)
        for yi, value in zip(y, ratios):
            ax.text(value, yi, f" {value:g}x", va="center", fontsize=8)
        # long device names (PoCL's) would squeeze the bars: cut labels at 45 characters
        short = [label if len(label) <= 45 else label[:44] + "…" for label in labels]
        ax.set_yticks(list(y), short, fontsize=8)
        ax.set_xlabel(f"{column} (log scale)", fontsize=9)
        ax.set_title(title, fontsize=10)
        ax.set_xlim(right=max(ratios) * 6)
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=100, bbox_inches="tight")
    print(f"wrote {args.output}: {len(panels)} table(s)")


if __name__ == "__main__":
    main()

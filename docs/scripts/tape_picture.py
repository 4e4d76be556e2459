"""Draw a small tape: ``lst.to_dot(d)`` rendered to SVG with Graphviz ``dot``.

Writes docs/images/tape.dot (the text easyad produces) and docs/images/tape.svg (committed,
so building the docs needs no Graphviz). Needs the ``dot`` program (Debian: graphviz).

    .venv/bin/python docs/scripts/tape_picture.py
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import easyad as ad

IMAGES = pathlib.Path(__file__).resolve().parent.parent / "images"


def tape_dot() -> str:
    """The example of the docs' "Forward vs reverse mode" page, with its adjoints."""
    lst = ad.WengertList()
    x = lst.variable(3.0, name="x")
    y = lst.variable(4.0, name="y")
    z = x * y + ad.exp(x / y)
    return lst.to_dot(z.derivatives())


def main() -> int:
    dot = shutil.which("dot")
    if dot is None:
        print("Graphviz 'dot' not found (apt-get install graphviz)", file=sys.stderr)
        return 1
    IMAGES.mkdir(exist_ok=True)
    text = tape_dot()
    (IMAGES / "tape.dot").write_text(text)
    svg = subprocess.run([dot, "-Tsvg"], input=text, capture_output=True, text=True,
                         check=True).stdout
    (IMAGES / "tape.svg").write_text(svg)
    print(f"wrote {IMAGES / 'tape.dot'} and {IMAGES / 'tape.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

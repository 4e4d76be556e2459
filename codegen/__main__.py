"""python -m codegen [--check]: render the rule table into easyad/_generated/ (see
codegen/__init__.py); --check writes nothing and exits 1 if a file is stale."""
from __future__ import annotations

import argparse
import sys

from . import ROOT, generate, stale

parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
if parser.parse_args().check:
    old = stale()
    for path in old:
        print(f"stale: {path.relative_to(ROOT)} (run python -m codegen)")
    sys.exit(1 if old else 0)
for path in generate():
    print("wrote", path.relative_to(ROOT))

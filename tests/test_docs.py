"""The README's and docs' code examples run and say what they claim."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", "docs/conventions.md"])
def test_code_blocks_run(doc):
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python examples"
    namespace = {}
    for block in blocks:
        exec(compile(block, doc, "exec"), namespace)


def test_readme_claims_hold():
    """The values the README's comments state are the true ones."""
    import math
    forward, reverse, generic = python_blocks(ROOT / "README.md")[:3]
    ns = {}
    exec(forward, ns)
    assert ns["y"].number == pytest.approx(4 + math.sin(2))
    assert ns["y"].derivative == pytest.approx(4 + math.cos(2))
    exec(reverse.replace("lst.clear()", ""), ns)
    x, y, d = 3.0, 4.0, ns["d"]
    assert d[ns["x"]] == pytest.approx(y + math.exp(x / y) / y)
    assert d[ns["y"]] == pytest.approx(x - x / y**2 * math.exp(x / y))
    assert len(ns["lst"]) == 6
    exec(generic, ns)
    assert ns["dx"][ns["a"]] == pytest.approx(-math.sin(2.0))

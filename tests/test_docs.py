"""The README's and docs' code examples run and say what they claim."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


# README and every page of the documentation site (docs/*.md): each page's blocks run in
# order in one namespace, as a reader would type them
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def test_docs_pages_are_collected():
    assert "docs/conventions.md" in DOCS and "docs/errors.md" in DOCS


@pytest.mark.parametrize("doc", DOCS)
def test_code_blocks_run(doc, capsys):
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python examples"
    namespace = {"__name__": "__docs__"}
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


def test_readme_functional_and_taylor_claims_hold():
    """The functional API's and Taylor mode's README examples compute what they say."""
    import math

    import numpy as np

    blocks = python_blocks(ROOT / "README.md")
    functional = next(b for b in blocks if "ad.grad(rosenbrock)" in b)
    taylor = next(b for b in blocks if "ad.taylor(" in b)
    ns = {}
    exec(blocks[0], ns)  # import easyad as ad
    exec(functional, ns)
    np.testing.assert_allclose(ns["result"].x, np.ones(4), atol=1e-4)
    r, a = 2.0, 0.5
    np.testing.assert_allclose(ns["J"], [[math.cos(a), -r * math.sin(a)],
                                         [math.sin(a), r * math.cos(a)]], rtol=1e-15)
    np.testing.assert_allclose(ns["Jv"], [math.cos(a), math.sin(a)], rtol=1e-15)
    np.testing.assert_allclose(ns["uJ"], [math.sin(a), r * math.cos(a)], rtol=1e-15)
    assert ns["g"][0] == pytest.approx(-215.6) and ns["g"][1] == pytest.approx(-88.0)
    np.testing.assert_allclose(ns["value"], [r * math.cos(a), r * math.sin(a)], rtol=1e-15)
    exec(taylor, ns)
    assert ns["ad"].taylor(ns["ad"].exp, 0.0, order=4).tolist() == [1.0] * 5
    np.testing.assert_allclose((1 / (1 - ns["t"])).coefficients, [1.0] * 4, atol=1e-15)
    derivative = ns["ad"].derivative(lambda x: x * ns["ad"].sin(x))(1.0)
    assert derivative == pytest.approx(math.sin(1.0) + math.cos(1.0))

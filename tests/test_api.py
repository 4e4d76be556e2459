"""The public API as a contract: names, docstrings, doctests, protocols and static types.

- the typing stub ``easyad/_core.pyi`` matches the compiled module (mypy's stubtest);
- ``easyad.__all__`` is the documented API, every rule of the table is exposed under its
  name and aliases, and every public name has a docstring;
- the examples in the public docstrings run (doctest);
- ``Numeric`` and ``Real`` are runtime-checkable protocols every number kind satisfies;
- typed user code type-checks under ``mypy --strict``, and the errors the stub makes
  checkable (wrong argument types, mixing forward and reverse mode...) are reported.
"""
from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import easyad as ad
from easyad import _core, _rules

ROOT = Path(__file__).resolve().parent.parent
STUBTEST_ALLOWLIST = Path(__file__).with_name("stubtest_allowlist.txt")
# the oldest Python the package supports (pyproject: requires-python): the stub may not use
# newer typing features
OLDEST_PYTHON = "3.10"

# The API contract (README): classes, protocols, errors and the generic functions.
CONTRACT = {
    "Trace", "Record", "WengertList", "Derivatives", "Numeric", "Real",
    "TapeMismatchError", "StaleRecordError",
    # record once, replay many; second order; errors of the toolbox and tensors
    "Comparison", "Function", "TensorFunction", "record", "load", "hessian", "hvp",
    "Primitive", "define", "primitive", "AnomalyError", "detect_anomaly",
    "BranchChangedError", "GradientCheckError", "ShapeError", "DeviceError",
    "TapeFormatError", "PowDomainError", "where", "CompilerWarning", "KernelFallbackWarning",
    # the functional API (functional.py, checks.py) and Taylor mode (taylor.py)
    "derivative", "grad", "value_and_grad", "jacobian", "jvp", "vjp",
    "check_gradients", "Taylor", "taylor",
    # a rule row (so also below), named here as part of the functional API's contract
    "stop_gradient",
    # tensors (issue 4)
    "Tensor", "TraceTensor", "Device", "devices", "device_report", "set_device", "get_device",
    "sum", "mean",
    "amax", "amin", "concatenate", "stack", "flip", "cumsum", "logsumexp", "softmax", "log_softmax",
    "eval_shape",
    # numpy's functions on tensors (issue 26)
    "argmax", "argmin", "argsort", "broadcast_to", "clip", "cumprod", "diag", "diagonal",
    "einsum", "expand_dims", "inner", "kron", "moveaxis", "order_by", "outer", "pad",
    "prod", "repeat", "roll", "sort", "split", "squeeze", "std", "swapaxes",
    "take", "take_along_axis", "tensordot", "tile", "trace", "tril", "triu", "var",
    # custom array operations, shapes without compute (issue 14)
    "ArrayPrimitive", "ShapeDtype",
    # neural networks (issue 5): subpackages
    "nn", "optim", "random",
    # training utilities (issue 28 item 2): mini-batches of arrays
    "data",
    # differentiable linear algebra (issue 26): a subpackage
    "linalg",
    # SciPy with easyad's derivatives (issue 26): a subpackage
    "scipy",
    # recorded functions on dask.distributed (issue 29): a module, dask imported lazily
    "distributed",
    # checkpointing (issue 27, easyad/transforms/checkpoint*.py)
    "checkpoint", "scan", "fori_loop",
    # implicit differentiation (issue 27 item 4)
    "custom_root", "fixed_point", "ConvergenceError",
    # the transforms of easyad/transforms/ (issue 27)
    "vmap",
}
# Rules served by Python operators only (x + y, -x...): no ad.<name> function.
OPERATOR_ONLY = {rule.name for rule in _rules.RULES if not rule.generic}
ALIASES = {alias: rule.name for rule in _rules.RULES for alias in rule.aliases}
FUNCTION_RULES = [rule for rule in _rules.RULES if rule.name not in OPERATOR_ONLY]
# ... and the generic function ad.<name> of every other row of the table
CONTRACT |= {rule.name for rule in FUNCTION_RULES}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # From the repository root, so mypy finds easyad (an editable install's import hook is
    # invisible to mypy) and the stub next to the compiled module.
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


# ---- (a) the stub cannot drift from the compiled module ----

def test_stubtest_passes():
    pytest.importorskip("mypy")
    result = _run("-m", "mypy.stubtest", "easyad._core", "--allowlist", str(STUBTEST_ALLOWLIST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_ships_typing_files():
    assert (ROOT / "easyad" / "py.typed").is_file()
    assert (ROOT / "easyad" / "_core.pyi").is_file()
    with open(ROOT / "pyproject.toml", "rb") as f:
        text = f.read().decode()
    package_data = re.search(r"\[tool\.setuptools\.package-data\]\s*easyad\s*=\s*\[([^\]]*)\]",
                             text)
    assert package_data is not None, "pyproject.toml has no package-data for easyad"
    assert '"py.typed"' in package_data.group(1) and '"*.pyi"' in package_data.group(1)


def test_stub_type_checks_on_the_oldest_python():
    pytest.importorskip("mypy")
    result = _run("-m", "mypy", "--strict", "--python-version", OLDEST_PYTHON,
                  str(ROOT / "easyad" / "_core.pyi"))
    assert result.returncode == 0, result.stdout + result.stderr


# ---- (b) the names of the API ----

def test_all_is_the_contract():
    assert len(ad.__all__) == len(set(ad.__all__)), "duplicates in easyad.__all__"
    # the contract plus every numpy-style alias of the rule table
    assert set(ad.__all__) == CONTRACT | set(ALIASES)


@pytest.mark.parametrize("name", ad.__all__)
def test_public_name_exists_and_is_documented(name):
    obj = getattr(ad, name)
    assert obj.__doc__ and obj.__doc__.strip(), f"easyad.{name} has no docstring"


@pytest.mark.parametrize("rule", _rules.RULES, ids=lambda r: r.name)
def test_rule_is_exposed(rule):
    if rule.name in OPERATOR_ONLY:
        assert rule.operator, f"{rule.name} is neither an operator nor an ad.{rule.name}"
        assert rule.name not in ad.__all__
        return
    function = getattr(ad, rule.name)
    assert function is getattr(_core, rule.name)
    assert rule.name in ad.__all__
    assert rule.doc in function.__doc__
    for alias in rule.aliases:
        assert getattr(ad, alias) is function, f"ad.{alias} is not ad.{rule.name}"
        assert alias in ad.__all__
    for cls in (ad.Trace, ad.Record):
        for name in (rule.name, *rule.aliases):
            assert callable(getattr(cls, name)), f"{cls.__name__}.{name}"


def test_opcode_names_follow_the_table():
    names = (*_rules.STRUCTURAL, *(rule.name for rule in _rules.RULES))
    assert _core.OPCODE_NAMES == names
    assert all(_core.OPCODE_NAMES[code] == name for name, code in _rules.OPCODES.items())


# ---- (c) the examples in the docstrings run ----

def _public_modules():
    modules = {"easyad": ad, "easyad._core": _core}
    for info in pkgutil.iter_modules(ad.__path__):
        name = f"easyad.{info.name}"
        modules.setdefault(name, importlib.import_module(name))
    return list(modules.values())


def test_doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    tested = set()
    for module in _public_modules():
        for test in finder.find(module):
            if test.examples and test.name not in tested:
                tested.add(test.name)
                runner.run(test, out=out.write)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, out.getvalue()
    assert results.attempted > 0, "no doctest examples found"
    assert any(name.startswith("easyad._core.") for name in tested), (
        "no doctests found in the compiled module's docstrings", sorted(tested))


# ---- (d) the protocols hold at run time ----

def _numbers():
    lst = ad.WengertList()
    return {"float": 1.5, "int": 2, "Trace": ad.Trace.variable(1.0),
            "Record": lst.variable(1.0), "Record.constant": ad.Record.constant(1.0),
            "ndarray": np.array([1.0, 2.0]), "float64": np.float64(1.0)}


@pytest.mark.parametrize("kind", sorted(_numbers()))
def test_number_kinds_are_numeric_and_real(kind):
    x = _numbers()[kind]
    assert isinstance(x, ad.Numeric)
    assert isinstance(x, ad.Real)


@pytest.mark.parametrize("value", ["1.0", None, [1.0]], ids=["str", "None", "list"])
def test_non_numbers_are_not_numeric(value):
    assert not isinstance(value, ad.Numeric)
    assert not isinstance(value, ad.Real)


# ---- (e) typed user code: mypy --strict accepts it, and reports what the stub checks ----

GOOD = '''
from typing import Any

import numpy as np
from numpy.typing import NDArray
from typing_extensions import assert_type

import easyad as ad
from easyad import Derivatives, Record, Trace, WengertList


def same(value: object, kind: type) -> None:
    """What the stub says, checked at run time."""
    assert isinstance(value, kind), (value, kind)


def forward(x: float) -> tuple[float, float]:
    t = Trace.variable(x)
    c = Trace.constant(2)
    y = t * t + ad.sin(t) / 2.0 - 1 + 3 ** t + t ** c + abs(-t) + (+t)
    same(assert_type(y, Trace), Trace)
    same(assert_type(ad.sin(t), Trace), Trace)
    same(assert_type(t.exp(), Trace), Trace)
    same(assert_type(ad.pow(t, 2), Trace), Trace)
    same(assert_type(ad.atan2(1.0, t), Trace), Trace)
    same(assert_type(ad.where(y > 0.0, y, 0.0), Trace), Trace)
    same(assert_type(ad.maximum(y, t), Trace), Trace)
    same(assert_type(t < y, bool), bool)
    return y.number, y.derivative


def reverse(x: float) -> dict[str, float]:
    lst = WengertList(max_entries=1000)
    a = lst.variable(x, name="a")
    b = Record.variable(2.0, lst)
    z = a * b + ad.exp(a) - ad.log(b) ** 2 + ad.hypot(a, b) + ad.arcsin(a / 10)
    same(assert_type(z, Record), Record)
    same(assert_type(ad.where(z > 1, 1.0, z), Record), Record)
    same(assert_type(Record.constant(1.0).sqrt(), Record), Record)
    d = z.derivatives()
    same(assert_type(d, Derivatives), Derivatives)
    same(assert_type(d[a] + d.wrt(b) + d.by_name("a"), float), float)
    same(assert_type(len(lst) + lst.nbytes + lst.capacity, int), int)
    same(assert_type(lst.bytes_per_entry, float), float)
    assert a.name == "a" and b.name is None and a.tape is lst and a.index == 0
    return d.as_dict()


def plain(x: float, array: NDArray[np.float64]) -> NDArray[Any]:
    same(assert_type(ad.sin(x), float), float)
    same(assert_type(ad.pow(x, 2), float), float)
    same(assert_type(ad.sqrt(2), float), float)
    same(assert_type(ad.ln(np.float64(3.0)), float), float)
    same(assert_type(ad.where(x > 0, x, 0.0), float), float)
    same(assert_type(ad.cos(array), NDArray[Any]), np.ndarray)
    same(assert_type(ad.hypot(array, 1.0), NDArray[Any]), np.ndarray)
    return ad.where(array > 0, array, 0.0)


def generic(x: ad.Real) -> Any:
    """Written once against the protocol, run on every kind."""
    return ad.sin(x) * x + ad.pow(x, 2.0)


reals: list[ad.Real] = [1.0, 2, Trace(1.0, 1.0), WengertList().variable(1.0),
                        np.array([1.0]), np.float64(1.0)]
names: tuple[str, ...] = ad._core.OPCODE_NAMES
assert forward(1.0)[1] != 0.0 and reverse(1.0)["a"] != 0.0 and plain(1.0, np.ones(2)).shape == (2,)
for x, kind in zip(reals, [float, float, Trace, Record, np.ndarray, float]):
    same(generic(x), kind)
'''

# Each line marked "# E: <code>" must get that mypy error; no other line may get one.
BAD = '''
import easyad as ad

lst = ad.WengertList()
x = lst.variable(1.0)
t = ad.Trace.variable(1.0)
ad.Trace.variable("a")  # E: arg-type
lst.variable(1.0).derivatives()["x"]  # E: index
lst.variable(1.0, name=3)  # E: arg-type
ad.Record.variable(1.0, None)  # E: arg-type
ad.WengertList(max_entries=1.5)  # E: arg-type
ad.Record(1.0)  # E: arg-type
t + x  # E: operator
x * t  # E: operator
t < x  # E: operator
t.number = 2.0  # E: misc
s: str = ad.sin(1.0)  # E: assignment
u: ad.Trace = ad.sin(x)  # E: assignment
ad.sin("a")  # E: call-overload
ad.pow(t, "a")  # E: call-overload
v: ad.Record = t.sin()  # E: assignment
'''

_MYPY_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: .*?(?:  \[(?P<code>[a-z-]+)\])?$",
                         re.MULTILINE)


@pytest.fixture(scope="module")
def mypy_on_snippets(tmp_path_factory):
    pytest.importorskip("mypy")
    pytest.importorskip("typing_extensions")
    directory = tmp_path_factory.mktemp("typed_user_code")
    good, bad = directory / "good_usage.py", directory / "bad_usage.py"
    good.write_text(textwrap.dedent(GOOD))
    bad.write_text(textwrap.dedent(BAD))
    # at the running Python's version: numpy's own stubs need a recent one
    result = _run("-m", "mypy", "--strict", "--no-error-summary", str(good), str(bad))
    assert result.returncode in (0, 1) and not result.stderr, result.stdout + result.stderr
    errors: dict[str, set[tuple[int, str]]] = {}  # file name -> {(line, error code)}
    for m in _MYPY_ERROR.finditer(result.stdout):
        errors.setdefault(Path(m["path"]).name, set()).add((int(m["line"]), m["code"] or ""))
    return good, bad, result, errors


def test_typed_user_code_passes_mypy_strict(mypy_on_snippets):
    good, _, result, errors = mypy_on_snippets
    # errors anywhere but in the bad snippet: in this code, the stub or easyad's own modules
    unexpected = {path: e for path, e in errors.items() if path != "bad_usage.py"}
    assert not unexpected, result.stdout
    runpy.run_path(str(good))  # and what it asserts about the stub holds at run time


def test_type_errors_are_reported(mypy_on_snippets):
    _, bad, result, errors = mypy_on_snippets
    expected = {(number, line.split("# E: ")[1].strip())
                for number, line in enumerate(bad.read_text().splitlines(), 1) if "# E: " in line}
    assert expected
    assert errors.get("bad_usage.py", set()) == expected, result.stdout + result.stderr


def test_every_public_name_has_a_doctest_example():
    """Every name of ad.__all__ carries a runnable example (test_doctests runs them)."""
    missing = [name for name in ad.__all__ if ">>>" not in (getattr(ad, name).__doc__ or "")]
    assert not missing, f"public names without a >>> example: {missing}"

"""Issue 16 item 1: the core's elementwise dispatch (``_engine/tensors.pxi``).

The common cases run in C (a float tensor with a number, a scalar Record, or a tensor of
its backend and dtype, broadcasting included) and everything else in Python
(``_elementwise.unary`` / ``binary``). The two must agree bit for bit: for every rule of
the table and every kind of operand, values and gradients through the C path equal those
through the Python path called directly, and both equal central differences. The errors
(stale tensors and Records, two lists, shapes that do not broadcast) come from the Python
path and leave the list as it was."""
import numpy as np
import pytest

import easyad as ad
from easyad import _core, _rules
from easyad.errors import ShapeError, StaleRecordError, TapeMismatchError
from easyad.tensor import _elementwise

BINARY = [r for r in _rules.RULES if len(r.partials) == 2]
UNARY = [r for r in _rules.RULES if len(r.partials) == 1]
RNG = np.random.default_rng(16)
A43, B43, B3 = (RNG.uniform(0.5, 1.5, s) for s in ((4, 3), (4, 3), (3,)))


def _operand(kind, lst):
    """(operand, its value as numpy sees it, the thing to differentiate or None)."""
    if kind == "same":
        t = ad.Tensor.variable(B43, lst)
        return t, B43, t
    if kind == "row":
        t = ad.Tensor.variable(B3, lst)
        return t, B3, t
    if kind == "constant tensor":
        return ad.Tensor.constant(B43), B43, None
    if kind == "record":
        r = lst.variable(0.75)
        return r, 0.75, r
    if kind == "constant record":
        return ad.Record.constant(0.75), 0.75, None
    return {"float": (1.25, 1.25, None), "int": (2, 2.0, None),
            "numpy float64": (np.float64(1.25), 1.25, None)}[kind]


KINDS = ["same", "row", "constant tensor", "record", "constant record", "float", "int",
         "numpy float64"]


def _run(via_core, rule, kind, reflected, constant_self=False):
    lst = ad.WengertList()
    t = ad.Tensor.constant(A43) if constant_self else ad.Tensor.variable(A43, lst)
    other, _, wrt = _operand(kind, lst)
    if via_core:
        out = t._binary_rule(rule, other, reflected)
    else:
        out = _elementwise.binary(rule, *((other, t) if reflected else (t, other)))
    leaves = [v for v in ((None if constant_self else t), wrt) if v is not None]
    if not leaves:
        return out.value, []
    d = ad.sum(out).derivatives()
    return out.value, [np.asarray(d[v], dtype=float) for v in leaves]


@pytest.mark.parametrize("rule", BINARY, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reflected", [False, True], ids=["t op u", "u op t"])
def test_binary_in_c_equals_the_python_path_bit_for_bit(rule, kind, reflected):
    fast, slow = _run(True, rule, kind, reflected), _run(False, rule, kind, reflected)
    np.testing.assert_array_equal(fast[0], slow[0])
    assert len(fast[1]) == len(slow[1])
    for a, b in zip(fast[1], slow[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", BINARY, ids=lambda r: r.name)
@pytest.mark.parametrize("kind", ["same", "row", "record"])
def test_binary_of_a_constant_tensor_and_a_recorded_operand(rule, kind):
    fast = _run(True, rule, kind, False, constant_self=True)
    slow = _run(False, rule, kind, False, constant_self=True)
    np.testing.assert_array_equal(fast[0], slow[0])
    for a, b in zip(fast[1], slow[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", [r for r in BINARY if r.name in ("mul", "div", "pow",
                                                                   "hypot", "atan2", "sub")],
                         ids=lambda r: r.name)
def test_broadcast_gradients_are_central_differences(rule):
    """x (4, 3) with a row (3,) and a scalar Record, through the C path only."""
    f_np = {"mul": np.multiply, "div": np.divide, "pow": np.power, "hypot": np.hypot,
            "atan2": np.arctan2, "sub": np.subtract}[rule.name]
    lst = ad.WengertList()
    x, b, r = ad.Tensor.variable(A43, lst), ad.Tensor.variable(B3, lst), lst.variable(0.75)
    z = ad.sum(x._binary_rule(rule, b, False)._binary_rule(rule, r, True))
    d = z.derivatives()

    def f(X, B, R):
        return np.sum(f_np(R, f_np(X, B)))
    eps = 1e-6
    for value, got, index in ((A43, d[x], 0), (B3, d[b], 1)):
        numeric = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            e = np.zeros_like(value)
            e[i] = eps
            args_plus, args_minus = [A43, B3, 0.75], [A43, B3, 0.75]
            args_plus[index], args_minus[index] = value + e, value - e
            numeric[i] = (f(*args_plus) - f(*args_minus)) / (2 * eps)
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)
    numeric_r = (f(A43, B3, 0.75 + eps) - f(A43, B3, 0.75 - eps)) / (2 * eps)
    assert d[r] == pytest.approx(numeric_r, rel=1e-6)


@pytest.mark.parametrize("rule", UNARY, ids=lambda r: r.name)
def test_unary_in_c_equals_the_python_path(rule):
    lo, hi = (1.1, 1.9) if rule.name == "acosh" else (0.1, 0.9)
    values = RNG.uniform(lo, hi, (3, 2))
    results = []
    for via_core in (True, False):
        lst = ad.WengertList()
        x = ad.Tensor.variable(values, lst)
        out = x._unary_rule(rule) if via_core else _elementwise.unary(rule, x)
        results.append((out.value, ad.sum(out).derivatives()[x]))
        assert type(lst._node(out._index).vjp) is _core.ElementwiseStep
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_float32_stays_float32_with_python_and_numpy_scalars():
    x = ad.Tensor.constant(np.ones(3, dtype=np.float32))
    for other in (2.0, 2, np.float64(2.0)):
        assert (x * other).dtype == np.float32 and (other * x).dtype == np.float32


def test_errors_come_from_the_python_path_and_leave_the_list_intact():
    lst, other = ad.WengertList(), ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    y = ad.Tensor.variable(B43, other)
    n = len(lst)
    with pytest.raises(TapeMismatchError):
        x + y
    with pytest.raises(TapeMismatchError):
        x * other.variable(2.0)
    with pytest.raises(ShapeError, match="do not broadcast"):
        x + ad.Tensor.variable(np.ones(4), lst)
    assert len(lst) == n + 1                          # only the last variable
    stale = ad.Tensor.variable(B43, lst)
    record = lst.variable(1.0)
    lst.clear()
    fresh = ad.Tensor.variable(A43, lst)
    with pytest.raises(StaleRecordError):
        fresh * stale
    with pytest.raises(StaleRecordError):
        stale * 2.0
    with pytest.raises(StaleRecordError):
        fresh * record
    assert len(lst) == 1


def test_results_have_their_handle_on_demand():
    """The dispatch makes no Record per operation; ``handle`` builds it when asked, stale
    once the list is cleared."""
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    y = x * x
    h = y.handle
    assert h.index == y._index and h.tape is lst and y.handle is h
    lst.clear()
    with pytest.raises(StaleRecordError):
        h.derivatives()
    assert ad.Tensor.constant(A43).handle is None


def test_buffers_made_in_c_are_counted_once_a_check_reads_the_count():
    be = ad.Tensor.constant(np.ones(1)).device.backend
    before = be.live_buffers
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    y = ad.sin(x) * x + 1.0
    assert be.live_buffers >= before + 3
    del x, y
    lst.clear()
    assert be.live_buffers == before


@pytest.fixture
def python_path_refused():
    """The Python path replaced by one that raises: what still works ran in C."""
    def refuse(*args):
        raise AssertionError("the Python path was taken")
    _core._register_service("elementwise.binary", refuse)
    _core._register_service("elementwise.unary", refuse)
    try:
        yield
    finally:
        _core._register_service("elementwise.binary", _elementwise.binary)
        _core._register_service("elementwise.unary", _elementwise.unary)


@pytest.mark.parametrize("kind", KINDS)
def test_the_common_cases_never_reach_python(python_path_refused, kind):
    lst = ad.WengertList()
    x = ad.Tensor.variable(A43, lst)
    other, _, _ = _operand(kind, lst)
    for y in (x * other, other * x, ad.sin(x), x.astype(np.float32) * 2.0):
        assert y.shape == (4, 3)
    assert type(lst._node((x * other)._index).vjp) is _core.ElementwiseStep

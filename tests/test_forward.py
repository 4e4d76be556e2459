"""Forward mode: the Trace class (construction, operators, numpy interplay, pickling)."""
import math
import pickle

import numpy as np
import pytest

import easyad as ad


def test_constructors_and_readonly_fields():
    t = ad.Trace(1.5, 2.5)
    assert (t.number, t.derivative) == (1.5, 2.5)
    assert ad.Trace(3).derivative == 0.0
    v, c = ad.Trace.variable(2), ad.Trace.constant(2)
    assert (v.number, v.derivative) == (2.0, 1.0)
    assert (c.number, c.derivative) == (2.0, 0.0)
    assert isinstance(v.number, float)  # ints are promoted
    with pytest.raises(AttributeError):
        t.number = 3.0
    assert repr(t) == "Trace(number=1.5, derivative=2.5)"


@pytest.mark.parametrize("scalar", [np.float64(2.0), np.int64(2), np.float32(2.0), 2, True])
def test_numpy_and_int_scalars_are_numbers(scalar):
    t = ad.Trace.variable(scalar)
    assert t.number == float(scalar) and t.derivative == 1.0
    x = ad.Trace.variable(3.0)
    for z in (x * scalar, scalar * x):
        assert type(z) is ad.Trace
        assert z.number == 3.0 * float(scalar) and z.derivative == float(scalar)
    z = scalar - x
    assert type(z) is ad.Trace and z.derivative == -1.0


@pytest.mark.parametrize("bad", ["a", None, [1.0], {}, 1j])
def test_non_numeric_operands_raise_type_error(bad):
    x = ad.Trace.variable(1.0)
    for op in (lambda: x + bad, lambda: bad * x, lambda: x / bad, lambda: x ** bad,
               lambda: bad - x, lambda: ad.atan2(x, bad)):
        with pytest.raises(TypeError):
            op()
    with pytest.raises(TypeError, match="real number"):
        ad.Trace.variable(bad)


def test_arithmetic_matches_hand_derivatives():
    x = ad.Trace.variable(1.5)
    cases = [
        (x + 2.0, 3.5, 1.0), (2.0 + x, 3.5, 1.0), (x - 4, -2.5, 1.0), (4 - x, 2.5, -1.0),
        (x * x, 2.25, 3.0), (3 * x, 4.5, 3.0), (x / 2, 0.75, 0.5), (3 / x, 2.0, -3 / 2.25),
        (x ** 3, 3.375, 3 * 2.25), (2 ** x, 2 ** 1.5, 2 ** 1.5 * math.log(2)),
        (x ** x, 1.5 ** 1.5, 1.5 ** 1.5 * (math.log(1.5) + 1)),
        (-x, -1.5, -1.0), (+x, 1.5, 1.0), (abs(-x), 1.5, 1.0),
    ]
    for z, value, derivative in cases:
        assert z.number == pytest.approx(value, rel=1e-15)
        assert z.derivative == pytest.approx(derivative, rel=1e-14)


def test_comparisons_use_number_so_branches_work():
    x = ad.Trace.variable(2.0)
    assert x > 1 and x >= 2.0 and x < 3 and x <= 2 and x == 2 and x != 3
    assert x > ad.Trace.constant(1.0) and not (x < ad.Trace(1.0, 5.0))
    assert bool(x) and not bool(ad.Trace(0.0, 1.0))
    assert (x == "a") is False and (x != None) is True  # noqa: E711  (Python's default)

    def relu(v):
        return v if v > 0 else 0.0 * v
    assert relu(x).derivative == 1.0 and relu(-x).derivative == 0.0
    with pytest.raises(TypeError, match="unhashable"):
        hash(x)


def test_trace_and_record_do_not_mix():
    lst = ad.WengertList()
    r, t = lst.variable(1.0), ad.Trace.variable(1.0)
    for op in (lambda: t + r, lambda: r * t, lambda: ad.atan2(t, r), lambda: t < r,
               lambda: ad.pow(r, t)):
        with pytest.raises(TypeError, match="forward mode .* reverse mode"):
            op()
    assert len(lst) == 1


def test_numpy_object_arrays_of_traces():
    xs = np.array([ad.Trace.variable(0.5), ad.Trace.constant(1.5), ad.Trace.constant(-2.0)])
    w = np.array([1.0, 2.0, 3.0])
    z = np.dot(w, np.sin(xs)) + np.sum(np.exp(xs))
    points = [0.5, 1.5, -2.0]
    assert z.number == pytest.approx(np.dot(w, np.sin(points)) + np.exp(points).sum())
    assert z.derivative == pytest.approx(math.cos(0.5) + math.exp(0.5))
    for name in ("arcsin", "arctan", "arcsinh", "tanh", "sqrt", "abs"):
        got = getattr(np, name)(np.array([ad.Trace.variable(0.25)]))[0]
        assert got.number == pytest.approx(getattr(np, name)(0.25))
    # a float array times a Trace broadcasts into an object array of Traces
    out = np.array([1.0, 2.0]) * ad.Trace.variable(3.0)
    assert [o.derivative for o in out] == [1.0, 2.0]


def test_pickle_round_trip():
    t = ad.Trace(1.25, -3.5)
    u = pickle.loads(pickle.dumps(t))
    assert type(u) is ad.Trace and (u.number, u.derivative) == (1.25, -3.5)


def test_where_keeps_forward_mode_and_selected_derivative():
    x = ad.Trace.variable(4.0)
    z = ad.where(x > 0, ad.sqrt(x), 0.0)
    assert (z.number, z.derivative) == (2.0, 0.25)
    z = ad.where(x < 0, ad.sqrt(x), 0.0)
    assert type(z) is ad.Trace and (z.number, z.derivative) == (0.0, 0.0)
    arr = ad.where(np.array([True, False]), np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    assert arr.tolist() == [1.0, 4.0]

"""0.0 raised to a negative power in every engine (issue 25's conformance finding).

Python has two errors for it: ``math.pow`` raises ValueError and float ``**`` raises
ZeroDivisionError. A tape keeps one pow opcode for both spellings, so a replay cannot
know which was written: every engine that checks errors raises ``ad.PowDomainError``,
which is both. Tensors and numpy arrays follow numpy instead (inf, no exception)."""
import math
import pickle
import warnings

import numpy as np
import pytest

import easyad as ad

# (base, exponent) where Python raises; the exponent -inf is no error (0.0 ** -inf = inf)
FAILING = [(0.0, -1.0), (-0.0, -2.0), (0.0, -0.5), (-0.0, -3.0), (0.0, -1e300),
           (-0.0, -5e-324)]
SPELLINGS = {"ad.pow": ad.pow, "**": lambda x, y: x ** y}


def _python_errors(x, y):
    """The errors Python's own spellings raise at (x, y): the independent reference."""
    found = []
    for call in (lambda: math.pow(x, y), lambda: x ** y):
        try:
            call()
            found.append(None)
        except (ValueError, ZeroDivisionError) as e:
            found.append(type(e))
    return found


def _raises_pow_error(call, x, y):
    """call() raises ad.PowDomainError, which both of Python's spellings' except clauses
    catch, and says which values failed."""
    with pytest.raises(ad.PowDomainError) as caught:
        call()
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, ZeroDivisionError)
    assert math.copysign(1.0, error.base) == math.copysign(1.0, x) and error.base == 0.0
    assert error.exponent == y
    assert repr(y) in str(error) and "negative power" in str(error)
    return error


@pytest.mark.parametrize("x, y", FAILING)
def test_python_itself_raises_two_different_errors_there(x, y):
    assert _python_errors(x, y) == [ValueError, ZeroDivisionError]
    assert issubclass(ad.PowDomainError, ValueError)
    assert issubclass(ad.PowDomainError, ZeroDivisionError)


@pytest.mark.parametrize("x, y", FAILING)
def test_floats_traces_records_and_nested_traces_raise_pow_domain_error(x, y):
    error = _raises_pow_error(lambda: ad.pow(x, y), x, y)
    assert str(error).startswith(f"pow({x!r}, {y!r})") and not error.operator
    for spelling, power in SPELLINGS.items():
        makers = {"Trace": (ad.Trace.variable, ad.Trace.constant)}
        lst = ad.WengertList()
        makers["Record"] = (lst.variable, lambda v: v)
        for variable, constant in makers.values():
            for a, b in ((variable(x), constant(y)), (constant(x), variable(y)),
                         (variable(x), variable(y))):
                error = _raises_pow_error(lambda: power(a, b), x, y)
                assert error.operator == (spelling == "**")
                assert str(error).startswith(f"{x!r} ** {y!r}" if spelling == "**"
                                             else f"pow({x!r}, {y!r})")
        # forward over forward (NestedTrace) and over reverse
        _raises_pow_error(lambda: ad.derivative(ad.derivative(lambda u: power(u, y)))(x),
                          x, y)
        _raises_pow_error(lambda: ad.hessian(lambda v: power(v[0], v[1]))([x, y]), x, y)
        _raises_pow_error(lambda: ad.taylor(lambda t: power(t, y), x, 3), x, y)


def test_the_tape_is_unharmed_and_the_exponent_minus_inf_is_no_error():
    lst = ad.WengertList()
    a = lst.variable(0.0)
    before = len(lst)
    with pytest.raises(ad.PowDomainError):
        a ** -1.0
    assert len(lst) == before
    for power in SPELLINGS.values():
        assert power(ad.Trace.variable(0.0), -math.inf).number == math.inf
        assert power(a, -math.inf).number == 0.0 ** -math.inf == math.inf


def test_the_error_pickles_with_its_values_and_takes_a_message_alone():
    error = ad.PowDomainError(-0.0, -2.0, True, " in entry 3 (pow)")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ad.PowDomainError and str(again) == str(error)
    assert (again.base, again.exponent, again.operator) == (-0.0, -2.0, True)
    assert math.copysign(1.0, again.base) == -1.0
    # code that re-raises with context makes it from a message: type(error)(text)
    context = type(error)(f"while fitting: {error}")
    assert str(context).startswith("while fitting: -0.0 ** -2.0 in entry 3")
    assert context.base is None and context.exponent is None
    assert str(pickle.loads(pickle.dumps(context))) == str(context)


def test_a_nested_trace_whose_first_derivative_needs_it_raises_it_with_context():
    """d/dx x ** 0.5 is 0.5 * pow(x, -0.5): at x = 0 a float Trace gives inf (C, no
    check), but a nested Trace has no higher derivatives there and says so, re-raising
    the partial's PowDomainError with that context."""
    assert (ad.Trace.variable(0.0) ** 0.5).derivative == math.inf
    with pytest.raises(ad.PowDomainError, match=r"pow: its derivative is not finite at "
                       r"\(x, y\) = \(0.0, 0.5\) \(pow\(0.0, -0.5\)"):
        ad.derivative(ad.derivative(lambda u: u ** 0.5))(0.0)


def _compiled(F):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        C = F.compile()
    if not C.compiled:
        pytest.skip("no C compiler: compile() runs in the VM")
    return C


@pytest.mark.parametrize("engine", ["VM", "compiled"])
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_replayed_function_raises_the_recordings_error(engine, spelling, module_cache):
    """Recorded at an ordinary point, replayed where the base is 0: the error of the
    recording, in every method, naming the entry, the row and the values."""
    power = SPELLINGS[spelling]
    functions = {"variable exponent": lambda v: power(v[0] * 1.0, v[1]) + v[1],
                 "constant exponent": lambda v: power(v[0] * 2.0, -3.0) + v[1]}
    for name, f in functions.items():
        F = ad.record(f, np.array([1.0, 2.0]))
        if engine == "compiled":
            F = _compiled(F)
        for x, y in FAILING:
            point = np.array([x / (2.0 if "constant" in name else 1.0), y])
            want_y = -3.0 if "constant" in name else y
            calls = [lambda: F(point), lambda: F.gradient(point),
                     lambda: F.value_and_gradient(point), lambda: F.jacobian(point),
                     lambda: F.hessian(point)]
            for call in calls:
                error = _raises_pow_error(call, x, want_y)
                assert "replaying row 0" in str(error) and "(pow)" in str(error)
            # in a batch: the row that fails is named
            batch = np.array([[1.0, 2.0], point])
            error = _raises_pow_error(lambda: F.gradient(batch), x, want_y)
            assert "replaying row 1" in str(error)
        # ordinary points still replay, and the exponent -inf is no error (as on floats:
        # 0.0 ** -inf + -inf is NaN)
        for point in ([3.0, 2.0], [0.0, -math.inf])[:2 if "variable" in name else 1]:
            np.testing.assert_array_equal(F(point), f(point))


def test_a_safe_base_selected_before_the_power_replays_at_zero():
    """The fix the message gives: select a safe base first (a select evaluates both
    sides, so a power taken first and selected away would still raise while recording)."""
    def f(v):
        return ad.where(v[0] == 0, 1.0, v[0]) ** v[1]
    F = ad.record(f, np.array([2.0, -1.0]))
    assert F([0.0, -1.0]) == 1.0
    np.testing.assert_array_equal(F.gradient([0.0, -1.0]), [0.0, 0.0])
    np.testing.assert_allclose(F.gradient([2.0, -1.0]), [-0.25, 0.5 * math.log(2.0)])


def test_tensors_and_arrays_follow_numpy_with_inf():
    """Tensors run numpy's kernels with its errors ignored: inf (with the sign of the
    zero for odd exponents), no exception and no warning, as numpy's own values; the
    derivative is numpy's too. ad.pow of a numpy array is numpy's power (its errstate)."""
    x = np.array([0.0, -0.0, 2.0])
    with np.errstate(all="ignore"):
        want = np.power(x, -1.0)
        want_grad = -1.0 * np.power(x, -2.0)
    assert want.tolist() == [math.inf, -math.inf, 0.5]
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for power in SPELLINGS.values():
            t = ad.Tensor.variable(x, ad.WengertList())
            z = power(t, -1.0)
            np.testing.assert_array_equal(z.value, want)
            np.testing.assert_array_equal(z.sum().derivatives()[t], want_grad)
        T = ad.record(lambda v: ad.sum(v ** -1.0 * v[2]), np.array([1.0, 1.0, 1.0]),
                      tensor=True)
        np.testing.assert_array_equal(T.gradient(x)[:2], want_grad[:2] * 2.0)
    with np.errstate(divide="raise"):
        with pytest.raises(FloatingPointError):
            ad.pow(x, -1.0)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(ad.pow(x, -1.0), want)

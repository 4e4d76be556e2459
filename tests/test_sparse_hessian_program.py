"""The Hessian's second-order program built in C (compiler/tape/second_order_arrays.py,
_engine/second_order.pxi): every call of ``F.hessian`` after the first runs it, so it
must give the sweeps' numbers bit for bit, at sizes past the Python builder's old cap of
60,000 colours x entries too, and agree with independent references (sympy, finite
differences of the gradient, the dense Hessian)."""
import numpy as np
import pytest

import easyad as ad
from easyad.compiler.tape import second_order, second_order_arrays


def banded(n):
    """Half the sum of squares of a reaction-diffusion residual (a pentadiagonal Hessian)."""
    h = 1.0 / (n + 1)

    def f(u):
        left = np.concatenate([[0.0], u[:-1]])
        right = np.concatenate([u[1:], [0.0]])
        r = (left - 2 * u + right) / (h * h) + u * u * (1 - u) + ad.exp(-u)
        return 0.5 * np.sum(r * r) + 0.5e-3 * np.sum(u * u)
    return f, np.linspace(0.1, 0.9, n)


def bordered(n):
    """A band plus 3 parameters every term reads (a star colouring: a few colours)."""
    def f(z):
        x, p = z[:-3], z[-3:]
        coupled = p[0] * ad.sin(x[:-1]) * x[1:] + x[:-1] * x[1:] ** 3
        own = p[1] * ad.log(1 + x * x) + p[2] * ad.tanh(x)
        return np.sum(coupled) + np.sum(own) + ad.exp(p[0] * p[1])
    return f, np.concatenate([np.linspace(-1.0, 1.0, n - 3), [0.3, -0.2, 0.5]])


def sweeps_then_program(F, x):
    first = F.hessian(x, sparse=True)           # the sweeps (the first call)
    assert F._second() is not None, "no second-order program was built"
    return first, F.hessian(x, sparse=True)      # the program


def gradient_differences(F, x, step=1e-6):
    n = len(x)
    H = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = step
        H[:, j] = (F.gradient(x + e) - F.gradient(x - e)) / (2 * step)
    return H


@pytest.mark.parametrize("make", [banded, bordered])
def test_program_past_the_old_cap_equals_the_sweeps_and_differences(make):
    f, x0 = make(2_000)
    F = ad.record(f, x0)
    colours = int(F._pattern()[2].max()) + 1
    assert colours * len(F) > second_order._SECOND_LIMIT     # the Python builder's cap
    x = x0 + 0.01 * np.cos(np.arange(len(x0)))
    first, program = sweeps_then_program(F, x)
    assert np.array_equal(first, program)                # bit for bit
    rows, cols = F.hessian_pattern()
    # differences of the gradient on a window of columns (the whole matrix: 2,000 sweeps)
    for j in (0, 1, 997, len(x) - 2, len(x) - 1):
        e = np.zeros(len(x))
        e[j] = 1e-6
        column = (F.gradient(x + e) - F.gradient(x - e)) / 2e-6
        mine = np.zeros(len(x))
        mine[rows[cols == j]] = program[cols == j]
        assert np.allclose(mine, column, rtol=1e-6, atol=1e-6 * np.abs(column).max())
    out = np.empty_like(program)
    call = F.bind_hessian(x, out)
    call()
    assert np.array_equal(out, program)


def test_program_matches_sympy():
    sympy = pytest.importorskip("sympy")
    s = sympy.symbols("s0:4")
    expr = s[0] ** 2 * s[1] + sympy.sin(s[1]) * s[2] + sympy.exp(s[0] * s[2]) \
        + sympy.log(1 + s[3] ** 2) * s[3] + sympy.sqrt(s[1] ** 2 + 1) / (s[3] + 3)

    def f(x):
        return x[0] ** 2 * x[1] + ad.sin(x[1]) * x[2] + ad.exp(x[0] * x[2]) \
            + ad.log(1 + x[3] ** 2) * x[3] + ad.sqrt(x[1] ** 2 + 1) / (x[3] + 3)
    x = np.array([0.3, -0.7, 1.1, 0.4])
    F = ad.record(f, x)
    first, program = sweeps_then_program(F, x)
    assert np.array_equal(first, program)
    point = dict(zip(s, x))
    H = np.array(sympy.hessian(expr, s).subs(point).evalf(), dtype=float)
    rows, cols = F.hessian_pattern()
    assert np.allclose(program, H[rows, cols], rtol=1e-13, atol=1e-13)
    assert np.allclose(F.hessian(x), H, rtol=1e-13, atol=1e-13)   # the dense result too


@pytest.mark.parametrize("make", [banded, bordered])
def test_c_program_is_the_python_builders(make):
    """Small enough for the Python builder: both programs give the same numbers (the
    sweeps'), and the C one is at most a little longer (it skips a few optional rewrites)."""
    f, x0 = make(60)
    F = ad.record(f, x0)
    rows, cols, colour = F._pattern()
    args = (F.tape, F.inputs, F.outputs[0], rows, cols, colour,
            F._replayer._layout()["original"], F._hessian_sources())
    python = second_order.second_order_program(*args)
    made = second_order_arrays.program(*args)
    assert python is not None and made is not None
    assert len(made[0]) <= 1.2 * len(python[0])
    assert len(made[2]) == len(python[2])
    x = x0 * 1.3 - 0.05
    values = []
    for program in (python, made):
        G = ad.record(f, x0)
        G._second_cache = [ad._core._Replayer(*program), None, None, program,
                           np.asarray(F._second()[4], dtype=np.int64)]
        G._hessian_calls = 1
        values.append(G.hessian(x, sparse=True))
    assert np.array_equal(values[0], values[1])
    assert np.array_equal(values[1], F.hessian(x, sparse=True))
    assert np.allclose(dense(F, values[1]), gradient_differences(F, x), rtol=1e-5,
                       atol=1e-5 * (1 + np.abs(values[1]).max()))


def dense(F, values):
    rows, cols = F.hessian_pattern()
    H = np.zeros((F.n_inputs, F.n_inputs))
    H[rows, cols] = values
    return H


def test_functions_the_program_cannot_express_keep_the_sweeps():
    f = lambda x: abs(x[0] - 1.0) * x[1] ** 2 + ad.sin(x[0] * x[1])   # noqa: E731
    x = np.array([0.4, -1.2])
    F = ad.record(f, x)
    assert F._second() is None
    H = F.hessian(x)
    assert np.array_equal(F.hessian(x), H)
    assert np.allclose(H, gradient_differences(F, x), rtol=1e-6, atol=1e-7)


def test_constant_and_linear_nonzeros():
    """Entries that are constants of the program (x0 * x1's 1, a square's 2) and an
    input the objective reads only linearly."""
    f = lambda x: x[0] * x[1] + x[2] * x[2] + 3.0 * x[3] + x[1] ** 3   # noqa: E731
    x = np.array([0.5, 2.0, -1.0, 4.0])
    F = ad.record(f, x)
    first, program = sweeps_then_program(F, x)
    assert np.array_equal(first, program)
    expected = np.array([[0, 1, 0, 0], [1, 12.0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 0]])
    rows, cols = F.hessian_pattern()
    assert np.array_equal(program, expected[rows, cols])

"""``argnums=`` and ``has_aux=`` of grad, value_and_grad, jacobian, hessian, jvp and vjp,
against torch.func's transforms of the same functions (its ``argnums``/``has_aux`` mean
what JAX's do), in both modes where a transform has them, nested, and misused.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

RNG = np.random.default_rng(20261127)
TOL = 1e-11


def T(x):
    """numpy (or a structure of it) as torch float64."""
    if isinstance(x, dict):
        return {k: T(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(T(v) for v in x)
    return torch.tensor(np.asarray(x, dtype=np.float64))


def close(ours, theirs, what="result"):
    """Same structure (tuples, lists, dicts), same values to TOL."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), what
        for k in theirs:
            close(ours[k], theirs[k], f"{what}[{k!r}]")
        return
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), \
            f"{what}: {type(ours).__name__} of {getattr(ours, '__len__', lambda: '?')()} vs " \
            f"{type(theirs).__name__} of {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            close(a, b, f"{what}[{i}]")
        return
    b = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    a = np.asarray(ours, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL, err_msg=what)


# ---- the functions, each written for easyad and for torch ---------------------------------

def _layer():
    """sum(tanh(W x + b)^2 * c): arrays of three shapes and a scale passed through."""
    x, W, b = RNG.normal(size=3), RNG.normal(size=(2, 3)), RNG.normal(size=2)
    return ((lambda x, W, b, c: ad.sum(ad.tanh(W @ x + b) ** 2) * c),
            (lambda x, W, b, c: torch.sum(torch.tanh(W @ x + b) ** 2) * c),
            (x, W, b, 1.5))


def _scalars():
    """Scalar code on two numbers and an array."""
    return ((lambda x, y, v: x ** 2 * ad.sin(y) + ad.exp(x * y) * v[0] + v[1] * y),
            (lambda x, y, v: x ** 2 * torch.sin(y) + torch.exp(x * y) * v[0] + v[1] * y),
            (0.7, -0.4, RNG.normal(size=2)))


def _structure():
    """A dict of parameters beside the data."""
    X, p = RNG.normal(size=(4, 3)), {"w": RNG.normal(size=3), "b": 0.3}
    return ((lambda p, X: ad.mean((X @ p["w"] + p["b"]) ** 2)),
            (lambda p, X: torch.mean((X @ p["w"] + p["b"]) ** 2)),
            (p, X))


SCALAR_CASES = {"layer": (_layer, [0, 1, (0, 1, 2), (2, 0), -2, (0, 3)]),
                "scalars": (_scalars, [0, 1, (0, 1), (1, 2), (0, 1, 2)]),
                "structure": (_structure, [0, 1, (0, 1)])}
SCALAR_PARAMS = [(name, argnums) for name, (_, nums) in SCALAR_CASES.items()
                 for argnums in nums]


def _vector():
    """Two outputs of three arguments."""
    return ((lambda x, y, s: (x * y * s, ad.sin(x) + y ** 2)),
            (lambda x, y, s: (x * y * s, torch.sin(x) + y ** 2)),
            (RNG.normal(size=3), RNG.normal(size=3), 2.0))


@pytest.mark.parametrize(("name", "argnums"), SCALAR_PARAMS)
def test_grad_and_value_and_grad_match_torch(name, argnums):
    ours, theirs, point = SCALAR_CASES[name][0]()
    expected = tf.grad(theirs, argnums=argnums)(*T(point))
    close(ad.grad(ours, argnums=argnums)(*point), expected, "grad")
    (value, gradient) = ad.value_and_grad(ours, argnums=argnums)(*point)
    want_grad, want_value = tf.grad_and_value(theirs, argnums=argnums)(*T(point))
    close(gradient, want_grad, "value_and_grad gradient")
    close(value, want_value, "value_and_grad value")
    if isinstance(argnums, tuple):
        assert type(ad.grad(ours, argnums=argnums)(*point)) is tuple


@pytest.mark.parametrize(("name", "argnums"), SCALAR_PARAMS)
def test_has_aux_matches_torch(name, argnums):
    ours, theirs, point = SCALAR_CASES[name][0]()
    # aux: the loss itself (a Record or Tensor while differentiated) and a label
    g, aux = ad.grad(lambda *a: (ours(*a), {"loss": ours(*a), "tag": "ok"}),
                     argnums=argnums, has_aux=True)(*point)
    want_g, want_aux = tf.grad(lambda *a: (theirs(*a), theirs(*a)), argnums=argnums,
                               has_aux=True)(*T(point))
    close(g, want_g, "grad")
    assert aux["tag"] == "ok" and type(aux["loss"]) in (float, np.ndarray)
    close(aux["loss"], want_aux, "aux")
    (value, aux2), g2 = ad.value_and_grad(lambda *a: (ours(*a), ours(*a) * 2.0),
                                          argnums=argnums, has_aux=True)(*point)
    close(g2, want_g, "value_and_grad")
    close(value, want_aux, "value")
    close(aux2, 2 * want_aux, "aux")


@pytest.mark.parametrize("mode", ["forward", "reverse", "auto"])
@pytest.mark.parametrize("argnums", [0, 1, (0, 1), (1, 0)])
def test_jacobian_matches_torch(mode, argnums):
    ours, theirs, point = _vector()
    want = tf.jacrev(theirs, argnums=argnums)(*T(point))
    close(ad.jacobian(ours, mode=mode, argnums=argnums)(*point), want, f"jacobian {mode}")
    close(tf.jacfwd(theirs, argnums=argnums)(*T(point)), want, "torch's own modes")
    J, aux = ad.jacobian(lambda *a: (ours(*a), ours(*a)[0]), mode=mode, argnums=argnums,
                         has_aux=True)(*point)
    close(J, want, "jacobian with aux")
    close(aux, theirs(*T(point))[0], "aux")


@pytest.mark.parametrize(("name", "argnums"), [("layer", 0), ("layer", (0, 2)),
                                               ("scalars", (0, 1)), ("scalars", 1),
                                               ("structure", (0, 1))])
def test_hessian_matches_torch(name, argnums):
    ours, theirs, point = SCALAR_CASES[name][0]()
    want = tf.hessian(theirs, argnums=argnums)(*T(point))
    close(ad.hessian(ours, argnums=argnums)(*point), want, "hessian")
    H, aux = ad.hessian(lambda *a: (ours(*a), "aux"), argnums=argnums, has_aux=True)(*point)
    close(H, want, "hessian with aux")
    assert aux == "aux"


@pytest.mark.parametrize("argnums", [0, 1, (0, 1), (1, 0)])
def test_jvp_and_vjp_match_torch(argnums):
    ours, theirs, (x, y, s) = _vector()
    v = {0: RNG.normal(size=3), 1: RNG.normal(size=3)}
    u = (RNG.normal(size=3), RNG.normal(size=3))
    nums = (argnums,) if isinstance(argnums, int) else argnums
    direction = v[argnums] if isinstance(argnums, int) else tuple(v[i] for i in nums)

    def theirs_of(*moved):      # torch.func.jvp/vjp take the moved arguments only
        full = [T(x), T(y), T(s)]
        for i, m in zip(nums, moved):
            full[i] = m
        return theirs(*full)
    primals = tuple(T([x, y, s][i]) for i in nums)
    want_value, want_tangent = tf.jvp(theirs_of, primals, tuple(T(v[i]) for i in nums))
    value, tangent = ad.jvp(ours, x, direction, y, s, argnums=argnums)
    close(value, want_value, "jvp value")
    close(tangent, want_tangent, "jvp tangent")
    want_value, pullback = tf.vjp(theirs_of, *primals)
    want_cotangent = pullback(T(u))
    value, cotangent = ad.vjp(ours, x, u, y, s, argnums=argnums)
    close(value, want_value, "vjp value")
    close(cotangent, want_cotangent if isinstance(argnums, tuple) else want_cotangent[0],
          "vjp cotangent")
    # has_aux: a third result, the aux as numbers
    aux_f = lambda *a: (ours(*a), ours(*a)[1])      # noqa: E731
    *_, aux = ad.jvp(aux_f, x, direction, y, s, argnums=argnums, has_aux=True)
    close(aux, theirs(*T((x, y, s)))[1], "jvp aux")
    assert type(aux) is np.ndarray
    *_, aux = ad.vjp(aux_f, x, u, y, s, argnums=argnums, has_aux=True)
    close(aux, theirs(*T((x, y, s)))[1], "vjp aux")


def test_other_arguments_pass_through_untouched():
    seen = []
    marker, table, ints = object(), {"k": [1, 2]}, np.arange(3)

    def f(x, label, y, obj, lookup, index):
        seen.append((label, obj, lookup, index))
        return x * y * float(len(label)) + ad.sum(index * x)
    g = ad.grad(f, argnums=(0, 2))(2.0, "abc", 5.0, marker, table, ints)
    assert g == (5.0 * 3 + 3.0, 2.0 * 3)
    for label, obj, lookup, index in seen:
        assert label == "abc" and obj is marker and lookup is table and index is ints
    assert ints.dtype.kind == "i"        # an int array is not made a variable


def test_nesting_argnums_gives_mixed_partials():
    # d2/dx dy of x^2 y^3 + sin(x y), against torch.func nested the same way
    f = lambda x, y: x ** 2 * y ** 3 + ad.sin(x * y)      # noqa: E731
    g = lambda x, y: x ** 2 * y ** 3 + torch.sin(x * y)   # noqa: E731
    x, y = 0.8, -1.3
    want = tf.grad(tf.grad(g, argnums=1), argnums=0)(*T((x, y)))
    close(ad.grad(ad.grad(f, argnums=1), argnums=0)(x, y), want, "reverse over reverse")
    close(2 * x * 3 * y ** 2 + np.cos(x * y) - x * y * np.sin(x * y), want, "by hand")
    # forward over reverse and reverse over forward
    close(ad.jacobian(ad.grad(f, argnums=1), mode="forward")(x, y), want, "fwd over rev")
    close(ad.grad(lambda x, y: ad.jvp(f, x, 1.0, y, argnums=1)[1])(x, y), want,
          "rev over fwd")
    # a tuple inside a tuple: the full Hessian of (x, y) as nested tuples
    H = ad.jacobian(ad.grad(f, argnums=(0, 1)), argnums=(0, 1))(x, y)
    close(H, tf.hessian(g, argnums=(0, 1))(*T((x, y))), "jacobian of grad by tuples")


def test_aux_keeps_the_outer_transforms_derivatives():
    # inside an outer grad, aux is a value of the outer level: differentiable by it
    def inner(x):
        return ad.grad(lambda y: (x * y ** 2, x * y * 3.0), has_aux=True)(2.0)

    def outer(x):
        g, aux = inner(x)          # g = 4x, aux = 6x
        return g + aux
    assert ad.grad(outer)(1.5) == pytest.approx(10.0, rel=1e-15)
    assert ad.derivative(outer)(1.5) == pytest.approx(10.0, rel=1e-15)
    # and its own level is dropped: aux of a top-level jvp holds no tangent
    value, tangent, aux = ad.jvp(lambda x: (x ** 2, x ** 3), 2.0, 1.0, has_aux=True)
    assert (value, tangent, aux) == (4.0, 4.0, 8.0) and type(aux) is float


def test_argnums_errors_are_clear():
    f = lambda x, y: x * y      # noqa: E731
    with pytest.raises(ValueError, match=r"argnums=2 is out of range.*2 positional.*\[-2, 1\]"):
        ad.grad(f, argnums=2)(1.0, 2.0)
    with pytest.raises(ValueError, match="out of range"):
        ad.jacobian(f, argnums=(0, -3))(1.0, 2.0)
    with pytest.raises(ValueError, match="out of range"):
        ad.jvp(f, 1.0, 1.0, 2.0, argnums=5)
    with pytest.raises(ValueError, match="twice"):
        ad.grad(f, argnums=(0, 0))
    with pytest.raises(ValueError, match="twice"):
        ad.grad(f, argnums=(1, -1))(1.0, 2.0)
    for bad in (1.0, "0", (), [0, 1], True):
        with pytest.raises(TypeError, match="argnums must be an int or a non-empty tuple"):
            ad.grad(f, argnums=bad)
    with pytest.raises(ValueError, match="tuple of 2 directions"):
        ad.jvp(f, 1.0, 1.0, 2.0, argnums=(0, 1))


def test_has_aux_errors_are_clear():
    for returned, got in ((3.0, "float"), ((1.0, 2.0, 3.0), "a tuple of 3")):
        with pytest.raises(TypeError, match=rf"has_aux=True.*return a pair.*got {got}"):
            ad.grad(lambda x, r=returned: r, has_aux=True)(1.0)
    with pytest.raises(TypeError, match="pass has_aux=True"):
        ad.grad(lambda x: (x * 2, x))(1.0)      # forgot has_aux: the hint says so
    with pytest.raises(TypeError, match=r"grad needs .* to return a scalar.*shape \(2,\)"):
        ad.grad(lambda x, y: (x * y, 0), argnums=1, has_aux=True)(np.ones(2), np.ones(2))


def test_defaults_keep_the_plain_results():
    f = lambda x, a: ad.sum(x * x) * a       # noqa: E731
    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(ad.grad(f)(x, 3.0), ad.grad(f, argnums=0)(x, 3.0))
    np.testing.assert_array_equal(ad.grad(f, argnums=(0,))(x, 3.0)[0], [6.0, 12.0])
    assert ad.grad(f, argnums=1)(x, 3.0) == 5.0
    assert ad.grad(f, argnums=1)(x, args=(3.0,)) == 5.0      # scipy's args= too


# ---- the float32 rule (docs/conventions.md, "The dtype of derivatives") --------------------

F32 = np.array([0.5, -1.25, 2.0], dtype=np.float32)
F64 = np.array([1.5, 0.25, -0.75])


def _loss(x, a):
    return ad.sum(ad.sin(x) * a) + ad.sum(x * x)


def _hand_gradient(x, a):       # d/dx of sum(sin(x) a + x^2), and d/da
    x = np.asarray(x, dtype=np.float64)
    return np.cos(x) * a + 2 * x, np.sin(x)


def test_float32_in_float32_out_in_every_transform():
    want_x, _ = _hand_gradient(F32, F64)
    results = {
        "grad": ad.grad(_loss)(F32, F64),
        "value_and_grad": ad.value_and_grad(_loss)(F32, F64)[1],
        "jacobian forward": ad.jacobian(_loss, mode="forward")(F32, F64),
        "jacobian reverse": ad.jacobian(_loss, mode="reverse")(F32, F64),
        "vjp": ad.vjp(_loss, F32, 1.0, F64)[1],
        "tensor x0": ad.grad(_loss)(ad.Tensor.constant(F32), F64),
    }
    for what, g in results.items():
        assert g.dtype == np.float32, what
        # computed in float64, rounded once at the end: the float32 of the exact gradient
        np.testing.assert_array_equal(g, want_x.astype(np.float32), err_msg=what)
    H = ad.hessian(lambda x: ad.sum(x ** 3))(F32)
    assert H.dtype == np.float32
    np.testing.assert_array_equal(H, np.diag(6 * F32.astype(np.float64)).astype(np.float32))
    value, tangent = ad.jvp(lambda x: x * x, F32, np.ones(3))
    assert value.dtype == tangent.dtype == np.float32


def test_float64_operands_do_not_change_the_derivatives_dtype():
    # a float64 array passed through (not differentiated) leaves float32 derivatives: only
    # the differentiated arguments decide, and Python numbers never do (weak)
    assert ad.grad(_loss)(F32, F64).dtype == np.float32
    assert ad.grad(_loss)(F32, 2.0).dtype == np.float32
    assert ad.grad(_loss, argnums=1)(F32, F64).dtype == np.float64
    # differentiated together (one structure): numpy's result type, float64 for both
    gx, ga = ad.grad(_loss, argnums=(0, 1))(F32, F64)
    assert gx.dtype == ga.dtype == np.float64
    want_x, want_a = _hand_gradient(F32, F64)
    np.testing.assert_allclose(gx, want_x, rtol=1e-15)
    np.testing.assert_allclose(ga, want_a, rtol=1e-15)
    g = ad.grad(lambda p: _loss(p["x"], F64) * p["s"])({"x": F32, "s": 2.0})
    assert g["x"].dtype == np.float32 and type(g["s"]) is float


def test_recorded_functions_follow_their_documented_dtypes():
    # a scalar tape computes and answers in float64; a tensor program in its recorded dtype
    F = ad.record(lambda x: x[0] * x[1] + ad.sin(x[2]), F32)
    assert F.gradient(F32).dtype == np.float64
    G = ad.record(lambda x: ad.sum(x * x), F32, tensor=True)
    assert G.gradient(F32).dtype == np.float32
    np.testing.assert_array_equal(G.gradient(F32), 2 * F32)

"""Transforms over structures of arrays: results keep the structure and shapes.

References are hand-derived (each function is simple enough to differentiate by eye) or
central differences; tests/test_transforms_torch.py checks the values against torch.func.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad


def close(a, b):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                               rtol=1e-12, atol=1e-12)


def f_nested(p):
    # p = ({"w": (2, 3) array, "c": number}, [vector (3,), number])
    (d, (v, s)) = p
    return ad.sum(d["w"] @ v) * d["c"] + s ** 2 * d["c"]


W, V = np.arange(6.0).reshape(2, 3) / 5.0, np.array([1.0, -2.0, 0.5])
POINT = ({"w": W, "c": 1.5}, [V, 0.7])


def test_gradient_has_the_structure_of_the_point():
    g = ad.grad(f_nested)(POINT)
    assert isinstance(g, tuple) and isinstance(g[0], dict) and isinstance(g[1], list)
    close(g[0]["w"], 1.5 * np.outer(np.ones(2), V))           # d/dW sum(W v) c = c 1 v^T
    assert isinstance(g[0]["c"], float)
    close(g[0]["c"], np.sum(W @ V) + 0.7 ** 2)
    close(g[1][0], 1.5 * W.sum(axis=0))
    close(g[1][1], 2 * 0.7 * 1.5)
    # forward mode gives the same, column by column
    J = ad.jacobian(f_nested, mode="forward")(POINT)
    close(J[0]["w"], g[0]["w"])
    close(J[1][0], g[1][0])


def test_jacobian_of_a_dict_output_by_a_tuple_input():
    def f(t):
        a, b = t
        return {"sum": a * b, "prod": ad.sum(a) * b}
    a, b = np.array([1.0, 2.0]), 3.0
    for mode in ("forward", "reverse", "auto"):
        J = ad.jacobian(f, mode=mode)((a, b))
        assert set(J) == {"sum", "prod"}
        close(J["sum"][0], b * np.eye(2))                  # (2,) + (2,)
        close(J["sum"][1], a)                              # (2,) + ()
        close(J["prod"][0], b * np.ones(2))                # () + (2,)
        assert J["prod"][1] == pytest.approx(a.sum())


def test_jvp_and_vjp_follow_the_structures():
    def f(p):
        return [p["x"] ** 2, ad.sum(p["x"]) * p["y"]]
    p = {"x": np.array([1.0, -1.0, 2.0]), "y": 0.5}
    v = {"x": np.array([1.0, 0.0, 1.0]), "y": 2.0}
    value, tangent = ad.jvp(f, p, v)
    close(value[0], p["x"] ** 2)
    close(tangent[0], 2 * p["x"] * v["x"])
    close(tangent[1], np.sum(v["x"]) * p["y"] + np.sum(p["x"]) * v["y"])
    u = [np.array([1.0, 2.0, 3.0]), 4.0]
    _, cotangent = ad.vjp(f, p, u)
    close(cotangent["x"], 2 * p["x"] * u[0] + 4.0 * p["y"])
    close(cotangent["y"], 4.0 * np.sum(p["x"]))
    with pytest.raises(ValueError, match="structure"):
        ad.vjp(f, p, [1.0])
    with pytest.raises(ValueError, match="structure of x0"):
        ad.jvp(f, p, {"x": v["x"]})


def test_hessian_of_a_structure_is_blocks_of_shape_a_plus_b():
    def f(p):
        return ad.sum(p["a"] ** 2) * p["b"] + ad.sum(p["a"] @ p["m"])
    p = {"a": np.array([1.0, 2.0]), "b": 3.0, "m": np.ones((2, 2))}
    H = ad.hessian(f)(p)
    close(H["a"]["a"], 2 * p["b"] * np.eye(2))
    close(H["a"]["b"], 2 * p["a"])
    close(H["b"]["a"], 2 * p["a"])
    assert H["b"]["b"] == 0.0
    assert H["a"]["m"].shape == (2, 2, 2) and H["m"]["m"].shape == (2, 2, 2, 2)
    close(H["a"]["m"], np.einsum("ij,k->ijk", np.eye(2), np.ones(2)))   # d2/da_i dm_jk
    hv = ad.hvp(f, p, {"a": np.array([1.0, 0.0]), "b": 0.0, "m": np.zeros((2, 2))})
    close(hv["a"], H["a"]["a"][:, 0])
    close(hv["b"], H["b"]["a"][0])


def test_check_gradients_over_a_structure():
    report = ad.check_gradients(f_nested, POINT)
    assert report.reverse.shape == (1, 6 + 1 + 3 + 1)   # flattened outputs by inputs
    assert report.max_error < 1e-7
    wrong = lambda p: p[0] * 2.0 if isinstance(p[0], float) else p[0] * 3.0  # noqa: E731
    with pytest.raises(ad.GradientCheckError):
        ad.check_gradients(wrong, (1.0, np.array([1.0])))


def test_scalar_and_tensor_code_mix_on_one_input():
    # x[0] (a Record of the input's elements) and x @ A (a tensor operation) together:
    # the input's derivative is the sum of both paths
    A = np.array([[1.0, 2.0], [3.0, 4.0]])
    f = lambda x: x[0] ** 3 + ad.sum(x @ A) * x[1]  # noqa: E731
    x = np.array([0.5, -1.5])
    expected = np.array([3 * 0.25 + A.sum(axis=1)[0] * x[1],
                         A.sum(axis=1)[1] * x[1] + (x @ A).sum()])
    close(ad.grad(f)(x), expected)
    close(ad.jacobian(f, mode="forward")(x), expected)
    close(ad.hessian(f)(x), ad.jacobian(ad.grad(f))(x))


def test_points_of_other_devices_and_constants():
    x = ad.Tensor.constant(np.array([1.0, 2.0]))     # a constant tensor as the point
    close(ad.grad(lambda t: ad.sum(t ** 2))(x), [2.0, 4.0])
    assert ad.grad(lambda t: 5.0)(np.ones(3)).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(TypeError, match="real numbers"):
        ad.grad(lambda t: t)({"a": "text"})

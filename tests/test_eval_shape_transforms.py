"""ad.eval_shape of derivative transforms: the shapes and dtypes it gives must be those
of the real evaluation (the reference here), for every transform, structure and dtype."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import easyad as ad


def _scalar(x: Any) -> Any:
    return ad.sum(ad.tanh(x) * x)


def _vector(x: Any) -> Any:
    return ad.tanh(x) * x[0]


def _tree(t: Any) -> Any:
    a, b = t
    return {"p": ad.sum(a * b), "q": a * 2.0}


CASES = {
    "grad": (ad.grad(_scalar), [(3, 4)]),
    "value_and_grad": (ad.value_and_grad(_scalar), [(5,)]),
    "hessian": (ad.hessian(_scalar), [(4,)]),
    "jacobian reverse": (ad.jacobian(_vector, mode="reverse"), [(4,)]),
    "jacobian forward": (ad.jacobian(_vector, mode="forward"), [(4,)]),
    "jacobian of a tree": (ad.jacobian(_tree), [((3,), (3,))]),
    "jacobian forward of a tree": (ad.jacobian(_tree, mode="forward"), [((3,), (3,))]),
    "hvp": (lambda a: ad.hvp(_scalar, a, a), [(4,)]),
    "jvp": (lambda a: ad.jvp(_vector, a, a), [(4,)]),
    "vjp": (lambda a: ad.vjp(_vector, a, a), [(4,)]),
    "vmap of grad": (ad.vmap(ad.grad(_scalar)), [(7, 4)]),
    "vmap of jacobian": (ad.vmap(ad.jacobian(_vector)), [(5, 3)]),
    "grad of grad-sum": (ad.grad(lambda x: ad.sum(ad.grad(_scalar)(x) ** 2)), [(3,)]),
}


def _real(spec: Any, dtype: Any, rng: np.random.Generator) -> Any:
    if isinstance(spec, tuple) and all(isinstance(n, int) for n in spec):
        return rng.uniform(0.1, 1.0, size=spec).astype(dtype)
    return tuple(_real(s, dtype, rng) for s in spec)


def _abstract(spec: Any, dtype: Any) -> Any:
    if isinstance(spec, tuple) and all(isinstance(n, int) for n in spec):
        return ad.ShapeDtype(spec, dtype)
    return tuple(_abstract(s, dtype) for s in spec)


def _specs(out: Any) -> Any:
    if isinstance(out, dict):
        return {k: _specs(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_specs(v) for v in out)
    a = np.asarray(out)
    return ad.ShapeDtype(a.shape, a.dtype if isinstance(out, np.ndarray) else np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_eval_shape_of_a_transform_matches_the_evaluation(name: str, dtype: Any) -> None:
    fn, specs = CASES[name]
    rng = np.random.default_rng(0)
    expected = _specs(fn(*[_real(s, dtype, rng) for s in specs]))
    got = ad.eval_shape(fn, *[_abstract(s, dtype) for s in specs])
    assert got == expected, name


def test_eval_shape_of_a_transform_at_a_numpy_point() -> None:
    x = np.ones((3, 4))
    assert ad.eval_shape(ad.grad(_scalar), x) == ad.ShapeDtype((3, 4), np.float64)


def test_eval_shape_of_a_transform_computes_nothing() -> None:
    # a Jacobian's shape needs f's output shape alone: f is traced once on shapes, not
    # once per input element, and no kernel runs
    calls = []

    def f(x: Any) -> Any:
        calls.append(1)
        return ad.tanh(x)
    for mode in ("forward", "reverse"):
        calls.clear()
        assert ad.eval_shape(ad.jacobian(f, mode=mode), (1000,)) == \
            ad.ShapeDtype((1000, 1000), np.float64)
        assert len(calls) == 1, mode

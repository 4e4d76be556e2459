"""Batching rules of the linear algebra ops at any batch axis (issue 26): a batch axis
among the matrix axes is moved to the front, and the result's back where np.stack of the
slices' results puts it (``ops.batched``, reading the rule's ``core_axes``), against
numpy loops over the slices, on arrays and on tensors, and a gradient through it against
torch.func."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch.func import grad as tgrad

import easyad as ad
from easyad import ops

I3 = np.eye(3)
RNG = np.random.default_rng(5)

# op -> (a well-conditioned slice from a normal one, numpy's function of one slice)
CASES = {
    "inv": (lambda a: a + 4 * I3, np.linalg.inv),
    "det": (lambda a: a + 4 * I3, np.linalg.det),
    # the op's one output: (sign, log|det|) along a last axis of 2
    "slogdet": (lambda a: a + 4 * I3, lambda a: np.stack(np.linalg.slogdet(a))),
    "cholesky": (lambda a: a @ a.T + 3 * I3, np.linalg.cholesky),
    "expm": (lambda a: a, scipy.linalg.expm),
    "pinv": (lambda a: a, np.linalg.pinv),
    "eigvalsh": (lambda a: a + a.T, np.linalg.eigvalsh),
    "svdvals": (lambda a: a, lambda a: np.linalg.svd(a, compute_uv=False)),
    "lu_factor": (lambda a: a + 4 * I3, lambda a: scipy.linalg.lu_factor(a)[0]),
}


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("name", list(CASES))
def test_any_batch_axis_against_a_loop(name, axis):
    prepare, reference = CASES[name]
    slices = [prepare(RNG.normal(size=(3, 3))) for _ in range(4)]
    x = np.stack(slices, axis=axis)
    outs = [reference(s) for s in slices]
    expected = np.stack(outs, axis=min(axis % 3, np.ndim(outs[0])))
    op = ops.get(name)
    np.testing.assert_allclose(ops.batched(op, x, axis), expected, rtol=1e-12, atol=1e-12)
    on_tensor = ops.batched(op, ad.Tensor.constant(x), axis)
    np.testing.assert_allclose(on_tensor.value, expected, rtol=1e-12, atol=1e-12)


def test_a_gradient_through_a_batch_axis_inside_the_matrices():
    x = np.stack([RNG.normal(size=(3, 3)) + 4 * I3 for _ in range(4)], axis=2)   # (3, 3, 4)
    w = RNG.normal(size=(3, 3, 4))

    def f(t):
        return ad.sum(ad.sin(ops.batched(ops.get("inv"), t, 2)) * w)

    def reference(t):
        return torch.sum(torch.sin(torch.movedim(torch.linalg.inv(torch.movedim(t, 2, 0)),
                                                 0, 2)) * torch.tensor(w))
    expected = tgrad(reference)(torch.tensor(x)).numpy()
    t = ad.Tensor.variable(x, ad.WengertList())
    np.testing.assert_allclose(f(t).derivatives()[t], expected, rtol=1e-10, atol=1e-12)
    tt = ad.TraceTensor.variable(x, w)
    assert abs(f(tt).derivative - float(np.sum(expected * w))) < 1e-10


def test_a_batch_axis_that_is_not_an_axis_is_refused():
    with pytest.raises(ValueError, match="batch axis 3 is not an axis"):
        ops.batched(ops.get("inv"), np.zeros((2, 3, 3)), 3)

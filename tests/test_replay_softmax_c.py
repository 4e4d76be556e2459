"""cross_entropy and its vjp as generated C in the fused numpy program
(``compiler/program/softmax_c.py``), linear's products into buffers made once
(``blas_steps.py``): the same loss, gradient and SGD step as the numpy kernels
(``fuse=False``) and as torch.func, non-finite logits as numpy gives them, the steps that
cannot be lowered left to numpy, outputs never in a reused buffer."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import easyad as ad
from easyad import nn
from easyad.compiler.program.fused_c import FusedProgram

torch = pytest.importorskip("torch")


def _fused_programs(F) -> list[FusedProgram]:
    return [b for b in F._bound.values() if isinstance(b, FusedProgram)]


def _mlp(dtype, n=9, sizes=(7, 5, 4)):
    rng = np.random.default_rng(3)
    params = {"w1": rng.standard_normal((sizes[1], sizes[0])).astype(dtype),
              "b1": rng.standard_normal(sizes[1]).astype(dtype),
              "w2": rng.standard_normal((sizes[2], sizes[1])).astype(dtype),
              "b2": rng.standard_normal(sizes[2]).astype(dtype)}
    x = rng.standard_normal((n, sizes[0])).astype(dtype)
    y = rng.integers(0, sizes[2], n)

    def loss(p, x, y):
        h = ad.tanh(nn.functional.linear(x, p["w1"], p["b1"]))
        return nn.functional.cross_entropy(nn.functional.linear(h, p["w2"], p["b2"]), y)
    return loss, params, x, y


def _torch_loss_grad(params, x, y):
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}

    def loss(p):
        h = torch.tanh(torch.tensor(x, dtype=torch.float64) @ p["w1"].T + p["b1"])
        return torch.nn.functional.cross_entropy(h @ p["w2"].T + p["b2"], torch.tensor(y))
    value, grad = torch.func.grad_and_value(loss)(t)[::-1]
    return float(value), {k: g.numpy() for k, g in grad.items()}


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_sgd_step_matches_numpy_kernels_and_torch(dtype, rtol):
    loss, params, x, y = _mlp(dtype)
    fused = ad.record(loss, params, x, y)
    plain = ad.record(loss, params, x, y, fuse=False)
    a = {k: v.copy() for k, v in params.items()}
    b = {k: v.copy() for k, v in params.items()}
    for _ in range(3):
        want_value, want_grad = _torch_loss_grad(a, x, y)
        la, lb = fused.sgd_step(a, x, y, lr=0.3), plain.sgd_step(b, x, y, lr=0.3)
        assert la == pytest.approx(lb, rel=rtol) and la == pytest.approx(want_value, rel=rtol)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=rtol)
            assert a[k].dtype == dtype
    lowered = [len(fp.lowered) for fp in _fused_programs(fused)]
    assert lowered == [2], "the cross-entropy and its vjp are C steps"
    (fp,) = _fused_programs(fused)        # the products into buffers made once
    assert [run.__module__.rsplit(".", 1)[1] for fn, run, *_ in fp.steps if fn is None] \
        == ["blas_steps"] * 4
    value, grad = fused.value_and_gradient(params, x, y)
    want_value, want_grad = _torch_loss_grad(params, x, y)
    assert value == pytest.approx(want_value, rel=rtol)
    for k in grad:
        np.testing.assert_allclose(grad[k], want_grad[k], rtol=10 * rtol, atol=10 * rtol)


def test_value_only_program_and_non_finite_logits():
    def f(z, y):
        return nn.functional.cross_entropy(z * 1.0, y)
    z = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    y = np.array([2, 0])
    F = ad.record(f, z, y)
    G = ad.record(f, z, y, fuse=False)
    for row in ([np.inf, 1.0, 2.0], [-np.inf] * 3, [np.nan, 1.0, 2.0], [1e308, -1e308, 0.0],
                [1000.0, 0.0, -1000.0]):
        w = z.copy()
        w[1] = row
        got, want = F(w, y), G(w, y)
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want, rel=1e-14)
    got = F.value_and_gradient(z, y)
    m = z - z.max(axis=1, keepdims=True)
    p = np.exp(m) / np.exp(m).sum(axis=1, keepdims=True)
    want = -np.mean(np.log(p[[0, 1], y]))
    assert got[0] == pytest.approx(want, rel=1e-14)
    p[[0, 1], y] -= 1.0
    np.testing.assert_allclose(got[1], p / 2, rtol=1e-14)
    assert all(len(fp.lowered) >= 1 for fp in _fused_programs(F))


def test_forward_alone_and_targets_out_of_range():
    """The value program (the forward, no vjp) is lowered; a forward whose targets are not
    all class indices of z (numpy would index from the end) is not."""
    from easyad.compiler.program import softmax_c
    from easyad.compiler import ir
    from easyad.tensor._program import Instruction, Program
    gc.collect()
    z = np.zeros((2, 3))
    F = ad.record(lambda z, y: nn.functional.cross_entropy(z * 2.0, y), z, np.array([1, 2]))
    assert F(z, np.array([1, 2])) == pytest.approx(np.log(3.0))
    (fp,) = _fused_programs(F)
    p = fp.plan.program
    (ce,) = [ins for kind, ins in fp.plan.schedule if kind == "py"
             and ins.op == "cross_entropy"]
    assert softmax_c.lowerable(ce, p)
    for target in ([1, -1], [1, 3]):
        bad = Instruction("cross_entropy", ir.CrossEntropy(np.array(target), 2.0), ce.ins,
                          ce.outs)
        assert not softmax_c.lowerable(bad, p)
    assert isinstance(p, Program) and len(fp.lowered) == 1


def test_linear_output_is_a_new_array_each_call():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 4)), rng.standard_normal(3)
    x1, x2 = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))

    def f(x, w, b):
        h = nn.functional.linear(x, w, b)
        return h, ad.sum(ad.tanh(nn.functional.linear(h, w[:, :3], b)))
    F = ad.record(f, x1, w, b)
    h1, v1 = F(x1, w, b)
    h2, v2 = F(x2, w, b)
    np.testing.assert_allclose(h1, x1 @ w.T + b, rtol=1e-14)
    np.testing.assert_allclose(h2, x2 @ w.T + b, rtol=1e-14)
    assert v1 == pytest.approx(np.tanh((x1 @ w.T + b) @ w[:, :3].T + b).sum(), rel=1e-13)
    (fp,) = _fused_programs(F)
    assert [run.__module__.rsplit(".", 1)[1] for fn, run, *_ in fp.steps if fn is None] \
        == ["_program", "blas_steps"], "the output's product stays the backend's"

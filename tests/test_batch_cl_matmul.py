"""TensorFunction batches on an OpenCL device whose programs have matmul and reduce
steps (easyad/compiler/program/batch_steps.py): each such step runs once per chunk of
points (one batched product), against the numpy device's batch, one replay per point
and hand-derived formulas."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
import easyad.nn.functional as nf
from easyad.compiler.program import batch_cl, batch_steps, fused_cl

from test_batch_cl import _check, _fake_gpu, _kernels, launches  # noqa: F401 (a fixture)
from conftest import OPENCL
from test_tensor_record import _opencl_usable

pytestmark = pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")

_rng = np.random.default_rng(30)
W1 = _rng.normal(size=(6, 6)) / 2
W2 = _rng.normal(size=(6, 6)) / 2
A = _rng.normal(size=(5, 6))
Y = _rng.normal(size=5)
L = _rng.normal(size=(5, 3))
W3 = _rng.normal(size=(2, 4, 5)) / 2
W4 = _rng.normal(size=(4, 5)) / 2


def mlp(x):                 # x @ W: the points' rows as one product
    return ad.sum(ad.tanh(x @ W1) @ W2)


def least_squares(w):       # A @ w: the points' vectors as the rows of one product
    return ad.sum((A @ w - Y) ** 2)


def gram(x):                # both operands the point's, transposed forms in the gradient
    return ad.sum(ad.tanh(x @ x.T))


def left(x):                # a shared matrix on the left of the point's matrix
    return ad.sum(ad.sin(L @ x))


def stacked(x):             # a shared stack of matrices: tiled to every point
    return ad.sum(ad.sin(x @ W3))


def rows(x):                # the point's matrices, several per point
    return ad.sum(ad.cos(x @ W4))


def reduced(x):             # reductions over some axes (backend reduce steps)
    return ad.sum(ad.sin(ad.sum(x, axis=0)) * ad.sum(x * x, axis=1)[0])


WL = _rng.normal(size=(5, 4)) / 2
BL = _rng.normal(size=5)
WO = _rng.normal(size=(1, 5)) / 2
XL = _rng.normal(size=(3, 4))
TL = _rng.normal(size=(3, 1))


def layers(x):              # linear steps: a point is a mini-batch of rows
    return ad.sum(nf.linear(ad.tanh(nf.linear(x, WL, BL)), WO, 0.5))


def parameters(d):          # the point is a layer's parameters: a bias row a point
    return ad.sum((nf.linear(ad.tanh(nf.linear(XL, d["w"], d["b"])), WO) - TL) ** 2)


# name: (f, a point's shape, its backend steps)
PROGRAMS = {"mlp": (mlp, (6,), {"matmul"}), "least squares": (least_squares, (6,), {"matmul"}),
            "gram": (gram, (3, 4), {"matmul"}), "left": (left, (3, 2), {"matmul"}),
            "stacked": (stacked, (3, 4), {"matmul", "reduce"}),
            "rows": (rows, (2, 3, 4), {"matmul"}), "reduced": (reduced, (3, 4), {"reduce"}),
            "layers": (layers, (3, 4), {"linear", "linear_vjp"})}
CASES = [(name, np.float64) for name in sorted(PROGRAMS)] + [
    ("mlp", np.float32), ("least squares", np.float32)]


@pytest.fixture
def products(monkeypatch):
    """The batched programs' products, as (a's shape, b's shape, transpose_a, transpose_b)."""
    made = []
    original = batch_steps._matmul

    def counting(be, a, b, ta, tb):
        made.append((a.shape, b.shape, ta, tb))
        return original(be, a, b, ta, tb)
    monkeypatch.setattr(batch_steps, "_matmul", counting)
    return made


def _host_ops(fused):
    return [step.instruction.op for step in fused.steps if isinstance(step, fused_cl.HostStep)]


@pytest.mark.parametrize("name, dtype", CASES)
def test_matmul_programs_batch(opencl_device, name, dtype, launches, products):  # noqa: F811
    f, shape, ops = PROGRAMS[name]
    x0 = np.ones(shape, dtype=dtype)
    F = ad.record(f, x0, tensor=True, device=opencl_device)
    G = ad.record(f, x0, tensor=True)
    rng = np.random.default_rng(31)
    count = 9
    X = rng.normal(size=(count,) + shape).astype(dtype)
    V = rng.normal(size=(count,) + shape).astype(dtype)
    values, grads = F.value_and_gradient(X)
    fused = F._bound["gradient"]
    assert set(_host_ops(fused)) == ops
    assert batch_cl.batched(fused) is not None
    # one launch of each kernel and one product per matmul step for the whole batch
    assert launches == {k.name: 1 for k in _kernels(fused)}, launches
    ops = _host_ops(fused)
    assert len(products) == ops.count("matmul") + ops.count("linear") + sum(
        sum(step.instruction.params.needs[:2]) for step in fused.steps
        if isinstance(step, fused_cl.HostStep) and step.instruction.op == "linear_vjp")
    np_values, np_grads = G.value_and_gradient(X)
    _check(values, np_values, dtype)
    _check(grads, np_grads, dtype)
    _check(F(X), G(X), dtype)
    _check(F.hvp(X, V), G.hvp(X, V), dtype)          # a direction per point
    _check(F.hvp(X, V[0]), G.hvp(X, V[0]), dtype)    # one for all points (stride 0)
    for b in (0, count - 1):                         # one replay per point
        value, g = F.value_and_gradient(X[b])
        _check(values[b], np.asarray(value, dtype=values.dtype), dtype)
        _check(grads[b], g, dtype)
        _check(F.hvp(X, V)[b], F.hvp(X[b], V[b]), dtype)


def test_against_hand_derived_formulas(opencl_device):
    rng = np.random.default_rng(32)
    X, V = rng.normal(size=(40, 6)), rng.normal(size=(40, 6))
    F = ad.record(least_squares, np.ones(6), tensor=True, device=opencl_device)
    values, grads = F.value_and_gradient(X)
    r = X @ A.T - Y
    np.testing.assert_allclose(values, np.sum(r * r, axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, 2 * r @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.hvp(X, V), 2 * V @ A.T @ A, rtol=1e-12, atol=1e-12)
    # the Hessian: the hvp program at every unit direction, one batch
    np.testing.assert_allclose(F.hessian(X[0]), 2 * A.T @ A, rtol=1e-12, atol=1e-12)
    M = ad.record(mlp, np.ones(6), tensor=True, device=opencl_device)
    values, grads = M.value_and_gradient(X)
    t = np.tanh(X @ W1)
    np.testing.assert_allclose(values, (t @ W2).sum(axis=1), rtol=1e-12)
    # d/dx sum(t W2) = W1 ((1 - t^2) * (W2 1))
    np.testing.assert_allclose(grads, ((1 - t * t) * W2.sum(axis=1)) @ W1.T, rtol=1e-12,
                               atol=1e-12)


def test_chunks_one_product_per_step_and_chunk(opencl_device, monkeypatch, launches,  # noqa: F811
                                               products):
    F = ad.record(mlp, np.ones(6), tensor=True, device=opencl_device)
    X = np.random.default_rng(33).normal(size=(30, 6))
    whole = F.value_and_gradient(X)
    steps = _host_ops(F._bound["gradient"]).count("matmul")
    program = batch_cl.batched(F._bound["gradient"])
    per_point = 8 * 6 * 8        # a few slots of 6 doubles each: some points a chunk
    monkeypatch.setattr(batch_cl, "_BUDGET", 4 * per_point)
    launches.clear()
    products.clear()
    chunked = F.value_and_gradient(X)
    _check(chunked[0], whole[0], np.float64)
    _check(chunked[1], whole[1], np.float64)
    chunks = launches[_kernels(F._bound["gradient"])[0].name]
    assert 1 < chunks < 30
    assert len(products) == steps * chunks
    assert program is batch_cl.batched(F._bound["gradient"])


def test_gemm_reads_transposes_in_place(opencl_device, monkeypatch, products):
    """The GEMM that GPUs get (transposed operands read in place), on this device: one
    kernel launch per product, the same numbers as the numpy device."""
    F = ad.record(gram, np.ones((3, 4)), tensor=True, device=opencl_device)
    G = ad.record(gram, np.ones((3, 4)), tensor=True)
    X = np.random.default_rng(34).normal(size=(12, 3, 4))
    F.value_and_gradient(X[:2])
    be = F._backend
    monkeypatch.setattr(be, "gemm", "new")
    gemms = []
    original = be._gemm
    monkeypatch.setattr(be, "_gemm", lambda *a, **k: gemms.append(a[2:4]) or original(*a, **k))
    products.clear()
    values, grads = F.value_and_gradient(X)
    np_values, np_grads = G.value_and_gradient(X)
    _check(values, np_values, np.float64)
    _check(grads, np_grads, np.float64)
    assert len(gemms) == len(products) == 3
    # x x^T, then the gradient's two products, one reading its left operand transposed
    # (matmul's vjp hands transposes to the GEMM as flags, not copies)
    assert {t for t in gemms} == {(False, False), (False, True), (True, False)}


def test_shared_operands(opencl_device, products):
    """A product of two operands the same at every point (an argument and a constant):
    made once, tiled to every point; an argument given as a point per row moves."""
    def f(x, w):
        return ad.sum(x * ad.tanh(w @ W4)) + ad.sum((x @ W4.T) * w)
    w = np.random.default_rng(35).normal(size=4)
    F = ad.record(f, np.ones(5), w, tensor=True, device=opencl_device)
    G = ad.record(f, np.ones(5), w, tensor=True)
    X = np.random.default_rng(36).normal(size=(7, 5))
    for arg in (w, -2 * w):
        values, grads = F.value_and_gradient(X, arg)
        np_values, np_grads = G.value_and_gradient(X, arg)
        _check(values, np_values, np.float64)
        _check(grads, np_grads, np.float64)
        want = np.sum(X * np.tanh(arg @ W4), axis=1) + (X @ W4.T) @ arg
        np.testing.assert_allclose(values, want, rtol=1e-12)
    assert ((1, 1, 4), (1, 4, 5), False, False) in products     # w @ W4 once


def branchy(x):     # a guard on a product's value
    z = x @ W1
    return ad.sum(ad.tanh(z)) if bool(ad.sum(z) > 0.0) else ad.sum(ad.exp(z))


def test_guard_divergence_falls_back(opencl_device, launches, products):  # noqa: F811
    rng = np.random.default_rng(37)
    X = rng.normal(size=(20, 6))
    up = X * np.sign((X @ W1).sum(axis=1))[:, None]          # every point: sum(z) > 0
    F = ad.record(branchy, np.abs(up[0]), tensor=True, device=opencl_device)
    values, grads = F.value_and_gradient(up)
    np.testing.assert_allclose(values, np.tanh(up @ W1).sum(axis=1), rtol=1e-12)
    assert products and launches
    mixed = up.copy()
    mixed[3] *= -1.0                                          # one point down the other branch
    with pytest.raises(ad.BranchChangedError):
        F.value_and_gradient(mixed)
    R = ad.record(branchy, np.abs(up[0]), tensor=True, device=opencl_device,
                  on_branch_change="retape")
    values, grads = R.value_and_gradient(mixed)
    z = mixed @ W1
    positive = z.sum(axis=1) > 0
    np.testing.assert_allclose(values, np.where(positive, np.tanh(z).sum(axis=1),
                                                np.exp(z).sum(axis=1)), rtol=1e-12)
    want = np.where(positive[:, None], (1 - np.tanh(z) ** 2) @ W1.T, np.exp(z) @ W1.T)
    np.testing.assert_allclose(grads, want, rtol=1e-12, atol=1e-12)


def test_parameters_as_the_point(opencl_device, products):
    """Per-point weights and biases (the point a layer's parameters), the data shared:
    the numpy device's batch and hand-derived gradients."""
    x0 = {"w": np.ones((5, 4)), "b": np.ones(5)}
    F = ad.record(parameters, x0, tensor=True, device=opencl_device)
    G = ad.record(parameters, x0, tensor=True)
    rng = np.random.default_rng(38)
    X = {"w": rng.normal(size=(8, 5, 4)), "b": rng.normal(size=(8, 5))}
    V = {"w": rng.normal(size=(8, 5, 4)), "b": rng.normal(size=(8, 5))}
    values, grads = F.value_and_gradient(X)
    assert batch_cl.batched(F._bound["gradient"]) is not None and products
    np_values, np_grads = G.value_and_gradient(X)
    _check(values, np_values, np.float64)
    h = np.tanh(np.einsum("nk,bmk->bnm", XL, X["w"]) + X["b"][:, None, :])
    r = h @ WO.T - TL                                         # (B, 3, 1)
    np.testing.assert_allclose(values, np.sum(r * r, axis=(1, 2)), rtol=1e-12)
    dz = (2 * r @ WO) * (1 - h * h)                           # (B, 3, 5)
    np.testing.assert_allclose(grads["b"], dz.sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["w"], np.einsum("bnm,nk->bmk", dz, XL), rtol=1e-12,
                               atol=1e-12)
    hv, np_hv = F.hvp(X, V), G.hvp(X, V)
    for key in x0:
        _check(grads[key], np_grads[key], np.float64)
        _check(hv[key], np_hv[key], np.float64)


@pytest.mark.parametrize("name", ["layers"])
def test_gpu_gemm_and_launch_shapes(opencl_device, name, products):
    """The device as a GPU for easyad (the GEMM that reads transposes in place, the GPU
    kernels and work-groups), against the numpy device. On the first device only: the
    GEMM's kernels take PoCL ~20 s to build cold."""
    if opencl_device != OPENCL[0]:
        pytest.skip("the first OpenCL device covers it")
    f, shape, _ = PROGRAMS[name]
    F = ad.record(f, np.ones(shape), tensor=True, device=_fake_gpu(opencl_device))
    G = ad.record(f, np.ones(shape), tensor=True)
    X = np.random.default_rng(39).normal(size=(37,) + shape)
    values, grads = F.value_and_gradient(X)
    assert F._backend.device.is_gpu and products
    np_values, np_grads = G.value_and_gradient(X)
    _check(values, np_values, np.float64)
    _check(grads, np_grads, np.float64)
    _check(F.hvp(X, X[0]), G.hvp(X, X[0]), np.float64)


def test_float_bias_on_the_numpy_device():
    """linear with a float bias in a fused numpy program (its BLAS step used to read the
    float as a slot): values and gradients by hand."""
    G = ad.record(layers, np.ones((3, 4)), tensor=True)
    X = np.random.default_rng(40).normal(size=(6, 3, 4))
    values, grads = G.value_and_gradient(X)
    h = np.tanh(X @ WL.T + BL)
    np.testing.assert_allclose(values, (h @ WO.T + 0.5).sum(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_allclose(grads, ((1 - h * h) * WO[0]) @ WL, rtol=1e-12, atol=1e-12)

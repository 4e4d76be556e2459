"""ad.linalg (issue 26 item 2): each linalg op of the table through every engine
(``check_everywhere``: numpy and OpenCL tensors, reverse mode and create_graph, TraceTensor,
ad.record(tensor=True) replayed) against numpy and torch.func (torch.linalg), and the
public functions (multi-output ones, two operands, compositions) against torch.func and
finite differences, in reverse mode, forward mode, create_graph and replay."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch.func import grad as tgrad

import easyad as ad
from easyad import ops

from _op_engines import Case, check_everywhere

L = ad.linalg
I3 = np.eye(3, dtype=np.float32)      # float32: eval_shape at float32 stays float32


def _sym(x):                       # a symmetric matrix from any, for every array kind
    return x + x.transpose(*range(x.ndim - 2), x.ndim - 1, x.ndim - 2) if x.ndim > 2 else \
        x + x.T


def _tsym(t):
    return t + t.transpose(-1, -2)


def _spd(x):                       # positive definite: x x^T + 3 I
    return x @ x.T + 3.0 * np.eye(x.shape[0])


def _case(name, ours, numpy, torch_f, shape):
    return Case(ops.get(name), ours, numpy, torch_f, shape, {}, batch_axis=None,
                scalar_engines=False)


CASES = {
    "solve": _case("solve", lambda x: L.solve(x[:, :3] + 4 * I3, x[:, 3:]),
                   lambda x: np.linalg.solve(x[:, :3] + 4 * I3, x[:, 3:]),
                   lambda t: torch.linalg.solve(t[:, :3] + 4 * torch.eye(3, dtype=t.dtype),
                                                t[:, 3:]), (3, 5)),
    "inv stacked": _case("inv", lambda x: L.inv(x + 4 * I3), lambda x: np.linalg.inv(x + 4 * I3),
                         lambda t: torch.linalg.inv(t + 4 * torch.eye(3, dtype=t.dtype)),
                         (2, 3, 3)),
    "det stacked": _case("det", lambda x: L.det(x), np.linalg.det, torch.linalg.det, (2, 3, 3)),
    "slogdet": _case("slogdet", lambda x: L.slogdet(x).logabsdet,
                     lambda x: np.linalg.slogdet(x).logabsdet,
                     lambda t: torch.linalg.slogdet(t).logabsdet, (2, 3, 3)),
    "cholesky": _case("cholesky", lambda x: L.cholesky(x @ x.T + 3 * I3),
                      lambda x: np.linalg.cholesky(x @ x.T + 3 * I3),
                      lambda t: torch.linalg.cholesky(t @ t.T + 3 * torch.eye(3, dtype=t.dtype)),
                      (3, 3)),
    "solve_triangular lower": _case(
        "solve_triangular",
        lambda x: L.solve_triangular(x[:, :3] + 4 * I3, x[:, 3:], lower=True),
        lambda x: scipy.linalg.solve_triangular(x[:, :3] + 4 * I3, x[:, 3:], lower=True),
        lambda t: torch.linalg.solve_triangular(
            torch.tril(t[:, :3] + 4 * torch.eye(3, dtype=t.dtype)), t[:, 3:], upper=False),
        (3, 5)),
    "solve_triangular upper, transposed": _case(
        "solve_triangular",
        lambda x: L.solve_triangular(x[:, :3] + 4 * I3, x[:, 3:], trans=1),
        lambda x: scipy.linalg.solve_triangular(x[:, :3] + 4 * I3, x[:, 3:], trans=1),
        lambda t: torch.linalg.solve_triangular(
            torch.triu(t[:, :3] + 4 * torch.eye(3, dtype=t.dtype)).T, t[:, 3:], upper=False),
        (3, 5)),
    "pinv tall": _case("pinv", L.pinv, np.linalg.pinv, torch.linalg.pinv, (4, 2)),
    "expm": _case("expm", L.expm, scipy.linalg.expm, torch.linalg.matrix_exp, (3, 3)),
    # the op itself: the public lu_factor reads the pivots from the numbers (a guard)
    "lu_factor": _case("lu_factor", lambda x: ops.call(ops.get("lu_factor"), (x + 4 * I3,), {}),
                       lambda x: scipy.linalg.lu_factor(x + 4 * I3)[0],
                       lambda t: _torch_packed_lu(t + 4 * torch.eye(3, dtype=t.dtype)), (3, 3)),
    "eigh": _case("eigh", lambda x: L.eigh(_sym(x)).eigenvalues * 1.0,
                  lambda x: np.linalg.eigh(_sym(x)).eigenvalues,
                  lambda t: torch.linalg.eigh(_tsym(t)).eigenvalues, (2, 3, 3)),
    "eigvalsh": _case("eigvalsh", lambda x: L.eigvalsh(_sym(x)),
                      lambda x: np.linalg.eigvalsh(_sym(x)),
                      lambda t: torch.linalg.eigvalsh(_tsym(t)), (3, 3)),
    "svd": _case("svd", lambda x: L.svd(x, full_matrices=False).S * 1.0,
                 lambda x: np.linalg.svd(x, full_matrices=False).S,
                 lambda t: torch.linalg.svd(t, full_matrices=False).S, (4, 3)),
    "svdvals": _case("svdvals", L.svdvals, lambda x: np.linalg.svd(x, compute_uv=False),
                     torch.linalg.svdvals, (2, 4)),
    "qr": _case("qr", lambda x: L.qr(x).R * 1.0, lambda x: np.linalg.qr(x).R,
                lambda t: torch.linalg.qr(t).R, (4, 3)),
}


def _torch_packed_lu(t):
    lu, _ = torch.linalg.lu_factor(t)
    return lu


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


# ---- the public functions: every output, two operands, compositions ----

def _check(ours, theirs, x, seed=1, value_rtol=1e-12, retape=False):
    """``ours`` (easyad) against ``theirs`` (torch) at x: value, reverse gradient, forward
    derivative, create_graph's H v, finite differences, ad.record(tensor=True) replayed."""
    rng = np.random.default_rng(seed)
    v = rng.normal(size=x.shape)
    tx = torch.tensor(x, dtype=torch.float64)
    close = np.testing.assert_allclose
    close(float(ours(x)), float(theirs(tx)), rtol=value_rtol)
    gradient = tgrad(theirs)(tx).numpy()
    close(ad.grad(ours)(x), gradient, rtol=1e-10, atol=1e-12)
    tt = ad.TraceTensor.variable(x, v)
    close(ours(tt).derivative, np.sum(gradient * v), rtol=1e-10, atol=1e-12)
    t = ad.Tensor.variable(x, ad.WengertList())
    d = ours(t).derivatives(create_graph=True)[t]
    hv = ad.sum(d * v).derivatives()[t]
    _, want_hv = torch.func.jvp(tgrad(theirs), (tx,), (torch.tensor(v),))
    close(hv, want_hv.numpy(), rtol=1e-9, atol=1e-10)
    h = 1e-6                                      # central differences along v
    fd = (ours(x + h * v) - ours(x - h * v)) / (2 * h)
    close(fd, np.sum(gradient * v), rtol=1e-6, atol=1e-8)
    x1 = x + 0.01 * v
    # pivots and ranks are read from the numbers: a guard, so a new point records again
    T = ad.record(ours, x, tensor=True, on_branch_change="retape" if retape else "raise")
    close(T.gradient(x1), tgrad(theirs)(torch.tensor(x1)).numpy(), rtol=1e-10, atol=1e-12)


W = np.random.default_rng(7).normal(size=(8, 8))


def _w(shape):
    return W[:shape[-2], :shape[-1]] if len(shape) == 2 else W[0, :shape[-1]]


def _tw(shape):
    return torch.tensor(_w(shape))


def _ours_loss(*parts):
    return sum(ad.sum(ad.sin(p) * _w(p.shape)) for p in parts)


def _torch_loss(*parts):
    return sum(torch.sum(torch.sin(p) * _tw(p.shape)) for p in parts)


def _spd_t(t):
    return t @ t.T + 3 * torch.eye(t.shape[0], dtype=t.dtype)


def _sym_t(t):
    return t + t.T


MULTI = {
    # eigenvector signs are LAPACK's in both; squares make the loss sign-free anyway
    "eigh, both outputs": (
        lambda x: _ours_loss(*(lambda r: (r.eigenvalues, r.eigenvectors * r.eigenvectors))(
            L.eigh(_sym(x)))),
        lambda t: _torch_loss(*(lambda r: (r.eigenvalues, r.eigenvectors * r.eigenvectors))(
            torch.linalg.eigh(_sym_t(t)))), (3, 3)),
    "eigh, upper triangle": (
        lambda x: _ours_loss(L.eigh(_sym(x), UPLO="U").eigenvalues),
        lambda t: _torch_loss(torch.linalg.eigh(_sym_t(t), UPLO="U").eigenvalues), (3, 3)),
    "svd, every output (wide)": (
        lambda x: _ours_loss(*(lambda r: (r.U * r.U, r.S, r.Vh * r.Vh))(
            L.svd(x, full_matrices=False))),
        lambda t: _torch_loss(*(lambda r: (r.U * r.U, r.S, r.Vh * r.Vh))(
            torch.linalg.svd(t, full_matrices=False))), (3, 4)),
    "svd, square": (
        lambda x: _ours_loss(*(lambda r: (r.U * r.U, r.S, r.Vh * r.Vh))(L.svd(x))),
        lambda t: _torch_loss(*(lambda r: (r.U * r.U, r.S, r.Vh * r.Vh))(torch.linalg.svd(t))),
        (3, 3)),
    "qr, Q and R": (lambda x: _ours_loss(*L.qr(x)), lambda t: _torch_loss(*torch.linalg.qr(t)),
                    (4, 3)),
    "slogdet": (lambda x: ad.sin(L.slogdet(x).logabsdet * L.slogdet(x).sign),
                lambda t: torch.sin((lambda r: r.logabsdet * r.sign)(torch.linalg.slogdet(t))),
                (3, 3)),
    "det of one matrix": (lambda x: ad.sin(L.det(x)), lambda t: torch.sin(torch.linalg.det(t)),
                          (3, 3)),
    "cholesky upper": (lambda x: _ours_loss(L.cholesky(_spd(x), upper=True)),
                       lambda t: _torch_loss(torch.linalg.cholesky(_spd_t(t), upper=True)),
                       (3, 3)),
    "solve, vector b, stacked a": (
        lambda x: _ours_loss(L.solve(x[:, :, :3] + 4 * I3, x[0, :, 3]).reshape((6,))),
        lambda t: _torch_loss(torch.linalg.solve(t[:, :, :3] + 4 * torch.eye(3, dtype=t.dtype),
                                                 t[0, :, 3]).reshape(6)), (2, 3, 4)),
    "solve_triangular, unit diagonal": (
        lambda x: _ours_loss(L.solve_triangular(x[:, :3], x[:, 3], lower=True,
                                                unit_diagonal=True)),
        lambda t: _torch_loss(torch.linalg.solve_triangular(
            torch.tril(t[:, :3], -1) + torch.eye(3, dtype=t.dtype), t[:, 3:], upper=False,
            unitriangular=True)[:, 0]), (3, 4)),
    "cho_factor, cho_solve (upper)": (
        lambda x: _ours_loss(L.cho_solve(L.cho_factor(_spd(x[:, :3])), x[:, 3:])),
        lambda t: _torch_loss(torch.linalg.solve(_spd_t(t[:, :3]), t[:, 3:])), (3, 5)),
    "cho_factor, cho_solve (lower)": (
        lambda x: _ours_loss(L.cho_solve(L.cho_factor(_spd(x[:, :3]), lower=True), x[:, 3])),
        lambda t: _torch_loss(torch.linalg.solve(_spd_t(t[:, :3]), t[:, 3])), (3, 4)),
    "lu_factor, lu_solve": (
        lambda x: _ours_loss(L.lu_solve(L.lu_factor(x[:, :3]), x[:, 3:])),
        lambda t: _torch_loss(torch.linalg.solve(t[:, :3], t[:, 3:])), (3, 5)),
    "lu_solve transposed": (
        lambda x: _ours_loss(L.lu_solve(L.lu_factor(x[:, :3]), x[:, 3:], trans=1)),
        lambda t: _torch_loss(torch.linalg.solve(t[:, :3].T, t[:, 3:])), (3, 5)),
    "lstsq": (lambda x: _ours_loss(L.lstsq(x[:, :2], x[:, 2:])[0]),
              lambda t: _torch_loss(torch.linalg.lstsq(t[:, :2], t[:, 2:]).solution), (5, 4)),
    "pinv wide": (lambda x: _ours_loss(L.pinv(x)), lambda t: _torch_loss(torch.linalg.pinv(t)),
                  (2, 4)),
    "matrix_power 3": (lambda x: _ours_loss(L.matrix_power(x, 3)),
                       lambda t: _torch_loss(torch.linalg.matrix_power(t, 3)), (3, 3)),
    "matrix_power -2": (lambda x: _ours_loss(L.matrix_power(x + 4 * I3, -2)),
                        lambda t: _torch_loss(torch.linalg.matrix_power(
                            t + 4 * torch.eye(3, dtype=t.dtype), -2)), (3, 3)),
    "norms": (lambda x: L.norm(x) + L.norm(x, 2) + L.norm(x, "nuc") + L.norm(x, 1)
              + L.norm(x, -np.inf) + ad.sum(L.norm(x, 3, axis=0) * _w((1, 3))),
              lambda t: torch.linalg.norm(t) + torch.linalg.matrix_norm(t, 2)
              + torch.linalg.matrix_norm(t, "nuc") + torch.linalg.matrix_norm(t, 1)
              + torch.linalg.matrix_norm(t, -np.inf)
              + torch.sum(torch.linalg.vector_norm(t, 3, dim=0) * _tw((1, 3))), (4, 3)),
    "expm of a stack": (lambda x: ad.sum(ad.sin(L.expm(x)) * W[:2, :3].reshape(2, 1, 3)),
                        lambda t: torch.sum(torch.sin(torch.linalg.matrix_exp(t))
                                            * torch.tensor(W[:2, :3]).reshape(2, 1, 3)),
                        (2, 3, 3)),
}


@pytest.mark.parametrize("name", list(MULTI))
def test_public_function_against_torch_and_differences(name):
    ours, theirs, shape = MULTI[name]
    x = np.random.default_rng(3).normal(size=shape)
    _check(ours, theirs, x, value_rtol=1e-10 if "expm" in name else 1e-12,   # Pade vs Taylor
           retape=name.startswith(("lu", "lstsq")))


def test_values_are_numpys_and_scipys():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(4, 4)) + 4 * np.eye(4), rng.normal(size=(4, 2))
    close = np.testing.assert_allclose
    t = ad.Tensor.constant(a)
    c, lower = L.cho_factor(_spd(a))
    close(L.cho_solve((c, lower), b), scipy.linalg.cho_solve(scipy.linalg.cho_factor(_spd(a)), b),
          rtol=1e-13)
    lu, piv = L.lu_factor(a)
    want_lu, want_piv = scipy.linalg.lu_factor(a)
    close(lu, want_lu, rtol=0, atol=0)
    assert (piv == want_piv).all()
    for trans in (0, 1):
        close(L.lu_solve((lu, piv), b, trans=trans),
              scipy.linalg.lu_solve((want_lu, want_piv), b, trans=trans), rtol=1e-13)
    tall, rhs = rng.normal(size=(6, 3)), rng.normal(size=6)
    x, residuals, rank, singular = L.lstsq(tall, rhs)
    want = np.linalg.lstsq(tall, rhs)
    close(x, want[0], rtol=1e-12)
    close(residuals, want[1], rtol=1e-12)
    assert rank == want[2]
    close(singular, want[3], rtol=1e-13)
    for order in (None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf):
        close(_number(L.norm(t, order)), np.linalg.norm(a, order), rtol=1e-13)
    for order in (None, 0, 1, 2, 3.5, np.inf, -np.inf):
        close(L.norm(t, order, axis=1, keepdims=True).value,
              np.linalg.norm(a, order, axis=1, keepdims=True), rtol=1e-13)
    y = rng.normal(size=(2, 3, 4))
    close(L.norm(y, axis=(2, 0)), np.linalg.norm(y, axis=(2, 0)), rtol=1e-13)
    close(L.matrix_power(t, 0).value, np.eye(4))


def _number(t):
    """The numbers of a result: a Tensor's value, a Record's number (a 0-d result)."""
    return np.asarray(t.value if hasattr(t, "value") else getattr(t, "number", t))


# ---- repeated eigenvalues / singular values: what the derivative is there ----

@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_repeated_eigenvalues_give_non_finite_vector_derivatives_and_finite_value_ones():
    a, weights = np.diag([2.0, 2.0, 5.0]), np.arange(9.0).reshape(3, 3)
    # through the eigenvectors (not unique at a repeat): inf/nan, never a plausible number
    for vectors in (lambda m: L.eigh(m).eigenvectors, lambda m: L.svd(m).U,
                    lambda m: L.svd(m).Vh):
        g = ad.grad(lambda m: ad.sum(vectors(m) * weights))(a)
        assert not np.isfinite(g).all()
        tt = ad.TraceTensor.variable(a, weights)
        assert not np.isfinite(vectors(tt).tangent).all()
    # a symmetric function of the values (their sum) has a derivative: the identity's
    # (eigh reads the lower triangle; svd's sum is the nuclear norm of an SPD matrix)
    for values in (lambda m: L.eigh(m).eigenvalues, L.eigvalsh, lambda m: L.svd(m).S,
                   L.svdvals):
        g = ad.grad(lambda m: ad.sum(values(m)))(a)
        np.testing.assert_array_equal(g, np.eye(3))


# ---- errors ----

def test_singular_and_indefinite_matrices_raise_linalg_error_naming_the_operation():
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    devices = ["numpy", *[d.name for d in ad.devices() if d.kind == "opencl"]]
    for device in devices:
        t = ad.Tensor.constant(singular, device=device)
        with pytest.raises(np.linalg.LinAlgError, match="linalg.solve: Singular matrix"):
            L.solve(t, np.ones(2))
        with pytest.raises(np.linalg.LinAlgError, match="linalg.inv"):
            L.inv(t)
        with pytest.raises(np.linalg.LinAlgError, match="linalg.cholesky"):
            L.cholesky(-ad.Tensor.constant(np.eye(2), device=device))
    with pytest.raises(np.linalg.LinAlgError, match="linalg.solve_triangular: singular"):
        L.solve_triangular(np.zeros((2, 2)), np.ones(2))
    with pytest.raises(np.linalg.LinAlgError, match="linalg.inv"):    # det's gradient
        ad.grad(lambda m: L.det(m))(singular)
    assert L.det(singular) == 0.0                                     # the value is fine


def test_bad_shapes_and_arguments_say_what_to_do():
    with pytest.raises(ad.ShapeError, match=r"linalg.inv: takes square matrices.*\(2, 3\)"):
        L.inv(ad.Tensor.constant(np.ones((2, 3))))
    with pytest.raises(ad.ShapeError, match=r"b must have shape \(\.\.\., 2, k\)"):
        L.solve(np.eye(2), np.ones((3, 1)))
    with pytest.raises(ad.ShapeError, match="do not broadcast"):
        L.solve(np.ones((2, 2, 2)) + np.eye(2), np.ones((3, 2, 1)))
    with pytest.raises(ad.ShapeError, match="m >= n"):
        L.qr(np.ones((2, 3)))
    with pytest.raises(ValueError, match="pass full_matrices=False"):
        L.svd(np.ones((3, 2)))
    with pytest.raises(ValueError, match="UPLO must be"):
        L.eigh(np.eye(2), UPLO="X")
    with pytest.raises(ValueError, match="leave rcond and rtol out"):
        L.pinv(np.eye(2), rcond=1e-3)
    with pytest.raises(TypeError, match="exponent must be an integer"):
        L.matrix_power(np.eye(2), 1.5)
    with pytest.raises(TypeError, match="no scalar form"):     # object arrays of Records
        lst = ad.WengertList()
        L.inv(np.array([[lst.variable(1.0), 0.0], [0.0, 1.0]], dtype=object))


# ---- numpy's functions, stacks, dtypes ----

def test_numpy_linalg_functions_dispatch_here():
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(3, 3)) + 3 * np.eye(3), rng.normal(size=3)
    t = ad.Tensor.variable(a, ad.WengertList())
    close = np.testing.assert_allclose
    close(np.linalg.solve(t, b).value, np.linalg.solve(a, b), rtol=0, atol=0)
    close(np.linalg.inv(t).value, np.linalg.inv(a), rtol=0, atol=0)
    w, v = np.linalg.eigh(t + t.T)
    close(w.value, np.linalg.eigh(a + a.T)[0], rtol=0, atol=0)
    close(_number(np.linalg.norm(t, "nuc")), np.linalg.norm(a, "nuc"), rtol=1e-14)
    close(np.linalg.matrix_power(t, 2).value, a @ a, rtol=1e-15)
    y = ad.sum(np.linalg.inv(t))              # recorded: np.linalg.inv's gradient is ours
    close(y.derivatives()[t], -(np.linalg.inv(a).T @ np.ones((3, 3)) @ np.linalg.inv(a).T),
          rtol=1e-12)
    tt = ad.TraceTensor.variable(a, np.eye(3))
    close(np.linalg.det(tt).derivative, np.linalg.det(a) * np.trace(np.linalg.inv(a)), rtol=1e-12)


def test_batching_rule_and_stacks_match_the_loop_over_matrices():
    rng = np.random.default_rng(6)
    stack = rng.normal(size=(4, 3, 3)) + 3 * np.eye(3)
    for name in ("inv", "det", "cholesky", "eigvalsh", "svdvals", "expm"):
        op = ops.get(name)
        spd = stack @ np.swapaxes(stack, -1, -2) if name == "cholesky" else stack
        by_rule = ops.batched(op, spd, 0)
        loop = np.stack([ops.call(op, (m,), {}) for m in spd])
        np.testing.assert_allclose(by_rule, loop, rtol=1e-13, atol=1e-14, err_msg=name)
    # a stacked gradient is the stack of the gradients
    grads = ad.grad(lambda m: ad.sum(L.det(m)))(stack)
    for k in range(4):
        np.testing.assert_allclose(grads[k], ad.grad(L.det)(stack[k]), rtol=1e-13)


def test_float32_keeps_its_dtype():
    a = (np.eye(3) * 2 + 0.1).astype(np.float32)
    for f in (L.inv, L.cholesky, L.expm, L.eigvalsh, lambda m: L.svd(m).S):
        out = f(ad.Tensor.constant(a))
        assert out.dtype == np.float32
    t = ad.Tensor.variable(a, ad.WengertList())
    assert ad.sum(L.inv(t)).derivatives()[t].dtype == np.float32


def test_functional_transforms_take_linalg_code():
    """ad.hessian first tries scalar code on object arrays; a linalg op refuses those
    (ObjectArrayOperand), so it differentiates with tensors instead."""
    a = np.random.default_rng(8).normal(size=(3, 3)) + 3 * np.eye(3)
    ta = torch.tensor(a)
    hessian = ad.hessian(lambda m: ad.linalg.slogdet(m).logabsdet)(a)
    want = torch.func.hessian(lambda t: torch.linalg.slogdet(t).logabsdet)(ta).numpy()
    np.testing.assert_allclose(hessian, want, rtol=1e-10, atol=1e-13)
    jac = ad.jacobian(lambda m: ad.linalg.eigvalsh(m + m.T))(a)
    want = torch.func.jacrev(lambda t: torch.linalg.eigvalsh(t + t.T))(ta).numpy()
    np.testing.assert_allclose(jac, want, rtol=1e-10, atol=1e-13)
    v = np.arange(9.0).reshape(3, 3)
    hv = ad.hvp(lambda m: ad.sum(ad.sin(ad.linalg.inv(m))), a, v)
    _, want = torch.func.jvp(torch.func.grad(lambda t: torch.sum(torch.sin(torch.linalg.inv(t)))),
                             (ta,), (torch.tensor(v),))
    np.testing.assert_allclose(hv, want.numpy(), rtol=1e-10, atol=1e-13)


def test_lu_and_cholesky_solves_of_stacks_match_scipy():
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(3, 4, 4)), rng.normal(size=(3, 4, 2))
    lu, piv = L.lu_factor(ad.Tensor.constant(a))
    for k in range(3):
        want = scipy.linalg.lu_factor(a[k])
        np.testing.assert_array_equal(lu.value[k], want[0])
        np.testing.assert_array_equal(piv[k], want[1])
        for trans in (0, 1):
            np.testing.assert_allclose(L.lu_solve((lu, piv), b, trans=trans).value[k],
                                       scipy.linalg.lu_solve(want, b[k], trans=trans),
                                       rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(L.lu_solve(L.lu_factor(a[0]), b[0, :, 0]),
                               np.linalg.solve(a[0], b[0, :, 0]), rtol=1e-12)
    spd = a @ np.swapaxes(a, -1, -2) + np.eye(4)
    np.testing.assert_allclose(L.cho_solve(L.cho_factor(spd), b), np.linalg.solve(spd, b),
                               rtol=1e-12)

"""Implicit differentiation: the derivative of a root or fixed point without unrolling.

``x* = custom_root(f, x0, args=theta)`` solves ``f(x, *theta) = 0`` with any solver (the
solver runs on plain numbers: it is never differentiated) and gives x* the derivative the
implicit function theorem says it has, ``dx*/dtheta = -J_x^-1 J_theta`` with both
Jacobians of f at the root:

- reverse mode (grad, vjp, jacobian): one TRANSPOSED solve ``J_x^T u = xbar``, then
  ``thetabar = -u^T J_theta`` (one vjp of f);
- forward mode (jvp, Traces): one jvp of f along the parameters' tangents, then one
  solve ``J_x xdot = -J_theta thetadot``.

The solves are matrix-free (GMRES on jvps of f, or on vjps for the transpose; CG when
J_x is symmetric positive definite: the Hessian of an argmin), or dense for small
systems; ``ConvergenceError`` when one does not converge.

The operation is one ``ArrayPrimitive`` (easyad/tensor/_custom.py) of the flattened
parameters, so it runs in every mode the array primitives run in: numpy arrays, Records
and object arrays of them, Tensors of every device, Traces and TraceTensors, and
``ad.record`` (a host call replayed on new values). Its vjp and jvp compute with plain
numbers; a second derivative in reverse over reverse (ad.hessian, ad.hvp, create_graph)
makes the vjp one more array primitive whose own vjp is the theorem applied again
(``_second_order_vjp``); other second-order modes and third derivatives raise.

Parameters are explicit (``args=``). A value closed over by f and being differentiated
(a Record, Trace or recorded Tensor) would get no derivative through the root, so f is
checked: called on plain numbers it must return plain numbers, else TypeError names the
fix (pass that value in ``args``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from easyad import _levels, _trees
from easyad._core import NestedTrace, Record, Trace, WengertList
from easyad.errors import ConvergenceError
from easyad._reverse_mode import _input_gradient, _input_tensor
from easyad.functional import hvp, jacobian, jvp, vjp
from easyad.tensor import sum as fsum
from easyad.tensor import Tensor, TraceTensor, get_device
from easyad.tensor._base import TensorBase
from easyad.tensor._custom import ArrayPrimitive
from easyad.transforms import implicit_krylov as krylov

Solver = Callable[[Callable[[Any], Any], Any], Any]


@contextmanager
def _outside() -> Iterator[None]:
    # the solver and the derivative's solves work on plain numbers: transforms open
    # around the call (a backward sweep, a forward level) must not see them
    with _levels.opened(*_levels.OUTSIDE):
        yield


def _numbers(v: Any) -> Any:
    """The plain numbers of a value of any mode (its derivatives dropped)."""
    if isinstance(v, (Record, Trace)):
        return float(v.number)
    if isinstance(v, (TensorBase, TraceTensor)):
        return np.array(v.value, dtype=np.float64)
    a = np.asarray(v)
    if a.dtype == object:
        return np.array([_numbers(e) for e in a.flat], dtype=np.float64).reshape(a.shape)
    return float(a) if a.ndim == 0 and not isinstance(v, np.ndarray) else \
        np.array(a, dtype=np.float64)


def _leaf(v: Any) -> Any:
    """A parameter as the array primitive takes it: a list or tuple leaf as an array (an
    object array when it holds Records or Traces, so they stay differentiated)."""
    if isinstance(v, (list, tuple)):
        a = np.asarray(v, dtype=object)
        if any(isinstance(e, (Record, Trace)) for e in a.flat):
            return a
        return np.asarray(v, dtype=np.float64)
    return v


def _differentiable(v: Any) -> bool:
    """Whether the primitive gives parameter ``v`` a derivative (float numbers and arrays;
    integers, strings and the like are static: passed to f as they are)."""
    return isinstance(v, (float, np.floating)) or \
        (isinstance(v, np.ndarray) and v.dtype.kind == "f")


class _Problem:
    """``f(x, *args) = 0`` at plain parameter values: the residual, its Jacobian's
    products at a point, and the checks on what f returns."""

    def __init__(self, name: str, f: Callable[..., Any], tree: _trees.TreeDef,
                 shape: tuple[int, ...], values: tuple[Any, ...]) -> None:
        self.name, self.f, self.tree, self.shape = name, f, tree, shape
        self.values = values
        self.size = int(np.prod(shape, dtype=np.int64))
        self.recording: _Recording | None = None

    def call(self, x: Any, *values: Any) -> Any:
        return self.f(x, *_trees.unflatten(self.tree, list(values)))

    def residual(self, x: Any) -> Any:
        """f at plain numbers, checked: plain numbers of x's shape."""
        r = self.call(x, *self.values)
        if isinstance(r, TensorBase) and not isinstance(r, TraceTensor) and r.tape is None:
            r = r.value                       # a constant Tensor: its numbers
        a = np.asarray(r) if not isinstance(r, (TensorBase, TraceTensor)) else None
        if a is None or a.dtype == object or isinstance(r, (Record, Trace)):
            raise TypeError(
                f"{self.name}: f returned {type(r).__name__} values (carrying derivatives) "
                f"when called on plain numbers: it closes over a value being "
                f"differentiated (a Record, Trace or recorded Tensor), whose derivative "
                f"would be lost through the root; pass that value to f through "
                f"args=(...) instead")
        if a.shape != self.shape:
            raise ValueError(f"{self.name}: f must return one residual per unknown, of "
                             f"x's shape {self.shape}; got shape {a.shape}")
        return np.array(a, dtype=np.float64)

    def at(self) -> Callable[[Any], Any]:
        """f as a function of x alone (any mode: a solver may differentiate it)."""
        return lambda z: self.call(z, *self.values)

    # ---- products with J_x at the root, on flat vectors ----
    def forward(self, root: np.ndarray) -> krylov.Matvec:
        g = self.at()
        return lambda v: np.ravel(jvp(g, root, v.reshape(self.shape))[1])

    def transposed(self, root: np.ndarray) -> krylov.Matvec:
        if self.recording is not None:
            return self.recording.transposed
        return _transposed(self.at(), root)

    def jacobian(self, root: np.ndarray) -> np.ndarray:
        return _dense_jacobian(self.at(), root)


class _Recording:
    """Reverse mode's one recording of f at the root: x and the parameters being
    differentiated as variables of one list (numbers as 0-d Tensors, which meet numpy
    arrays as Tensors do). The transposed solve sweeps it once per product, from the
    seed w, and the parameters' cotangent is one more sweep: f is recorded once in all."""

    def __init__(self, p: _Problem, root: np.ndarray, wanted: list[int]) -> None:
        tape = WengertList()
        self.shape = p.shape
        self.x = _input_tensor(np.ascontiguousarray(root, dtype=np.float64), tape, True)
        values = list(p.values)
        self.params = {}
        for k in wanted:
            v = np.array(values[k], dtype=np.float64)       # (0-d stays 0-d)
            values[k] = self.params[k] = _input_tensor(v, tape, True)
        self.out = p.call(self.x, *values)
        self.usable = isinstance(self.out, Tensor) and self.out.tape is tape and \
            tuple(self.out.shape) == p.shape

    def transposed(self, w: np.ndarray) -> np.ndarray:
        return np.ravel(_input_gradient(self.x, self.out.derivatives(w.reshape(self.shape))))

    def parameters(self, w: np.ndarray) -> dict[int, Any]:
        d = self.out.derivatives(w.reshape(self.shape))
        return {k: _input_gradient(t, d) for k, t in self.params.items()}


def _transposed(g: Callable[[Any], Any], root: np.ndarray) -> krylov.Matvec:
    """``w -> J^T w`` for J the Jacobian of ``g`` at ``root`` (flat vectors). For an array
    x, g is recorded ONCE and each product is one backward sweep of that tape from the
    seed w (tens of times cheaper than a vjp, which records g again per call); otherwise
    (a number x, an output that is no Tensor of x's shape) one ``ad.vjp`` per product."""
    shape = np.shape(root)
    if shape:
        tape = WengertList()
        x = _input_tensor(np.ascontiguousarray(root, dtype=np.float64), tape, True)
        out = g(x)
        if isinstance(out, Tensor) and out.tape is tape and tuple(out.shape) == shape:
            def swept(w: np.ndarray) -> np.ndarray:
                return np.ravel(_input_gradient(x, out.derivatives(w.reshape(shape))))
            return swept
    return lambda w: np.ravel(vjp(g, root, w.reshape(shape))[1])


def _dense_jacobian(g: Callable[[Any], Any], root: np.ndarray) -> np.ndarray:
    """J of ``g`` at ``root`` as an (n, n) matrix: the transposed products of unit vectors."""
    n = int(np.size(root))
    return krylov.dense(_transposed(g, root), n).T


class _Derivatives:
    """How a root's derivatives are computed: the tangent solve's method (or the user's
    ``tangent_solve(matvec, b)``), its tolerance, and whether the residual is affine in x
    (a linear system: J_x v is then f(v) - f(0), with no derivative of f needed)."""

    def __init__(self, name: str, tangent_solve: Any, rtol: float, atol: float,
                 maxiter: int | None, affine: bool) -> None:
        if not callable(tangent_solve) and tangent_solve not in krylov.METHODS:
            raise ValueError(f"{name}: tangent_solve must be one of "
                             f"{', '.join(map(repr, krylov.METHODS))} or a callable "
                             f"tangent_solve(matvec, b), got {tangent_solve!r}")
        self.name, self.method, self.rtol, self.atol = name, tangent_solve, rtol, atol
        self.maxiter, self.affine = maxiter, affine

    def solve(self, problem: _Problem, root: np.ndarray, b: np.ndarray,
              transpose: bool) -> np.ndarray:
        """The flat solution of ``J_x y = b`` (``J_x^T y = b`` when ``transpose``)."""
        method = self.method
        what = f"{self.name}'s derivative ({'transposed ' if transpose else ''}" \
               f"solve with the Jacobian of f at the root)"
        if method == "dense":
            a = problem.jacobian(root)
            return krylov.solve_matrix(a.T if transpose else a, b, what, rtol=self.rtol,
                                       atol=self.atol)
        if self.affine and (not transpose or method == "cg"):
            zero = np.ravel(problem.residual(np.zeros(problem.shape)))

            def product(v: np.ndarray) -> np.ndarray:
                return np.ravel(problem.residual(v.reshape(problem.shape))) - zero
        else:
            # CG: J_x symmetric, so it is its transpose, whose recorded sweeps are the
            # cheapest products (see _transposed); GMRES forward: one jvp per product
            product = problem.transposed(root) if transpose or method == "cg" else \
                problem.forward(root)  # type: ignore[assignment]
        if callable(method):
            y = method(lambda v: product(np.ravel(v)).reshape(problem.shape),
                       b.reshape(problem.shape))
            y = np.asarray(_numbers(y), dtype=np.float64)
            if y.shape != problem.shape:
                raise ValueError(f"{what}: tangent_solve returned shape {y.shape}, not "
                                 f"x's {problem.shape}")
            return y.reshape(-1)
        return krylov.solve(product, b, method, rtol=self.rtol, atol=self.atol,
                            maxiter=self.maxiter, what=what)


def _operation(name: str, f: Callable[..., Any], x0: Any, solve: Solver,
               derivatives: _Derivatives, args: Any, root_rtol: float | None) -> Any:
    """The root as one array primitive of the flattened parameters."""
    if not isinstance(args, tuple):
        args = (args,)
    leaves, tree = _trees.flatten(_trees.Arguments(args))
    leaves = [_leaf(v) for v in leaves]
    if any(type(v) is NestedTrace or isinstance(v, np.ndarray) and v.dtype == object
           and any(type(e) is NestedTrace for e in v.flat) for v in leaves):
        raise _second_order(name)        # forward over forward (Traces of Traces)
    start = _numbers(x0)
    shape = tuple(np.shape(start))

    def problem(values: tuple[Any, ...]) -> _Problem:
        return _Problem(name, f, tree, shape, values)

    def find(*values: Any) -> np.ndarray:
        p = problem(values)
        with _outside():
            p.residual(start)       # f on plain numbers gives plain numbers (closures)
            found = solve(p.at(), start.copy() if shape else start)
            root = np.asarray(_numbers(found), dtype=np.float64)
            if root.shape != shape:
                raise ValueError(f"{name}: the solver returned shape {root.shape}, not "
                                 f"x0's {shape}")
            if root_rtol is not None:
                _check_root(p, root, start, root_rtol)
        return root

    def reverse(g: Any, *rest: Any) -> tuple[Any, ...]:
        if any(_carries(v) for v in (g, *rest)):
            # a second derivative: the vjp itself as an operation (see _second_order_vjp)
            return _second_order_vjp(name, problem, derivatives, reverse, g, rest)
        values, root = rest[:-1], np.asarray(rest[-1], dtype=np.float64)
        wanted = [k for k, v in enumerate(values) if _differentiable(v)]
        cts: list[Any] = [None] * len(values)
        if not wanted:
            return tuple(cts)
        p = problem(values)
        with _outside():
            recording = _Recording(p, root, wanted) if shape else None
            if recording is not None and recording.usable:
                p.recording = recording
            u = derivatives.solve(p, root, np.ravel(np.asarray(g, dtype=np.float64)), True)
            # thetabar = -u^T J_theta: one more sweep of the recording, or one vjp of f in
            # the parameters (and in x, whose cotangent is dropped: x then has the
            # parameters' kind, where a numpy x would meet a Record as an object array)
            if p.recording is not None:
                found = p.recording.parameters(-u)
                parts = [found[k].reshape(np.shape(values[k])) for k in wanted]
            else:
                parts = vjp(p.call, root, -u.reshape(shape), *values,
                            argnums=(0, *(1 + k for k in wanted)))[1][1:]
        for k, ct in zip(wanted, parts):
            cts[k] = float(ct) if np.ndim(values[k]) == 0 else ct
        return tuple(cts)

    def forward(tangents: tuple[Any, ...], *rest: Any) -> np.ndarray:
        if any(_carries(v) for v in (*tangents, *rest)):
            raise _second_order(name)
        values, root = rest[:-1], np.asarray(rest[-1], dtype=np.float64)
        moving = [k for k, (v, t) in enumerate(zip(values, tangents))
                  if _differentiable(v) and np.any(t)]
        if not moving:
            return np.zeros(shape)
        p = problem(values)
        with _outside():
            b = _parameter_tangent(p, root, values, tangents, moving)
            y = derivatives.solve(p, root, -np.ravel(np.asarray(b, dtype=np.float64)), False)
        return y.reshape(shape)

    # differentiable=True: a second derivative calls `reverse` on recorded values (see
    # _second_order_vjp); forward over anything reaches `forward`'s error
    primitive = ArrayPrimitive(name, find, vjp=reverse, jvp=forward, differentiable=True)
    out = primitive(*leaves)
    return float(out) if isinstance(out, np.ndarray) and out.shape == () else out


def _second_order_vjp(name: str, problem: Callable[..., _Problem],
                      derivatives: _Derivatives, first: Callable[..., Any], g: Any,
                      rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """The vjp of the root on recorded values (create_graph, Hessians): the parameters'
    cotangents V(g, theta, x) = -J_theta^T J_x^-T g as ONE array primitive (the wanted
    cotangents flattened and joined), whose own vjp is the second-order formula: with u =
    J_x^-T g, phi(x, theta) = u . f(x, theta) and w = J_x^-1 J_theta c for a cotangent c,

        gbar = -w,  (xbar, thetabar) = grad_(x, theta) [grad_x phi . w - grad_theta phi . c]

    (an HVP of phi along (w, -c), on plain numbers). Third derivatives: the error."""
    values = rest[:-1]
    wanted = [k for k, v in enumerate(values) if _carries(v)]
    shapes = [tuple(np.shape(v)) for v in values]
    sizes = [int(np.prod(shapes[k], dtype=np.int64)) for k in wanted]

    def joined(gv: Any, *plain: Any) -> np.ndarray:
        cts = first(gv, *plain)
        return np.concatenate([np.ravel(np.asarray(cts[k], dtype=np.float64)) for k in wanted])

    def joined_vjp(c: Any, gv: Any, *plain: Any) -> tuple[Any, ...]:
        if any(_carries(v) for v in (c, gv, *plain)):
            raise _second_order(name)          # a third derivative
        vals, root = plain[:-2], np.asarray(plain[-2], dtype=np.float64)
        p = problem(vals)
        shape = p.shape
        parts = np.split(np.asarray(c, dtype=np.float64).reshape(-1), np.cumsum(sizes)[:-1])
        cs = [np.zeros(shapes[k]) for k in range(len(vals))]
        for k, part in zip(wanted, parts):
            cs[k] = part.reshape(shapes[k])
        with _outside():
            u = derivatives.solve(p, root, np.ravel(np.asarray(gv, dtype=np.float64)), True)
            jc = _parameter_tangent(p, root, vals, tuple(cs), wanted)
            w = derivatives.solve(p, root, np.ravel(np.asarray(jc, dtype=np.float64)), False)

            def phi(z: tuple[Any, ...]) -> Any:
                x, moved = z[0], z[1:]
                point = list(vals)
                for k, m in zip(wanted, moved):
                    point[k] = m.reshape(shapes[k])
                return fsum(u.reshape(shape) * p.call(x.reshape(shape), *point))
            hv = hvp(phi, (np.ravel(root), *(np.ravel(np.asarray(vals[k], dtype=np.float64))
                                               for k in wanted)),
                     (w, *(-np.ravel(cs[k]) for k in wanted)))
        result: list[Any] = [-w.reshape(np.shape(gv))] + [None] * len(vals) + \
            [np.asarray(hv[0]).reshape(shape)]
        for k, h in zip(wanted, hv[1:]):
            result[1 + k] = np.asarray(h).reshape(shapes[k])
        return tuple(result)

    # differentiable=True so that a third derivative reaches joined_vjp's error
    primitive = ArrayPrimitive(f"{name}_vjp", joined, vjp=joined_vjp, differentiable=True)
    flat = primitive(g, *rest)
    cts: list[Any] = [None] * len(values)
    start = 0
    for k, size in zip(wanted, sizes):
        cts[k] = flat[start:start + size].reshape(shapes[k])
        start += size
    return tuple(cts)


def _parameter_tangent(p: _Problem, root: np.ndarray, values: tuple[Any, ...],
                       tangents: tuple[Any, ...], moving: list[int]) -> Any:
    """J_theta thetadot: f at the root along the parameters' tangents, one forward pass.
    x and the moving parameters are TraceTensors of one level (numbers as 0-d ones, which
    meet numpy arrays as tensors do; a Trace would meet them as an object array); when f
    returns no TraceTensor, ``ad.jvp`` with x as a moving argument instead."""
    directions = [np.reshape(np.asarray(tangents[k], dtype=np.float64), np.shape(values[k]))
                  for k in moving]
    if p.shape:
        device = get_device()
        point = list(values)
        for k, t in zip(moving, directions):
            point[k] = TraceTensor._input(np.array(values[k], dtype=np.float64), t, device)
        x = TraceTensor._input(np.array(root), np.zeros(p.shape), device)
        with _levels.opened(1, None):          # the level a top-level jvp opens
            out = p.call(x, *point)
        if isinstance(out, TraceTensor) and tuple(out.shape) == p.shape:
            return np.asarray(out.tangent, dtype=np.float64)
    scalars = [float(d) if d.ndim == 0 else d for d in directions]
    return jvp(p.call, root, (np.zeros(p.shape) if p.shape else 0.0, *scalars), *values,
               argnums=(0, *(1 + k for k in moving)))[1]


def _carries(v: Any) -> bool:
    return isinstance(v, (Record, Trace, TensorBase, TraceTensor)) or \
        (isinstance(v, np.ndarray) and v.dtype == object)


def _second_order(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name}: this derivative is not supported through a root: second derivatives "
        f"are taken in reverse over reverse (ad.hessian, ad.hvp, create_graph=True), not "
        f"forward over anything (ad.jacobian(mode='forward') of a gradient, Traces of "
        f"Traces), and not to third order; use ad.hessian / ad.hvp, or write the "
        f"higher-order implicit equation as a custom_root of its own")


def _check_root(p: _Problem, root: np.ndarray, start: Any, rtol: float) -> None:
    """The solver's answer must be a root: the theorem's derivative is wrong elsewhere."""
    final = float(np.linalg.norm(p.residual(root)))
    scale = max(1.0, float(np.linalg.norm(p.residual(start))))
    if not np.isfinite(final) or final > rtol * scale:
        raise ConvergenceError(
            f"{p.name}: the solver's answer is not a root: |f(x)| = {final:.3g} > "
            f"root_rtol * max(1, |f(x0)|) = {rtol * scale:.3g}; the implicit derivative "
            f"holds only at a root: solve more tightly, or raise root_rtol")


# ---- the default solvers ----

def newton(residual: Callable[[Any], Any], x0: Any, *, rtol: float = 1e-12,
           maxiter: int = 50) -> Any:
    """Newton's method with the Jacobian from ``ad.jacobian`` (dense: for small systems),
    halving the step while it does not reduce ``norm(f)``; ConvergenceError after
    ``maxiter``."""
    x = np.array(x0, dtype=np.float64)
    r = np.asarray(residual(x), dtype=np.float64)
    scale = max(1.0, float(np.linalg.norm(r)))
    for _ in range(maxiter):
        norm = float(np.linalg.norm(r))
        if norm <= rtol * scale:
            return x if x.shape else float(x)
        j = _dense_jacobian(residual, x) if x.shape else \
            np.asarray(jacobian(residual)(x), dtype=np.float64).reshape(1, 1)
        try:
            step = np.linalg.solve(j, r.reshape(-1)).reshape(x.shape)
        except np.linalg.LinAlgError:
            raise ConvergenceError(f"newton: the Jacobian of f is singular at x = {x!r}; "
                                   f"start elsewhere or pass your own solve=") from None
        t = 1.0
        while True:
            trial = x - t * step
            rt = np.asarray(residual(trial), dtype=np.float64)
            if np.linalg.norm(rt) < norm or t < 1e-4:
                break
            t *= 0.5
        x, r = trial, rt
    if float(np.linalg.norm(r)) <= rtol * scale:
        return x if x.shape else float(x)
    raise ConvergenceError(f"newton: |f(x)| = {float(np.linalg.norm(r)):.3g} after {maxiter} "
                           f"steps (wanted {rtol * scale:.3g}); pass solve= with a better "
                           f"solver or start nearer a root")


def iterate(g: Callable[[Any], Any], x0: Any, *, rtol: float = 1e-12,
            maxiter: int = 1000) -> Any:
    """Fixed-point iteration ``x <- g(x)`` until the step is below ``rtol * max(1, |x|)``
    (max norms); ConvergenceError after ``maxiter`` steps."""
    x = np.array(x0, dtype=np.float64)
    step = np.inf
    for _ in range(maxiter):
        nxt = np.asarray(g(x), dtype=np.float64)
        if not np.all(np.isfinite(nxt)):
            step = np.inf
            break
        # max norms: no squares to overflow while an iteration diverges
        step = float(np.max(np.abs(nxt - x), initial=0.0))
        x = nxt
        if step <= rtol * max(1.0, float(np.max(np.abs(x), initial=0.0))):
            return x if x.shape else float(x)
    raise ConvergenceError(f"fixed_point: x <- g(x) did not settle in {maxiter} steps (the "
                           f"last step moved x by {step:.3g}); g must be a contraction near "
                           f"its fixed point, or pass solve= with a better solver")


# ---- the public transforms ----

def custom_root(f: Callable[..., Any], x0: Any, solve: Solver | None = None,
                tangent_solve: Any = "gmres", *, args: Any = (), rtol: float = 1e-10,
                atol: float = 0.0, maxiter: int | None = None,
                root_rtol: float | None = 1e-6) -> Any:
    """The root ``x`` of ``f(x, *args) = 0``, differentiable in ``args`` by the implicit
    function theorem (one linear solve with f's Jacobian at the root; the solver is never
    differentiated).

    Parameters
    ----------
    f : callable
        ``f(x, *args)``: the residual, x's shape, written with easyad operations (its
        derivatives at the root are taken by ``ad.jvp``/``ad.vjp``).
    x0 : float or array
        Where the solver starts (x's shape; its derivative is not used: a root does not
        depend on where the search began).
    solve : callable, optional
        ``solve(residual, x0)`` returns a root of ``residual`` (a function of x alone,
        on plain numbers). Default: Newton's method with a dense Jacobian
        (:func:`newton`: small systems).
    tangent_solve : "gmres", "cg", "dense" or callable
        How ``J y = b`` is solved for the derivative: GMRES on products with J (matrix
        free: jvps of f, vjps for the transposed solve of reverse mode); CG when J is
        symmetric positive definite (the Hessian at a minimum: J^T = J, so no vjp); the
        dense J from ``ad.jacobian`` (small systems); or your ``tangent_solve(matvec, b)``
        returning y with ``matvec(y) = b`` (x-shaped arrays; in reverse mode matvec is
        the transposed product).
    args : tuple
        f's parameters (numbers, arrays, Tensors, Records, Traces, or structures of
        them): what the root is differentiated in.
    rtol, atol, maxiter
        The derivative's linear solves' tolerances (``norm(J y - b) <= max(rtol *
        norm(b), atol)``) and iteration limit.
    root_rtol : float or None
        The solver's answer is refused (``ConvergenceError``) when ``|f(x)| > root_rtol *
        max(1, |f(x0)|)``: the theorem's derivative is only right at a root. None: not
        checked.

    Reverse and forward mode give first derivatives; ``ad.hessian``, ``ad.hvp`` and
    ``create_graph=True`` second derivatives (reverse over reverse).

    Examples
    --------
    >>> import easyad as ad
    >>> sqrt = lambda a: ad.custom_root(lambda x, a: x * x - a, 1.0, args=(a,))
    >>> round(sqrt(2.0), 12), round(ad.grad(sqrt)(2.0), 12)      # 1 / (2 sqrt(2))
    (1.414213562373, 0.353553390593)
    """
    if not callable(f):
        raise TypeError(f"custom_root: f must be callable, got {type(f).__name__}")
    if solve is not None and not callable(solve):
        raise TypeError(f"custom_root: solve must be callable solve(residual, x0), got "
                        f"{solve!r}")
    derivatives = _Derivatives("custom_root", tangent_solve, rtol, atol, maxiter, False)
    return _operation("custom_root", f, x0, solve or newton, derivatives, args, root_rtol)


def fixed_point(g: Callable[..., Any], x0: Any, solve: Solver | None = None,
                tangent_solve: Any = "gmres", *, args: Any = (), rtol: float = 1e-10,
                atol: float = 0.0, maxiter: int | None = None,
                root_rtol: float | None = 1e-6) -> Any:
    """The fixed point ``x = g(x, *args)``, differentiable in ``args`` by the implicit
    function theorem applied to ``g(x, *args) - x = 0`` (one linear solve with ``I -
    dg/dx``; the iteration is never differentiated).

    ``solve(g_of_x, x0)`` finds the fixed point of ``g_of_x`` (plain numbers); default:
    :func:`iterate` (``x <- g(x)``, for contractions). The other parameters are
    :func:`custom_root`'s (``tangent_solve="cg"`` needs ``I - dg/dx`` symmetric positive
    definite).

    Examples
    --------
    >>> import easyad as ad
    >>> # x = cos(a x): differentiate the fixed point in a
    >>> x = lambda a: ad.fixed_point(lambda x, a: ad.cos(a * x), 0.5, args=(a,))
    >>> d = ad.grad(x)(1.0)
    >>> s = x(1.0)
    >>> abs(d - (-s * ad.sin(s) / (1 + ad.sin(s)))) < 1e-12
    True
    """
    if not callable(g):
        raise TypeError(f"fixed_point: g must be callable, got {type(g).__name__}")
    if solve is not None and not callable(solve):
        raise TypeError(f"fixed_point: solve must be callable solve(g, x0), got {solve!r}")
    user = solve or iterate

    def residual(x: Any, *a: Any) -> Any:
        return g(x, *a) - x

    def find(r: Callable[[Any], Any], start: Any) -> Any:
        # the solver iterates g itself: r(x) + x = g(x) at the parameters' numbers
        return user(lambda x: r(x) + x, start)

    derivatives = _Derivatives("fixed_point", tangent_solve, rtol, atol, maxiter, False)
    return _operation("fixed_point", residual, x0, find, derivatives, args, root_rtol)


__all__ = ["custom_root", "fixed_point", "iterate", "newton"]

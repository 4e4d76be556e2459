"""The derivative transforms inside ``ad.vmap``: grad, jacobian, hessian, jvp, vjp and hvp
of one example, run once on the whole batch.

Called with batched arguments (or inside a vmap, where f may close over batched values),
a transform differentiates ``F``, f on the whole batch: ``F(X) = f(X[b])`` for every b at
once. The examples are independent, so

- grad: the gradient of ``sum_b f(X[b])`` with respect to X is every example's gradient;
- jvp / vjp / hvp: F's, with the direction or weights of every example;
- jacobian: a jvp (forward) or vjp (reverse) along each element of one example's input
  (or output), in every example at once; the basis is one more batch (a vmap of its own
  level around the jvp or vjp), so all of them are one pass, as torch's and JAX's;
- hessian: an hvp along each element of one example's input, the basis batched likewise.

A differentiated argument that is not batched is broadcast along the batch first: each
example then has its own copy, whose derivative is that example's (grad and
value_and_grad of float64 arrays under one vmap, at the top level, make no copy:
``vmap_shared.py``). The level lifted is
the highest batched level among the arguments and the vmaps running, less those being
lifted already (the transform's own calls of F must not lift again); F gives f back the
lifted levels it had, so transforms that f calls lift as usual.
"""
from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _higher, _trees, functional
from easyad._evaluation import in_program
from easyad._forward_mode import _forward_point, _forward_run
from easyad._levels import LEVEL as _LEVEL
from easyad._reverse_mode import _Reverse
from easyad.tensor import Tensor, TraceTensor
from easyad.tensor import _generic
from easyad.tensor._interpreters import new_tensor_backend
from easyad.transforms import vmap_shared
from easyad.transforms.vmap_batched import Batched, _shape, expanded

LIFTED: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "easyad_vmap_lifted", default=frozenset())


def lift(opened: Any, vmap: Callable[..., Any], name: str, f: Callable[..., Any],
         args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """Transform ``name`` of f at ``args`` on the batch, or NotImplemented where nothing
    of it is batched (the transform then runs as usual)."""
    lifted = LIFTED.get()
    sizes = {level: size for level, size in opened.get() if level not in lifted}
    leaves, _ = _trees.flatten((args, options.get("v"), options.get("u")))
    for v in leaves:
        if isinstance(v, Batched) and v._level not in lifted:
            sizes[v._level] = v._size
    if not sizes:
        return NotImplemented
    level = max(sizes)
    token = LIFTED.set(lifted | {level})
    try:
        F = _Lifted(f, level, sizes[level], lifted, vmap)
        F.alone = len(sizes) == 1 and not lifted      # (one vmap: vmap_shared may run)
        return _LIFTS[name](F, args, options)
    finally:
        LIFTED.reset(token)


class _Lifted:
    """f on the whole batch of one level: unbatched arguments in, unbatched results out."""

    def __init__(self, f: Callable[..., Any], level: int, size: int,
                 lifted: frozenset[int], vmap: Callable[..., Any]) -> None:
        self.f, self.level, self.size, self.lifted = f, level, size, lifted
        self.vmap = vmap          # (ad.vmap, given by vmap.py: the basis batched too)
        self.marks: list[list[bool]] = []
        self.alone = False

    def unwrap(self, args: tuple[Any, ...], differentiated: set[int],
               shared: Callable[[Any], bool] | None = None) -> list[Any]:
        """The arguments as whole batches (differentiated ones always batched, except
        the leaves that ``shared`` takes: those stay as they are, unmarked)."""
        out = []
        self.marks = []
        for k, a in enumerate(args):
            leaves, tree = _trees.flatten(a)
            flags = [isinstance(v, Batched) and v._level == self.level for v in leaves]
            if k in differentiated and shared is not None:
                flags = [f or not shared(v) for v, f in zip(leaves, flags)]
            else:
                flags = [f or k in differentiated for f in flags]
            values = [self.batch_of(v) if f else v for v, f in zip(leaves, flags)]
            self.marks.append(flags)
            out.append(_trees.unflatten(tree, values) if any(self.marks[-1]) else a)
        return out

    def batch_of(self, v: Any) -> Any:
        if isinstance(v, Batched) and v._level == self.level:
            return v._value
        if isinstance(v, (list, tuple, int, float)):
            v = np.asarray(v, dtype=np.float64)
        value = expanded(v, self.size)   # (made contiguous once: a broadcast view in
        # a transform's point is read element by element, several times slower)
        return np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value

    def __call__(self, *xs: Any) -> Any:
        given = []
        for x, marks in zip(xs, self.marks + [[]] * (len(xs) - len(self.marks))):
            if not any(marks):
                given.append(x)
                continue
            leaves, tree = _trees.flatten(x)
            given.append(_trees.unflatten(tree, [
                Batched(v, self.level, self.size) if m else v for v, m in zip(leaves, marks)]))
        token = LIFTED.set(self.lifted)
        try:
            out = self.f(*given)
        finally:
            LIFTED.reset(token)
        return self.whole(out)

    def whole(self, out: Any) -> Any:
        leaves, tree = _trees.flatten(out)
        return _trees.unflatten(tree, [self.batch_of(v) for v in leaves])

    def rewrap(self, result: Any) -> Any:
        leaves, tree = _trees.flatten(result)
        return _trees.unflatten(tree, [Batched(v, self.level, self.size) for v in leaves])


def _argnums(options: dict[str, Any], count: int) -> tuple[int, ...]:
    argnums = options.get("argnums", 0)
    items = argnums if isinstance(argnums, tuple) else (argnums,)
    return tuple(a + count if a < 0 else a for a in items)


def _one(options: dict[str, Any], count: int, name: str) -> int:
    argnums = _argnums(options, count)
    if isinstance(options.get("argnums", 0), tuple) or options.get("has_aux"):
        raise NotImplementedError(f"ad.{name} inside ad.vmap takes one argnum and no "
                                  f"has_aux (differentiate a function of one argument)")
    return argnums[0]


def _total(out: Any) -> Any:
    total: Any = 0.0
    for leaf in _trees.flatten(out)[0]:
        if len(_shape(leaf)) != 1:
            raise TypeError(f"ad.grad inside ad.vmap: f must return one number per example, "
                            f"got shape {_shape(leaf)[1:]} per example")
        total = total + _generic.sum(leaf)
    return total


def _value_and_grad(F: _Lifted, args: tuple[Any, ...], options: dict[str, Any],
                    value: bool = True) -> Any:
    argnums, aux = options.get("argnums", 0), options.get("has_aux", False)
    differentiated = set(_argnums(options, len(args)))
    if F.alone and any(vmap_shared.usable(v) for k in differentiated
                       for v in _trees.flatten(args[k])[0]):
        # weights not batched: one array, per-example gradients from probes
        xs = F.unwrap(args, differentiated, vmap_shared.usable)
        return vmap_shared.value_and_grad(F, xs, argnums, aux, value, _total)
    xs = F.unwrap(args, differentiated)

    def summed(*ys: Any) -> Any:
        out = F(*ys)
        if not value:            # (ad.grad: the values are not read, so not guarded)
            return (_total(out[0]), out[1]) if aux else _total(out)
        return _total(out[0] if aux else out), out      # (per-example values: the aux)

    if not value:
        gradient = functional.grad(summed, argnums=argnums, has_aux=aux)(*xs)
        if aux:
            return F.rewrap(gradient[0]), F.rewrap(gradient[1])
        return F.rewrap(gradient)
    (_, out), gradient = functional.value_and_grad(summed, argnums=argnums,
                                                    has_aux=True)(*xs)
    return F.rewrap(out), F.rewrap(gradient)


def _grad(F: _Lifted, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    return _value_and_grad(F, args, options, value=False)


def _basis(x: Any, size: int) -> np.ndarray:
    """The directions along each element of every example at once: (size, B, *s), the
    k-th 1.0 at element k of every example (made in one array, not stacked)."""
    shape = _shape(x)
    basis = np.zeros((size, shape[0], size))
    k = np.arange(size)
    basis[k, :, k] = 1.0
    return basis.reshape((size,) + tuple(shape))


# f -> the (argnum, batch shape, dtype) at which "auto" picked forward mode (weakly: a
# function that cannot be referenced weakly is probed every call, as before)
_FORWARD_PICKED: weakref.WeakKeyDictionary[Any, set[Any]] = weakref.WeakKeyDictionary()


def _forward_picked(f: Any, key: Any) -> bool:
    try:
        return key in _FORWARD_PICKED.get(f, ())
    except TypeError:
        return False


def _remember_forward(f: Any, key: Any) -> None:
    try:
        _FORWARD_PICKED.setdefault(f, set()).add(key)
    except TypeError:
        pass


def _jacobian(F: _Lifted, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    k = _one(options, len(args), "jacobian")
    xs = F.unwrap(args, {k})
    x = xs[k]

    def one(z: Any) -> Any:
        return F(*xs[:k], z, *xs[k + 1:])
    s = _shape(x)[1:]
    n = int(np.prod(s, dtype=np.int64))
    mode = options.get("mode", "auto")
    run = None
    # "auto" picked forward mode for this f at this batch's shape before: f's values are
    # not computed first to learn m again (they only choose the mode, never the result)
    shape_key = (k, _shape(x), str(getattr(x, "dtype", "")))
    known = mode == "auto" and not in_program(x) and _forward_picked(F.f, shape_key)
    if mode != "forward" and in_program(x):
        # recorded (ad.record of tensor code): f once on the whole batch, on a list
        run = _Reverse(one, x, ())
        value = run.result
    else:
        value = one(x) if mode != "forward" and not known else None
    o = _shape(value)[1:] if value is not None else ()
    m = int(np.prod(o, dtype=np.int64))
    # the basis is one more batch (a vmap of its own level around the jvps or vjps): one
    # pass for every element of every example, as torch's and JAX's Jacobians
    if mode == "forward" or known or (mode == "auto" and n <= m):
        if mode == "auto" and not known and not in_program(x):
            _remember_forward(F.f, shape_key)
        basis = _basis(x, n)
        if in_program(x) and isinstance(x, Tensor) and x.tape is not None and n:
            # recorded: one forward pass with the basis as a batched tangent, f's values
            # computed once (not once per basis element)
            out = _batched_pass(lambda: F.vmap(lambda t: _batched_tangent(one, x, t),
                                               out_axes=-1)(basis))
            if out is not None:
                return F.rewrap(out.reshape(_shape(out)[:-1] + s))
        if _plain_array(x) and n:
            # eager: f's values once, the basis one batch of tangents over them (as
            # torch.func's jacfwd), not the batch copied along the basis
            out = _batched_pass(lambda: F.vmap(lambda t: _basis_tangent(one, x, t),
                                               out_axes=-1)(basis))
            if isinstance(out, Tensor):
                return F.rewrap(out.value.reshape(_shape(out)[:-1] + s))
        out = F.vmap(lambda t: functional.jvp(one, x, t)[1], out_axes=-1)(basis)
        return F.rewrap(out.reshape(_shape(out)[:-1] + s))
    assert value is not None
    weights = _basis(value, m)
    if run is not None:
        out = _seeded_rows(F, run, weights)
        if out is not None:
            return F.rewrap(out.reshape((F.size,) + o + s))
    out = F.vmap(lambda u: functional.vjp(one, x, u)[1], out_axes=1)(weights)
    return F.rewrap(out.reshape((F.size,) + o + s))


def _seeded_rows(F: _Lifted, run: Any, weights: Any) -> Any:
    """Recorded: every row of every example's Jacobian by ONE sweep of the recording's
    list with the basis ``weights`` as a batched seed (the vjp rules are easyad ops, which
    batch over it), so f's values are computed once, not once per basis element; None
    where that cannot be done (the caller takes the basis element by element)."""
    value = run.result
    if not (isinstance(value, Tensor) and value.tape is run.tape and len(weights)):
        return None
    x_on_list = run.inputs[0]
    return _batched_pass(lambda: F.vmap(
        lambda u: _higher.backward_graph(value.handle, u)[x_on_list], out_axes=1)(weights))


def _batched_pass(run: Callable[[], Any]) -> Any:
    """A recorded Jacobian's one pass with a batched basis, or None where an op's vjp or
    jvp does not take vmap's batched value yet (it reads a tensor's backend, say): the
    caller then takes the basis element by element (jvp's or vjp's own lift: the same
    values, f once per basis element). What the failed pass recorded is never read."""
    try:
        return run()
    except (AttributeError, TypeError, NotImplementedError):
        return None


def _batched_tangent(f: Callable[..., Any], x: Any, t: Any) -> Any:
    """The tangent of f at x along t (vmap's batched basis, inside its vmap), by one
    forward pass over recorded values: jvp's own evaluation, without jvp's vmap lift
    (which would copy x along the basis)."""
    point = _forward_point(x, "jacobian")
    out = _forward_run(f, point, [t], ())
    # (f of one output tensor, as vmap's Jacobians take: anything else is refused by the
    # path of jvp, which reads f's output as usual)
    return out._tangent if isinstance(out, TraceTensor) else None


def _plain_array(x: Any) -> bool:
    """A float64 numpy batch at the top level (no other transform's levels, no
    interpreter frame open)."""
    return (type(x) is np.ndarray and x.dtype == np.float64
            and _LEVEL.get() == (0, None) and new_tensor_backend() is None)


def _basis_tangent(f: Callable[..., Any], x: np.ndarray, t: Any) -> Any:
    """Eager: the tangent of f at the numpy batch x along vmap's batched basis t, by one
    forward pass (one TraceTensor: x's values, the basis as its batched tangent); None
    where f's output is not one TraceTensor (the caller then goes element by element)."""
    token = _LEVEL.set((1, None))
    try:
        out = f(TraceTensor._of(Tensor.constant(x), t))
    finally:
        _LEVEL.reset(token)
    return out._tangent if isinstance(out, TraceTensor) else None


def _hessian(F: _Lifted, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    k = _one(options, len(args), "hessian")
    xs = F.unwrap(args, {k})
    x = xs[k]

    def summed(z: Any) -> Any:
        return _total(F(*xs[:k], z, *xs[k + 1:]))
    s = _shape(x)[1:]
    n = int(np.prod(s, dtype=np.int64))
    if in_program(x) and n:
        # recorded: the gradient on the recording's list once (its sweep recorded), then
        # its Jacobian by one sweep with a batched seed (reverse over reverse)
        run = _Reverse(lambda z: functional.grad(summed)(z), x, ())
        out = _seeded_rows(F, run, _basis(x, n))
        if out is not None:
            return F.rewrap(out.reshape((F.size,) + s + s))
    basis = _basis(x, n)
    out = F.vmap(lambda t: functional.hvp(summed, x, t), out_axes=-1)(basis)
    return F.rewrap(out.reshape((F.size,) + s + s))


def _directional(name: str) -> Callable[..., Any]:
    def run(F: _Lifted, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        _one(options, len(args), name)
        xs = F.unwrap(args, {0})
        direction = options["v" if name != "vjp" else "u"]
        leaves, tree = _trees.flatten(direction)
        d = _trees.unflatten(tree, [F.batch_of(v) for v in leaves])
        if name == "hvp":
            return F.rewrap(functional.hvp(lambda z, *a: _total(F(z, *a)), xs[0], d,
                                           *xs[1:]))
        value, derivative = getattr(functional, name)(F, xs[0], d, *xs[1:])
        return F.rewrap(value), F.rewrap(derivative)
    return run


_LIFTS = {"value_and_grad": _value_and_grad, "grad": _grad, "jacobian": _jacobian,
          "hessian": _hessian, "jvp": _directional("jvp"), "vjp": _directional("vjp"),
          "hvp": _directional("hvp")}

"""User array operations: ``ad.primitive(vjp=...)`` / ``ad.define(..., vjp=...)``.

An ``ArrayPrimitive`` wraps a function of numpy arrays (one or more inputs, one output)
with a user vjp (and optionally a jvp), and makes it an operation of every mode:

- numpy arrays and numbers: just ``f``;
- Tensors (any device): ``f`` on host copies (OpenCL buffers are read to the host and the
  result written back), recorded as ONE node whose vjp (a step, ``HostStep``) calls the
  user's vjp on host arrays; when the primitive is ``differentiable=True`` the node's
  ``graph`` calls the same vjp on recorded tensors (handles of the operands' entries), so
  ``create_graph`` and Hessians go through it; without a vjp the node differentiates
  ``f`` by central differences, and its graph does so again (approximate second
  derivatives);
- object arrays of Records (the functional API): packed into a Tensor, the node above,
  unpacked into Records; Records alone are scalar operands of the node;
- TraceTensors, Traces and object arrays of Traces (forward mode): the user's jvp; else
  the vjp on each unit vector of the output (exact, one vjp call per output element);
  else central differences along the tangent (two calls of ``f``);
- meta tensors (``ad.eval_shape``): the ``shape=`` function, else ``f`` run once on zeros.

Layering: above ``_trace`` (it makes Tensors and TraceTensors); it registers the class
with ``easyad.primitives`` (below the tensor layer), whose ``define``/``primitive`` make
it when given ``vjp=``/``jvp=``..., so the imports run one way.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import primitives
from easyad._core import Record, Trace
from easyad.errors import ShapeError
from easyad.tensor import _devices, _graph, _structural
from easyad.tensor._backend import Backend
from easyad.tensor._base import (Operand, TensorBase, common_tape, operand, record,
                                 record_scalar, result_dtype, wrap)
from easyad.tensor._meta import META, MetaArray, ShapeDtype
from easyad.tensor._steps import Step
from easyad.tensor._tensor import Tensor
from easyad.tensor._trace import TraceTensor

if TYPE_CHECKING:
    from easyad.tensor._program import ProgramBackend

_NUMERIC = "numeric"


# ---- central differences ----

def _step(x: np.ndarray) -> np.ndarray:
    # ~ cbrt(eps) * |x|: central differences then err ~ 1e-10 relative
    step: np.ndarray = 6e-6 * np.maximum(1.0, np.abs(x))
    return step


def _fd_vjp(f: Callable[..., Any], g: Any, xs: list[Any], wanted: list[int]) -> list[Any]:
    """J^T g for the inputs ``wanted``, column by column: 2 calls of f per element."""
    g = np.asarray(g, dtype=np.float64)
    cts: list[Any] = [None] * len(xs)
    for k in wanted:
        x = np.array(xs[k], dtype=np.float64)
        ct = np.zeros(x.shape)
        h = _step(x)
        for j in np.ndindex(x.shape):
            args = list(xs)
            up, down = x.copy(), x.copy()
            up[j] += h[j]
            down[j] -= h[j]
            args[k] = up if x.ndim else float(up)
            hi = np.asarray(f(*args), dtype=np.float64)
            args[k] = down if x.ndim else float(down)
            lo = np.asarray(f(*args), dtype=np.float64)
            ct[j] = np.sum(g * (hi - lo)) / (2.0 * h[j])
        cts[k] = ct
    return cts


def _fd_jvp(f: Callable[..., Any], xs: list[Any], tangents: list[Any]) -> np.ndarray:
    """J t along all the tangents at once: 2 calls of f."""
    moving = [k for k, t in enumerate(tangents) if t is not None and np.any(t)]
    if not moving:
        return np.zeros(np.shape(f(*xs)))
    scale = max(float(np.max(np.abs(np.asarray(xs[k], dtype=np.float64)), initial=1.0))
                for k in moving)
    size = max(float(np.max(np.abs(tangents[k]))) for k in moving)
    h = 6e-6 * scale / size
    up, down = list(xs), list(xs)
    for k in moving:
        x = np.asarray(xs[k], dtype=np.float64)
        up[k], down[k] = x + h * tangents[k], x - h * tangents[k]
    hi = np.asarray(f(*up), dtype=np.float64)
    lo = np.asarray(f(*down), dtype=np.float64)
    return (hi - lo) / (2.0 * h)


# ---- the primitive ----

class ArrayPrimitive:
    """A user operation on arrays with its vjp (``ad.primitive(vjp=...)``), in every mode.

    ``f(*xs)`` takes numpy arrays or numbers and returns one array (or number).
    ``vjp(g, *xs, out)`` returns one cotangent per input, of that input's shape (a single
    value for one input; None for an input with no derivative); ``jvp(tangents, *xs,
    out)`` returns the output's tangent, ``tangents`` holding one array per input (zeros
    where an input has none). Keyword arguments of a call reach f, vjp, jvp and ``shape``
    unchanged (static options such as ``axis``). ``vjp=None`` or ``"numeric"``:
    central differences (2 calls of f per input element for a vjp; approximate; None warns
    once). ``differentiable=True`` says the vjp is written with easyad operations
    (``ad.exp``, ``ad.sum``, ``+``...), so that called on recorded tensors it records:
    second derivatives (``create_graph``, Hessians) then go through it. ``shape(*specs)``
    gives the output's shape (or ShapeDtype) from the inputs' ShapeDtypes, for
    ``ad.eval_shape``; without it, f runs once on zeros.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> def softplus_vjp(g, x, out):
    ...     return g / (1.0 + ad.exp(-x))
    >>> @ad.primitive(vjp=softplus_vjp, differentiable=True)
    ... def softplus(x):
    ...     return np.logaddexp(0.0, x)
    >>> lst = ad.WengertList()
    >>> x = ad.Tensor.variable(np.array([0.0, 1.0]), lst)
    >>> loss = ad.sum(softplus(x))
    >>> np.round(loss.derivatives()[x], 6)
    array([0.5     , 0.731059])
    >>> d = loss.derivatives(create_graph=True)          # the vjp, recorded
    >>> np.round(ad.sum(d[x]).derivatives()[x], 6)       # sigmoid'(x)
    array([0.25    , 0.196612])
    """

    def __init__(self, name: str, f: Callable[..., Any], vjp: Any = None, jvp: Any = None,
                 shape: Any = None, differentiable: bool = False) -> None:
        if not callable(f):
            raise TypeError(f"f must be callable, got {type(f).__name__}")
        for label, v in (("vjp", vjp), ("jvp", jvp), ("shape", shape)):
            if v is not None and v != _NUMERIC and not callable(v):
                raise TypeError(f"{label} must be callable, got {v!r}")
        if jvp == _NUMERIC:
            jvp = None
        self.name = self.__name__ = name
        self.f = f
        self.vjp = vjp
        self.jvp = jvp
        self.shape = shape
        self.differentiable = bool(differentiable)
        self._warned = vjp is not None
        self.__doc__ = getattr(f, "__doc__", None)

    def __repr__(self) -> str:
        return f"<easyad array primitive {self.name!r}>"

    def __reduce__(self) -> Any:
        return (ArrayPrimitive, (self.name, self.f, self.vjp, self.jvp, self.shape,
                                 self.differentiable))

    # ---- registration ----
    def defvjp(self, vjp: Callable[..., Any], differentiable: bool | None = None) -> Any:
        """Set the vjp (usable as a decorator: ``@f.defvjp``); returns ``vjp``."""
        if not callable(vjp):
            raise TypeError(f"vjp must be callable, got {type(vjp).__name__}")
        self.vjp, self._warned = vjp, True
        if differentiable is not None:
            self.differentiable = bool(differentiable)
        return vjp

    def defjvp(self, jvp: Callable[..., Any]) -> Any:
        """Set the jvp (usable as a decorator: ``@f.defjvp``); returns ``jvp``."""
        if not callable(jvp):
            raise TypeError(f"jvp must be callable, got {type(jvp).__name__}")
        self.jvp = jvp
        return jvp

    # ---- the user's functions, with a call's keyword arguments ----
    def _bound(self, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
        if not kwargs:
            return self.f, self.vjp, self.jvp
        f = functools.partial(self.f, **kwargs)
        vjp = functools.partial(self.vjp, **kwargs) if callable(self.vjp) else self.vjp
        jvp = functools.partial(self.jvp, **kwargs) if self.jvp is not None else None
        return f, vjp, jvp

    def _numeric_vjp(self, f: Callable[..., Any], wanted: list[int]) -> Callable[..., Any]:
        if not self._warned:
            self._warned = True
            warnings.warn(f"primitive {self.name!r} has no vjp: its derivatives come from "
                          f"central differences (approximate; 2 calls of f per input "
                          f"element); give vjp=..., or vjp='numeric' to say so",
                          RuntimeWarning, stacklevel=4)

        def vjp(g: Any, *args: Any) -> list[Any]:
            return _fd_vjp(f, g, list(args[:-1]), wanted)
        return vjp

    def _cotangents(self, raw: Any, n: int) -> tuple[Any, ...]:
        if n == 1 and not isinstance(raw, (tuple, list)):
            raw = (raw,)
        if not isinstance(raw, (tuple, list)) or len(raw) != n:
            raise TypeError(f"the vjp of {self.name!r} must return {n} cotangent(s) (a "
                            f"tuple, one per input), got {type(raw).__name__}")
        return tuple(raw)

    def _check(self, ct: Any, shape: tuple[int, ...], k: int) -> None:
        if tuple(np.shape(ct)) != shape:
            raise ShapeError(f"the vjp of {self.name!r} returned a cotangent of shape "
                             f"{tuple(np.shape(ct))} for input {k} of shape {shape}")

    # ---- dispatch ----
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(_forward_leaf(a) for a in args):
            return self._forward(args, kwargs)
        if any(_object_records(a) for a in args):
            return self._records(args, kwargs)
        if any(isinstance(a, TensorBase) or type(a) is Record for a in args):
            return self._reverse(args, kwargs)
        f = self._bound(kwargs)[0]
        return f(*(_plain(a) for a in args))

    # ---- reverse mode (and eval_shape): one node ----
    def _reverse(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        first = next((a for a in args if isinstance(a, TensorBase)), None)
        # an interpreter that takes any device's tensors (eval_shape) runs the whole call
        be: Backend | None = next((a._backend for a in args if isinstance(a, TensorBase)
                                   and a._backend.interpreter.takes_any_device), None)
        if be is None:
            be = first._backend if first is not None else _devices.resolve("numpy")
        cls = type(first) if first is not None else Tensor
        ops: list[Any] = [_operand(a, be) for a in args]
        operands = [o for o in ops if o is not None]
        dtype = result_dtype(operands)
        done = be.interpreter.primitive(self, args, ops, dtype, cls, kwargs, be)
        if done is not NotImplemented:      # shapes only, or host calls of a program
            return done
        f, user_vjp, _ = self._bound(kwargs)
        xs = [a if o is None else (float(o.data) if o.dtype is None else be.to_numpy(o.data))
              for a, o in zip(args, ops)]
        out = np.asarray(f(*xs))
        if out.dtype.kind not in "biuf":
            raise TypeError(f"primitive {self.name!r} returned an array of {out.dtype}")
        out = out.astype(dtype, copy=False)      # the tensor operands' dtype
        shape = out.shape
        data = be.asarray(out, dtype)
        tape = common_tape(self.name, operands)
        wanted = [k for k, o in enumerate(ops) if o is not None and o.needs_adjoint]
        inputs = tuple(o.index if o is not None else -1 for o in ops)
        if tape is None or not wanted:
            return record(cls, self.name, be, data, shape, dtype, None, (), None) if shape \
                else record_scalar(cls, self.name, be, data, None, (), None)
        numeric = not callable(user_vjp)
        vjp_host = self._numeric_vjp(f, wanted) if numeric else user_vjp
        step = HostStep(self, f, user_vjp, args, ops, wanted, cls, be, data, shape, dtype,
                        vjp_host, (xs, out))
        # a second derivative: the user's vjp recorded, or central differences again
        graph = step.graph if self.differentiable or numeric else None
        if shape == ():
            return record_scalar(cls, self.name, be, data, tape, inputs, step, graph)
        return record(cls, self.name, be, data, shape, dtype, tape, inputs, step, graph)

    def _program(self, args: tuple[Any, ...], ops: list[Any], dtype: Any, cls: type,
                 kwargs: dict[str, Any], be: ProgramBackend) -> Any:
        """While ``ad.record`` records tensor code: f and its vjp as host calls of the
        program (replay calls them again on the new values); no second derivative."""
        f, user_vjp, _ = self._bound(kwargs)
        refs = [a if o is None else o.data for a, o in zip(args, ops)]
        name = self.name

        def forward(*xs: Any) -> list[np.ndarray]:
            out = np.asarray(f(*xs))
            if out.dtype.kind not in "biuf":
                raise TypeError(f"primitive {name!r} returned an array of {out.dtype}")
            return [out.astype(dtype, copy=False)]
        (data,) = be.host_call(f"primitive {name}", forward, refs)
        shape = data.shape
        operands = [o for o in ops if o is not None]
        tape = common_tape(name, operands)
        wanted = [k for k, o in enumerate(ops) if o is not None and o.needs_adjoint]
        inputs = tuple(o.index if o is not None else -1 for o in ops)
        if tape is None or not wanted:
            return record(cls, name, be, data, shape, dtype, None, (), None)
        vjp_host = self._numeric_vjp(f, wanted) if not callable(user_vjp) else user_vjp
        step = ProgramStep(self, f, user_vjp, args, ops, wanted, cls, be, data, shape, dtype,
                           vjp_host, refs)
        # second derivatives: a vjp written in easyad operations records
        graph = step.graph if self.differentiable and callable(user_vjp) else None
        return record(cls, name, be, data, shape, dtype, tape, inputs, step, graph)

    def _meta(self, args: tuple[Any, ...], ops: list[Any], dtype: Any, cls: type,
              kwargs: dict[str, Any]) -> Any:
        """eval_shape: the output's shape from ``shape=``, else from f on zeros."""
        if self.shape is not None:
            specs = [a if o is None else ShapeDtype(o.shape, o.dtype or np.float64)
                     for a, o in zip(args, ops)]
            spec = self.shape(*specs, **kwargs)
            out_shape, out_dtype = (spec.shape, spec.dtype) if isinstance(spec, ShapeDtype) \
                else (tuple(spec), dtype)
        else:
            zeros = [a if o is None else (0.0 if o.dtype is None else np.zeros(o.shape, o.dtype))
                     for a, o in zip(args, ops)]
            with np.errstate(all="ignore"):
                out = np.asarray(self._bound(kwargs)[0](*zeros))
            out_shape, out_dtype = out.shape, dtype
        return wrap(cls, META, MetaArray(out_shape, out_dtype), out_shape, out_dtype)

    # ---- object arrays of Records: packed into a tensor ----
    def _records(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        packed = [_pack(a) if _object_records(a) else a for a in args]
        out = self._reverse(tuple(packed), kwargs)
        if not isinstance(out, TensorBase):
            return out                      # one number: a Record already
        result = np.empty(out.shape, dtype=object)
        tensor: Any = out                   # a Tensor: indexing is the subclass's
        for i in np.ndindex(out.shape):
            result[i] = tensor[i]
        return result

    # ---- forward mode ----
    def _forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        f, user_vjp, user_jvp = self._bound(kwargs)
        pairs = [_tangent_pair(a) for a in args]
        xs = [p[0] for p in pairs]
        tangents = [p[1] for p in pairs]
        out = np.asarray(f(*xs), dtype=np.float64)
        if user_jvp is not None:
            full = tuple(np.zeros(np.shape(x)) if t is None else t
                         for x, t in zip(xs, tangents))
            tangent = np.asarray(user_jvp(full, *xs, out), dtype=np.float64)
        elif callable(user_vjp):
            # exact: each unit vector of the output through the vjp (one call per element)
            tangent = np.zeros(out.shape)
            for i in np.ndindex(out.shape):
                e = np.zeros(out.shape)
                e[i] = 1.0
                cts = self._cotangents(user_vjp(e if out.shape else 1.0, *xs, out), len(xs))
                tangent[i] = sum(float(np.sum(np.asarray(c) * t))
                                 for c, t in zip(cts, tangents)
                                 if t is not None and c is not None)
        else:
            tangent = _fd_jvp(f, xs, tangents)
        if tangent.shape != out.shape:
            raise ShapeError(f"the jvp of {self.name!r} returned a tangent of shape "
                             f"{tangent.shape} for an output of shape {out.shape}")
        trace = next((a for a in args if isinstance(a, TraceTensor)), None)
        if out.shape == ():
            return Trace(float(out), float(tangent))
        if trace is None and any(isinstance(a, np.ndarray) and a.dtype == object
                                 for a in args):
            result = np.empty(out.shape, dtype=object)
            for i in np.ndindex(out.shape):
                result[i] = Trace(float(out[i]), float(tangent[i]))
            return result
        device = trace.device if trace is not None else "numpy"
        dt = trace.dtype if trace is not None else np.float64
        return TraceTensor(Tensor.constant(out, device=device, dtype=dt), tangent)


# ---- the node of a call ----

class _PrimitiveStep(Step):
    """A primitive's node, vjp and graph, as data: the call's ``statics`` (the arguments
    that are no operand, None in the places of the operands), ``ops`` (the operands'
    Operands without their tape, None for statics), the inputs that want an adjoint, the
    output (``data``, ``shape``, ``dtype``), the vjp on host arrays ``vjp_host`` (the
    user's, or central differences) and what it reads (``saved``: see the subclasses).
    The graph calls the user's vjp on handles of the operands' entries, or for a
    ``numeric`` vjp differentiates again by central differences."""

    __slots__ = ("primitive", "f", "user_vjp", "numeric", "statics", "ops", "wanted", "cls",
                 "be", "data", "shape", "dtype", "vjp_host", "saved")

    def __init__(self, primitive: ArrayPrimitive, f: Any, user_vjp: Any,
                 args: tuple[Any, ...], ops: list[Any], wanted: list[int], cls: type, be: Backend,
                 data: Any, shape: tuple[int, ...], dtype: Any, vjp_host: Any,
                 saved: Any) -> None:
        self.primitive, self.f, self.user_vjp = primitive, f, user_vjp
        self.numeric = not callable(user_vjp)
        self.statics = tuple(a if o is None else None for a, o in zip(args, ops))
        self.ops = tuple(None if o is None else Operand(o.data, o.shape, None, o.index, o.dtype)
                         for o in ops)
        self.wanted, self.cls, self.be, self.data, self.shape, self.dtype = \
            wanted, cls, be, data, shape, dtype
        self.vjp_host, self.saved = vjp_host, saved

    def _meta(self, k: int) -> tuple[tuple[int, ...], Any]:
        o: Any = self.ops[k]       # an Operand: k wants an adjoint
        return o.shape, o.dtype

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        """The node's vjp in recorded operations."""
        cls, be, ops, wanted = self.cls, self.be, self.ops, self.wanted
        xs = [a if o is None else _graph.handle(cls, be, o.data, o.shape, o.dtype, tape,
                                                o.index)
              for a, o in zip(self.statics, ops)]
        if self.numeric:
            return self._numeric_graph(g, xs)
        out = _graph.handle(cls, be, self.data, self.shape, self.dtype if self.shape else None,
                            tape, index)
        cts = self.primitive._cotangents(self.user_vjp(g, *xs, out), len(xs))
        return tuple(self._recorded(cts[k], ops[k], k) if k in wanted else None
                     for k in range(len(xs)))

    def _numeric_graph(self, g: Any, xs: list[Any]) -> tuple[Any, ...]:
        """Central differences of central differences: each cotangent is itself a
        primitive of (g, *xs) without a vjp, so it records, approximately."""
        f = self.f
        result: list[Any] = [None] * len(xs)
        for k in self.wanted:
            part = ArrayPrimitive(
                f"{self.primitive.name}_vjp{k}",
                (lambda gv, *xv, k=k: _fd_vjp(f, gv, list(xv), [k])[k]), vjp=_NUMERIC)
            result[k] = self._recorded(part(g, *xs), self.ops[k], k)
        return tuple(result)

    def _recorded(self, ct: Any, o: Any, k: int) -> Any:
        """A cotangent from a recorded vjp as the node's graph returns it."""
        check = self.primitive._check
        if ct is None:
            return None
        if o.dtype is None:                       # a scalar operand: a Record or float
            if isinstance(ct, TensorBase):
                check(ct, (), k)
                total: Any = ct             # a Tensor: sum is the subclass's
                return total.sum()
            if isinstance(ct, np.ndarray):
                check(ct, (), k)
                return float(ct.reshape(()))
            return ct
        if isinstance(ct, TensorBase):
            check(ct, o.shape, k)
            return ct
        if isinstance(ct, (Record, float, int)):
            if o.shape != ():
                check(ct, o.shape, k)
            return _graph.as_tensor(ct, self.cls, self.be, o.dtype)
        a = np.asarray(ct, dtype=o.dtype)
        check(a, o.shape, k)
        return wrap(self.cls, self.be, self.be.asarray(a, o.dtype), o.shape, o.dtype)


class HostStep(_PrimitiveStep):
    """A primitive's node on a device's tensors: ``vjp_host`` on the host values of the
    call (``saved``: the arguments ``xs`` as f saw them, and ``out``)."""

    __slots__ = ()

    def __call__(self, g: Any) -> tuple[Any, ...]:
        be, (xs, out) = self.be, self.saved
        gh = float(g) if isinstance(g, float) else \
            np.asarray(be.to_numpy(g)).reshape(self.shape)
        cts = self.primitive._cotangents(self.vjp_host(gh, *xs, out), len(xs))
        result: list[Any] = [None] * len(xs)
        for k in self.wanted:
            ct = cts[k]
            if ct is None:
                continue
            s, dt = self._meta(k)
            self.primitive._check(ct, s, k)
            result[k] = float(np.asarray(ct).reshape(())) if dt is None else \
                be.asarray(np.asarray(ct, dtype=dt), dt)
        return tuple(result)


class ProgramStep(_PrimitiveStep):
    """A primitive's node while ``ad.record`` records tensor code: the vjp is a host call
    of the program (``backward`` on the values of ``saved``, the call's arguments as the
    program's slots), so replay calls it again on new values."""

    __slots__ = ()
    be: ProgramBackend       # (made by the Recording interpreter's ``primitive`` only)

    def backward(self, g: Any, out: Any, *xs: Any) -> list[np.ndarray]:
        """The cotangents of the inputs that want one, on host arrays (zeros for None)."""
        cts = self.primitive._cotangents(self.vjp_host(np.asarray(g).reshape(self.shape), *xs,
                                                       out), len(xs))
        result = []
        for k in self.wanted:
            s, dt = self._meta(k)
            ct = cts[k]
            ct = np.zeros(s, dtype=dt or np.float64) if ct is None else ct
            self.primitive._check(ct, s, k)
            result.append(np.asarray(ct, dtype=dt or np.float64))
        return result

    def __call__(self, g: Any) -> tuple[Any, ...]:
        outs = self.be.host_call(f"primitive {self.primitive.name} vjp", self.backward,
                                 [g, self.data, *self.saved])
        result: list[Any] = [None] * len(self.ops)
        for k, o in zip(self.wanted, outs):
            result[k] = o
        return tuple(result)


# ---- operands ----

def _operand(a: Any, be: Backend) -> Any:
    """The tensor Operand of a differentiable argument, or None for a static one (passed
    to f as it is: integer arrays, strings, None...)."""
    if isinstance(a, TensorBase) or type(a) is Record:
        return operand(a, be)
    if isinstance(a, (float, np.floating)) or \
            isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return operand(a, be)
    return None


def _plain(a: Any) -> Any:
    if isinstance(a, np.ndarray) and a.dtype == object:
        return np.array(a.tolist(), dtype=np.float64)
    return a


def _object_records(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == object and \
        any(type(v) is Record for v in a.flat)


def _forward_leaf(a: Any) -> bool:
    if isinstance(a, TraceTensor) or type(a) is Trace:
        return True
    return isinstance(a, np.ndarray) and a.dtype == object and \
        any(type(v) is Trace for v in a.flat)


def _pack(a: np.ndarray) -> Any:
    """An object array of Records and numbers as one recorded numpy-device Tensor."""
    be = _devices.resolve("numpy")
    items = [_graph.as_tensor(v, Tensor, be, np.dtype(np.float64)) if type(v) is Record
             else float(v) for v in a.flat]
    if not items:
        return np.zeros(a.shape)
    return _structural.stack(items).reshape(a.shape)


def _tangent_pair(a: Any) -> tuple[Any, Any]:
    """(value, tangent or None) of an argument in forward mode."""
    if isinstance(a, TraceTensor):
        return a.value, a.tangent
    if type(a) is Trace:
        return float(a.number), float(a.derivative)
    if isinstance(a, TensorBase):
        if a.tape is not None:
            raise TypeError("cannot combine a TraceTensor with a recorded Tensor: forward "
                            "mode and reverse mode do not mix")
        return a.value, None
    if type(a) is Record:
        raise TypeError("cannot combine a Trace with a Record: forward mode and reverse mode "
                        "do not mix")
    if isinstance(a, np.ndarray) and a.dtype == object:
        if any(type(v) is Record for v in a.flat):
            raise TypeError("cannot combine Traces with Records: forward mode and reverse "
                            "mode do not mix")
        values = np.array([v.number if type(v) is Trace else float(v) for v in a.flat])
        tangents = np.array([v.derivative if type(v) is Trace else 0.0 for v in a.flat])
        return values.reshape(a.shape), tangents.reshape(a.shape)
    return a, None


# ad.define / ad.primitive (below the tensor layer) make array primitives through this
primitives._register_array(ArrayPrimitive)

__all__ = ["ArrayPrimitive"]

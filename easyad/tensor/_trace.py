"""TraceTensor: forward mode on arrays, a value and a tangent of the same shape.

The elementwise operations come from the rule table like everything else (the methods
are ``RuleMethods``, generated from it; they call ``_jvp``): one kernel
computes the value expression and the tangent ``sum_k mul0(partial_k, d<operand>_k)``
(with the output ``z`` in a partial replaced by the value expression), the same strings
the scalar Trace and the tensor vjps use. Linear operations (reshape, transpose, indexing,
sums, joins, where) apply to value and tangent alike through the constant-Tensor
operations; matmul uses the product rule. A result that is one number is a scalar
``Trace``, as a Tensor's is a Record.

Forward over forward: the parts may themselves be TraceTensors (a transform's inputs
inside another forward transform, ``ad.jacobian(ad.jacobian(f, mode="forward"),
mode="forward")``). Elementwise rules then evaluate the table's value and partials on the
parts (``_jvp_nested``), with the strong-zero helpers judging the innermost values, and
every other operation applies to the parts as it would to tensors.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _arrays, _expr, _levels, _rules
from easyad._levels import BatchedBase
from easyad._core import Record, Trace
from easyad._expressions import compile_rule
from easyad.tensor import _shapes as shapes
from easyad.tensor import _generic, _graph, _structural
from easyad.tensor._base import BOOL, operand, wrap
from easyad._generated.tensor_methods import RuleMethods
from easyad.tensor._tensor import Tensor

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


class TraceTensor(RuleMethods):
    """An array with a tangent (a directional derivative) for forward mode.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> x = ad.TraceTensor.variable(np.array([0.0, 1.0]))      # tangent: ones
    >>> y = ad.sin(x) * x
    >>> np.round(y.tangent, 6)                                 # sin x + x cos x
    array([0.      , 1.381773])
    """

    __slots__ = ("_value", "_tangent", "_elements", "_traces")
    _value: "Tensor | TraceTensor"       # TraceTensors: forward over forward
    _tangent: "Tensor | TraceTensor"

    def __init__(self, value: Any, tangent: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        v = value if isinstance(value, Tensor) and value.tape is None else \
            Tensor.constant(value, device=device, dtype=dtype)
        if tangent is None:
            t = Tensor.constant(np.zeros(v.shape), device=v.device, dtype=v.dtype)
        else:
            t = Tensor.constant(np.broadcast_to(np.asarray(
                tangent.value if isinstance(tangent, Tensor) else tangent), v.shape),
                device=v.device, dtype=v.dtype)
        self._value, self._tangent = v, t
        self._elements: Any = None
        self._traces: Any = None

    @staticmethod
    def variable(array: Any, tangent: Any = None, device: Any = None,
                 dtype: Any = None) -> "TraceTensor":
        """An input with tangent ``tangent`` (default: ones, the direction of all inputs)."""
        return TraceTensor(array, np.ones(np.shape(array)) if tangent is None else tangent,
                           device, dtype)

    @staticmethod
    def constant(array: Any, device: Any = None, dtype: Any = None) -> "TraceTensor":
        """An input with tangent 0."""
        return TraceTensor(array, None, device, dtype)

    @staticmethod
    def _of(value: "Tensor | TraceTensor", tangent: "Tensor | TraceTensor") -> "TraceTensor":
        t = TraceTensor.__new__(TraceTensor)
        t._value, t._tangent, t._elements, t._traces = value, tangent, None, None
        return t

    @staticmethod
    def _input(value: np.ndarray, tangent: np.ndarray, device: Any = None) -> "TraceTensor":
        """An input of a forward transform: single elements read as scalar Traces (cheap
        for scalar code) instead of two indexing operations each."""
        t = TraceTensor(value, tangent, device)
        t._elements = (np.asarray(value, dtype=np.float64), np.asarray(tangent, np.float64))
        return t

    # -- what it is --
    @property
    def value(self) -> np.ndarray:
        return self._value.value

    @property
    def tangent(self) -> np.ndarray:
        return self._tangent.value

    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    @property
    def ndim(self) -> int:
        return self._value.ndim

    @property
    def size(self) -> int:
        return self._value.size

    @property
    def device(self) -> Any:
        return self._value.device

    def detach(self) -> Tensor:
        """The value, as a constant Tensor."""
        return self._value.detach()

    def __repr__(self) -> str:
        return f"TraceTensor(value={self.value!r}, tangent={self.tangent!r})"

    def __len__(self) -> int:
        return len(self._value)

    __hash__ = None  # type: ignore[assignment]
    __array_priority__ = 1000.0

    # numpy's ufuncs (np.exp(t), a + t) and functions (np.sum(t)) dispatch to the methods
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _generic.array_ufunc(TraceTensor, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _generic.array_function(func, args, kwargs)

    # -- linear operations: the same on value and tangent --
    def _both(self, f: Any) -> Any:
        v, t = f(self._value), f(self._tangent)
        if isinstance(v, _PARTS):
            return TraceTensor._of(v, t)
        return _scalar(v, t)

    # the op table's ops (easyad.ops: each one's jvp, or for a linear op the op itself
    # on the tangent), called through the tensor layer's TABLE_OPS
    def sum(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _structural.TABLE_OPS["sum"](self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Any:
        return self._both(lambda a: a.mean(axis=axis, keepdims=keepdims))

    def reshape(self, *shape: Any) -> "TraceTensor":
        new = shape[0] if len(shape) == 1 else shape
        return _structural.TABLE_OPS["reshape"](self, new)  # type: ignore[no-any-return]

    def transpose(self, *axes: Any) -> "TraceTensor":
        perm = shapes.transpose(self.shape, axes)
        if perm == tuple(range(len(perm))):
            return self
        return _structural.TABLE_OPS["transpose"](self, perm)  # type: ignore[no-any-return]

    @property
    def T(self) -> "TraceTensor":
        return self.transpose()

    def __getitem__(self, key: Any) -> Any:
        traces = self._traces
        if traces is not None and type(key) is int:     # scalar code on a 1-D input
            return traces[key]
        if self._elements is not None and shapes.is_element(key, self.ndim):
            value, tangent = self._elements
            if value.ndim == 1:        # every element's Trace, made once
                traces = np.empty(value.shape, dtype=object)
                for i, (v, t) in enumerate(zip(value.tolist(), tangent.tolist())):
                    traces[i] = Trace(v, t)
                self._traces = traces
                return traces[key]
            return Trace(float(value[key]), float(tangent[key]))
        return self._both(lambda a: a[key])

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def max(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _structural.TABLE_OPS["max"](self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _structural.TABLE_OPS["min"](self, axis, keepdims)

    amax, amin = max, min

    def __matmul__(self, other: Any) -> Any:
        return _matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return _matmul(other, self)

    @staticmethod
    def concatenate(items: Any, axis: int = 0) -> "TraceTensor":
        over = _over_reverse(items)
        top = max(_depth(v) for v in items)
        pairs = [_pair(v, _backend_of(items), over, top) for v in items]
        return TraceTensor._of(_generic.concatenate([p[0] for p in pairs], axis),
                               _generic.concatenate([p[1] for p in pairs], axis))

    @staticmethod
    def stack(items: Any, axis: int = 0) -> "TraceTensor":
        over = _over_reverse(items)
        top = max(_depth(v) for v in items)
        pairs = [_pair(v, _backend_of(items), over, top) for v in items]
        return TraceTensor._of(_generic.stack([p[0] for p in pairs], axis),
                               _generic.stack([p[1] for p in pairs], axis))

    @staticmethod
    def _where(condition: Any, a: Any, b: Any) -> "TraceTensor":
        be = _backend_of([condition, a, b])
        if isinstance(condition, TraceTensor):
            condition = condition._value
        over = _over_reverse((a, b))
        top = max(_depth(a), _depth(b))
        (av, at), (bv, bt) = _pair(a, be, over, top), _pair(b, be, over, top)
        return TraceTensor._of(_generic._where(condition, av, bv),
                               _generic._where(condition, at, bt))

    # comparisons look at values (constant boolean tensors)
    def __lt__(self, other: Any) -> Any:
        return self._value < _value_of(other)

    def __le__(self, other: Any) -> Any:
        return self._value <= _value_of(other)

    def __gt__(self, other: Any) -> Any:
        return self._value > _value_of(other)

    def __ge__(self, other: Any) -> Any:
        return self._value >= _value_of(other)

    def __eq__(self, other: Any) -> Any:
        return self._value == _value_of(other)

    def __ne__(self, other: Any) -> Any:
        return self._value != _value_of(other)

    def __pos__(self) -> "TraceTensor":
        return self

    # -- the rule table's hooks (the methods sin, __add__... come from RuleMethods) --
    def _unary_rule(self, rule: _rules.Rule) -> "TraceTensor":
        return _jvp(rule, (self,))  # type: ignore[no-any-return]

    def _binary_rule(self, rule: _rules.Rule, other: Any, reflected: bool) -> Any:
        return _jvp(rule, (other, self) if reflected else (self, other))


# ---- operands ----

_PARTS = (Tensor, TraceTensor)     # what a TraceTensor's value and tangent may be


def _nested(v: Any) -> bool:
    """Whether ``v`` carries tangents at two levels (forward over forward): a TraceTensor
    of TraceTensors, or a Trace of Traces."""
    if isinstance(v, TraceTensor):
        return isinstance(v._value, TraceTensor) or isinstance(v._tangent, TraceTensor)
    return isinstance(v, Trace) and type(v) is not Trace and (
        isinstance(v.number, Trace) or isinstance(v.derivative, Trace))


def _depth(v: Any) -> int:
    """How many levels of tangents ``v`` carries (its forward level: a transform makes
    its inputs one depth above the levels open around it, so operands of a lower depth are
    constants of the top one's level, never the same perturbation)."""
    if isinstance(v, TraceTensor):
        return 1 + max(_depth(v._value), _depth(v._tangent))
    if isinstance(v, Trace):
        return 1 if type(v) is Trace else int(v.depth)
    if type(v) is np.ndarray and v.dtype == object:
        return max((_depth(e) for e in v.flat), default=0)
    return 0


def _traced_objects(v: Any) -> bool:
    """Whether ``v`` is ``np.array([f1, f2])`` of traced numbers: how scientific code
    builds a vector (an ODE's right-hand side), to be taken as one TraceTensor."""
    return type(v) is np.ndarray and v.dtype == object and v.size > 0 and \
        any(isinstance(e, (TraceTensor, Trace)) for e in v.flat)


def _without_objects(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The operands with each array of traced numbers joined into one TraceTensor."""
    if not any(_traced_objects(a) for a in args):
        return args
    be, over, top = _backend_of(args), _over_reverse(args), max(_depth(a) for a in args)
    return tuple(TraceTensor._of(*_joined(a, be, over, top)) if _traced_objects(a) else a
                 for a in args)


def _joined(v: Any, be: Backend, over_reverse: bool, top: int) -> tuple[Any, Any]:
    """(value, tangent) tensors of an array of traced numbers, element by element."""
    pairs = [_pair(e, be, over_reverse, top) for e in v.flat]
    return (_generic.stack([p[0] for p in pairs], 0).reshape(v.shape),
            _generic.stack([p[1] for p in pairs], 0).reshape(v.shape))


def _split(args: tuple[Any, ...], top: int) -> tuple[list[Any], list[Any]]:
    """The operands' values and tangents at level ``top`` (None: a constant there)."""
    values: list[Any] = []
    tangents: list[Any] = []
    for a in args:
        if isinstance(a, TraceTensor) and _depth(a) == top:
            values.append(a._value)
            tangents.append(a._tangent)
        elif isinstance(a, Trace) and _depth(a) == top:
            values.append(a.number)
            tangents.append(a.derivative)
        else:
            values.append(a)
            tangents.append(None)
    return values, tangents


def _zero_d(v: Any, be: Backend) -> Any:
    """A number of the level below (a Trace, or a float) as a 0-d TraceTensor / Tensor."""
    if isinstance(v, Trace):
        return TraceTensor._of(_zero_d(v.number, be), _zero_d(v.derivative, be))
    return Tensor.constant(np.asarray(float(v)), device=be.device)


def _backend_of(values: Any) -> Any:
    for v in values:
        if isinstance(v, TraceTensor):
            while isinstance(v, TraceTensor):    # forward over forward: the innermost
                v = v._value
            return v._backend
    for v in values:
        if isinstance(v, Tensor):
            return v._backend
    raise TypeError("needs a TraceTensor")


def _value_of(v: Any) -> Any:
    return v._value if isinstance(v, TraceTensor) else v


def _scalar(value: Any, tangent: Any) -> Any:
    """A one-number result: a Trace, of Records when either part is recorded (forward
    over reverse), of Traces when either part is one (forward over forward)."""
    if type(value) is Record or type(tangent) is Record or isinstance(value, Trace) \
            or isinstance(tangent, Trace):
        return Trace(value, tangent)
    return Trace(float(value), float(tangent))


def _recorded(v: Any) -> bool:
    """Whether a value with a tangent holds parts on a tape (forward over reverse: then
    recorded tensors and Records are constants of its level; otherwise they do not mix)."""
    if isinstance(v, TraceTensor):
        return any(isinstance(p, Tensor) and p.tape is not None or _recorded(p)
                   for p in (v._value, v._tangent))
    if isinstance(v, Trace) and type(v) is not Trace:      # a NestedTrace
        return type(v.number) is Record or type(v.derivative) is Record
    return False


def _basis_batched(args: Any) -> bool:
    """Whether an operand's tangent is vmap's batched value (a Jacobian's basis as one
    batch of tangents over one value): the rule's value and partials are then tensor
    operations, the partials times the batched tangent by vmap's rules."""
    for a in args:
        if isinstance(a, TraceTensor) and isinstance(a._tangent, BatchedBase):
            return True
    return False


def _over_reverse(args: Any) -> bool:
    """Whether the operands meet over recorded parts: a TraceTensor over recorded tensors,
    or, inside a transform (where a closure's recorded values are of another level), a
    recorded operand, a constant at the TraceTensor's level. Outside transforms a plain
    TraceTensor and a recorded tensor do not mix."""
    on_tape = False
    for a in args:          # (one loop: this runs for every elementwise operation)
        if _recorded(a):
            return True
        if type(a) is Record or isinstance(a, Tensor) and a.tape is not None:
            on_tape = True
    return on_tape and _levels.inside()


def _pair(v: Any, be: Backend, over_reverse: bool = False, top: int = 1) -> tuple[Any, Any]:
    """``v`` as (value, tangent) tensors on backend ``be`` at level ``top`` (recorded ones
    only forward over reverse: a TraceTensor whose parts are on a tape)."""
    if _traced_objects(v):
        return _joined(v, be, over_reverse, top)
    if top > 1 and _depth(v) < top:       # a constant of the top level
        value = v if isinstance(v, (TraceTensor, Tensor)) else _as_part(v, be, over_reverse)
        return value, _graph.zeros(Tensor, be, value.shape, value.dtype)
    if isinstance(v, TraceTensor):
        return v._value, v._tangent
    if _nested(v):                        # a Trace of Traces: 0-d TraceTensors
        return _zero_d(v.number, be), _zero_d(v.derivative, be)
    if isinstance(v, Tensor) and v.tape is not None or type(v) is Record:
        if not over_reverse:
            raise TypeError(f"cannot combine a TraceTensor with a recorded "
                            f"{type(v).__name__}: forward mode and reverse mode do not mix "
                            f"(except as a TraceTensor over recorded tensors)")
        value = v if isinstance(v, Tensor) else _graph.as_tensor(v, Tensor, be,
                                                                 np.dtype(np.float64))
        return value, _graph.zeros(Tensor, be, value.shape, value.dtype)
    if isinstance(v, Trace) and over_reverse and _recorded(v):
        f64 = np.dtype(np.float64)
        return (_graph.as_tensor(v.number, Tensor, be, f64),
                _graph.as_tensor(v.derivative, Tensor, be, f64))
    if type(v) is Trace:
        value = Tensor.constant(np.asarray(v.number), device=be.device)
        return value, Tensor.constant(np.asarray(v.derivative), device=be.device)
    value = v if isinstance(v, Tensor) else Tensor.constant(
        _arrays.real_array(v, "a forward-mode operand"), device=be.device)
    return value, wrap(Tensor, be, be.full(value.shape, 0.0, value.dtype), value.shape, value.dtype)


def _as_part(v: Any, be: Backend, over_reverse: bool) -> Any:
    """A number (a Trace of its levels, a Record, a float) as a 0-d tensor of its levels."""
    if isinstance(v, Trace):
        return TraceTensor._of(_as_part(v.number, be, over_reverse),
                               _as_part(v.derivative, be, over_reverse))
    return _pair(v, be, over_reverse)[0]


def _parts(v: Any, be: Backend) -> tuple[Any, Any, tuple[int, ...], Any] | None:
    """(value data, tangent data or None, shape, dtype) of an elementwise operand."""
    if isinstance(v, TraceTensor):    # (not nested: _jvp takes those to _jvp_nested)
        value, tangent = v._value, v._tangent
        assert isinstance(value, Tensor) and isinstance(tangent, Tensor)
        return value._data, tangent._data, v.shape, v.dtype
    if type(v) is Trace:
        return float(v.number), float(v.derivative), (), None
    if type(v) is Record or isinstance(v, Tensor) and v.tape is not None:
        raise TypeError(f"cannot combine a TraceTensor with a recorded {type(v).__name__}: "
                        f"forward mode and reverse mode do not mix")
    o = operand(v, be)
    if o is None:
        return None
    return o.data, None, o.shape, o.dtype


@functools.lru_cache(maxsize=None)
def _inlined(partial: str, value: str) -> str:
    """A partial with z (the output) replaced by the value expression itself."""
    return _expr.render(_expr.substitute(partial, {"z": value}))


def _jvp_recorded(rule: _rules.Rule, args: tuple[Any, ...]) -> Any:
    """Forward over reverse: value and tangent by recorded tensor operations (the rule's
    value and partials from the table on tensors), so both can be differentiated again."""
    compiled = _graph.tensor_rules()[rule.name]
    values, tangents = _split(args, 1)
    x, y = values[0], values[1] if rule.arity == 2 else 0.0
    z = compiled.value(x, y, None)
    tangent: Any = None
    for k, t in enumerate(tangents):
        if t is not None:
            term = _graph.mul0(t, compiled.partials[k](x, y, z))
            tangent = term if tangent is None else tangent + term
    if not isinstance(z, Tensor):
        return _scalar(z, 0.0 if tangent is None else tangent)
    if not isinstance(tangent, (Tensor, BatchedBase)) or tangent.shape != z.shape:
        # (a batched tangent, of vmap: a recorded Jacobian's basis, stays batched)
        tangent = _graph.zeros(Tensor, z._backend, z.shape, z.dtype) + \
            (0.0 if tangent is None else tangent)
    return TraceTensor._of(z, tangent)


def _innermost(v: Any) -> np.ndarray:
    """The plain values under every level of tangents."""
    while isinstance(v, (TraceTensor, Trace)) and not isinstance(v, Tensor):
        v = v._value if isinstance(v, TraceTensor) else v.number
    return np.asarray(v.value if isinstance(v, Tensor) else v, dtype=np.float64)


def _traced(*vs: Any) -> Any:
    return next((v for v in vs if isinstance(v, TraceTensor)), None)


def _nested_mul0(a: Any, b: Any) -> Any:
    # the strong zero judged on the innermost values, as _graph's on a tensor's values
    like = _traced(a, b)
    if like is None:
        return _graph.tensor_namespace()["mul0"](a, b)
    va, vb = _innermost(a), _innermost(b)
    with np.errstate(invalid="ignore"):
        strong = ((va == 0) & ~np.isfinite(vb)) | ((vb == 0) & ~np.isfinite(va))
    if not strong.any():
        return a * b
    return _generic._where(_mask(strong, like), 0.0, a * b)


def _nested_div0(a: Any, b: Any) -> Any:
    like = _traced(a, b)
    if like is None:
        return _graph.tensor_namespace()["div0"](a, b)
    va, vb = _innermost(a), _innermost(b)
    zero = (va == 0) & ((vb == 0) | np.isnan(vb))
    if not zero.any():
        return a / b
    mask = _mask(zero, like)
    return _generic._where(mask, 0.0, a / _generic._where(mask, 1.0, b))


def _mask(values: np.ndarray, like: Any) -> Tensor:
    shape = np.broadcast_shapes(values.shape, like.shape)
    return Tensor.constant(np.broadcast_to(values, shape), device=like.device, dtype=BOOL)


def _nested_piecewise(function: Any, name: str) -> Any:
    # sign and heaviside: constants (no tangent at any level) of the innermost values
    def apply(t: Any) -> Any:
        if not isinstance(t, TraceTensor):
            return _graph.tensor_namespace()[name](t)
        return Tensor.constant(function(_innermost(t)), device=t.device, dtype=t.dtype)
    return apply


@functools.lru_cache(maxsize=1)
def _nested_rules() -> Any:
    """Every rule's value and partials compiled for parts that carry tangents."""
    ns = dict(_graph.tensor_namespace())
    ns.update(mul0=_nested_mul0, div0=_nested_div0, choose=_generic._where,
              sign=_nested_piecewise(np.sign, "sign"),
              heaviside=_nested_piecewise(lambda v: np.heaviside(v, 0.5), "heaviside"))
    return {r.name: compile_rule(r, ns) for r in _rules.RULES}


def _jvp_nested(rule: _rules.Rule, args: tuple[Any, ...], top: int) -> Any:
    """Forward over forward: the rule's value and tangent computed on the parts, which
    carry the inner level's tangents themselves."""
    compiled = _nested_rules()[rule.name]
    values, tangents = _split(args, top)
    x, y = values[0], values[1] if rule.arity == 2 else 0.0
    z = compiled.value(x, y, None)
    tangent: Any = None
    for k, t in enumerate(tangents):
        if t is not None:
            term = _nested_mul0(t, compiled.partials[k](x, y, z))
            tangent = term if tangent is None else tangent + term
    if not isinstance(z, _PARTS):
        return _scalar(z, 0.0 if tangent is None else tangent)
    if not isinstance(tangent, _PARTS) or tangent.shape != z.shape:
        tangent = _zeros_like(z) + (0.0 if tangent is None else tangent)
    return TraceTensor._of(z, tangent)


def _zeros_like(v: Any) -> Any:
    if isinstance(v, TraceTensor):
        return TraceTensor._of(_zeros_like(v._value), _zeros_like(v._tangent))
    return _graph.zeros(Tensor, v._backend, v.shape, v.dtype)


def _jvp(rule: _rules.Rule, args: tuple[Any, ...]) -> Any:
    for a in args:
        if type(a) is np.ndarray and a.dtype == object:    # np.array([f1, f2]) of Traces
            args = _without_objects(args)
            break
    if any(_nested(a) for a in args):      # (over recorded parts too: they recur here)
        return _jvp_nested(rule, args, max(_depth(a) for a in args))
    if _over_reverse(args) or _basis_batched(args):
        return _jvp_recorded(rule, args)
    be = _backend_of(args)
    parts = [_parts(a, be) for a in args]
    if any(p is None for p in parts):
        return NotImplemented
    names = ("x", "y")[:rule.arity]
    shape = shapes.broadcast(rule.name, *(p[2] for p in parts))  # type: ignore[index]
    dtypes = [np.dtype(p[3]) for p in parts if p[3] is not None and p[3] != BOOL]  # type: ignore[index]
    dtype = np.result_type(*dtypes) if dtypes else np.dtype(np.float64)
    operands: dict[str, Any] = {}
    terms = []
    for name, p, partial in zip(names, parts, rule.partials):
        operands[name] = p[0]  # type: ignore[index]
        if p[1] is not None:  # type: ignore[index]
            operands["d" + name] = p[1]  # type: ignore[index]
            # z (the output) in a partial is the value expression itself, inlined
            terms.append(f"mul0({_inlined(partial, rule.value)}, d{name})")
    tangent = " + ".join(terms) if terms else "0.0"
    z, dz = be.map(rule.name + "_jvp", (rule.value, tangent), operands, shape, (dtype, dtype))
    return TraceTensor._of(wrap(Tensor, be, z, shape, dtype), wrap(Tensor, be, dz, shape, dtype))


def _product(a: Any, b: Any) -> Any:
    # a tensor's @ does not defer to vmap's batched value (a recorded Jacobian's batched
    # tangent): its reflected product then
    if isinstance(b, BatchedBase) and not isinstance(a, BatchedBase):
        return b.__rmatmul__(a)  # type: ignore[attr-defined]
    return a @ b


def _matmul(a: Any, b: Any) -> Any:
    be = _backend_of([a, b])
    over = _over_reverse((a, b))
    top = max(_depth(a), _depth(b))
    (av, at), (bv, bt) = _pair(a, be, over, top), _pair(b, be, over, top)
    value = av @ bv
    # a constant operand (no Trace levels) has tangent zero: its product is left out
    # (a recorded program would compute a product of zeros and add it)
    if not isinstance(a, (TraceTensor, Trace)):
        tangent = _product(av, bt)
    elif not isinstance(b, (TraceTensor, Trace)):
        tangent = _product(at, bv)
    else:
        tangent = _product(at, bv) + _product(av, bt)
    if isinstance(value, _PARTS):
        return TraceTensor._of(value, tangent)
    return _scalar(value, tangent)

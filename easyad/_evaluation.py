"""How a transform evaluates ``f``: its point, its inputs in each mode, and what it reads
back from f's outputs (the machinery under ``functional.py``'s API). This module holds
what both modes share (levels, the point, the parts of nested values, f's outputs); the
modes themselves are ``_reverse_mode.py`` and ``_forward_mode.py``, one transform each.

- inputs: a point is a structure of arrays (``_trees``); ``_Point`` holds them as float64
  arrays, or keeps leaves that are already recorded or traced (a transform inside another);
- reverse mode (``_Reverse``): f runs on Tensors of a fresh list (elements: Records), or on
  copies on the outer list (inside a reverse transform: sweeps recorded with
  create_graph), or on TraceTensors over recorded tensors (inside a forward transform:
  each sweep runs from both parts of the output);
- forward mode (``_forward_run``): f runs on TraceTensors and Traces, over recorded leaves
  inside a reverse transform;
- Jacobians are assembled row by row (reverse) or column by column (forward) into blocks
  of shape ``out.shape + in.shape``, recorded when nested;
- levels (``_levels.py``): each evaluation of f runs inside its transform's level, which
  decides the depth of a forward transform's Traces and the list a reverse transform
  records on, so f may close over the variables of the transforms around it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _arrays, _levels, _trees
from easyad._core import Record, Trace, WengertList
from easyad._trees import TreeDef
from easyad.tensor import Tensor, TraceTensor
from easyad.tensor._base import FLOAT64, wrap
from easyad.tensor._devices import resolve
from easyad.tensor._structural import from_scalars
from easyad.tensor._trace import _recorded as _recorded_parts_of

Vector = NDArray[np.float64]
_PLAIN_REAL = (int, float, np.integer, np.floating, np.bool_)


# ---- levels (easyad/_levels.py): which transform a value belongs to ----------------------
_LEVEL = _levels.LEVEL
_level = _levels.opened


def _open_level() -> tuple[int, WengertList | None]:
    return _LEVEL.get()


def _point_leaves(x0: Any) -> tuple[list[Any], TreeDef]:
    """A point's leaves, a list or tuple of Records or Traces (``[x]`` of an outer
    transform's scalar) gathered: Records as an object array, Traces as a TraceTensor
    of their levels."""
    leaves, tree = _trees.flatten(x0)
    for k, v in enumerate(leaves):
        if isinstance(v, (list, tuple)):
            items = np.array(v, dtype=object)
            flat = list(items.reshape(-1))
            if any(isinstance(e, Trace) for e in flat):
                leaves[k] = _traces_block(flat, items.shape)
            elif any(type(e) is Record for e in flat):
                leaves[k] = items
    return leaves, tree


def _depth(v: Any) -> int:
    """How many forward levels (Trace depths) a value carries."""
    if type(v) is Trace:
        return 1
    if isinstance(v, Trace):
        return int(v.depth)        # a NestedTrace
    if isinstance(v, TraceTensor):
        return 1 + max(_depth(v._value), _depth(v._tangent))
    if isinstance(v, np.ndarray) and v.dtype == object:
        return max((_depth(e) for e in v.reshape(-1)), default=0)
    return 0


def _constant_above(v: Any, depth: int) -> Any:
    """``v`` (of a lower depth) as a value of ``depth``: constant at the levels above."""
    while _depth(v) < depth:
        v = _lift(v, 0.0 if _shape(v) == () and not isinstance(v, np.ndarray)
                  else np.zeros(_shape(v)))
    return v


def _rebase(v: Any, x: Any, depth: int) -> Any:
    """The point's leaf ``v`` at ``depth``, its innermost value replaced by the variable
    ``x`` of a reverse transform (the Trace levels above are kept: their tangents are
    the outer transforms' directions, constants to this one)."""
    if depth == 0:
        return x
    if _depth(v) == depth:
        if isinstance(v, TraceTensor):
            return TraceTensor._of(_rebase(v._value, x, depth - 1), v._tangent)
        return Trace(_rebase(v.number, x, depth - 1), v.derivative)
    return _constant_above(_rebase(v, x, depth - 1), depth)


def _base(v: Any) -> Any:
    """The innermost value of a point's leaf under its Trace levels."""
    while True:
        if isinstance(v, TraceTensor):
            v = v._value
        elif isinstance(v, Trace):
            v = v.number
        else:
            return v


def _split_top(v: Any, depth: int) -> tuple[Any, Any]:
    """An output's (value, tangent) at the forward level ``depth``: a value of a lower
    depth is a constant there (tangent zero)."""
    if isinstance(v, np.ndarray) and v.dtype == object:
        parts = [_split_top(e, depth) for e in v.reshape(-1)]
        return tuple(_gathered([p[k] for p in parts], v.shape)  # type: ignore[return-value]
                     for k in (0, 1))
    if _depth(v) == depth:
        if isinstance(v, TraceTensor):
            return v._value, v._tangent
        return v.number, v.derivative
    if isinstance(v, (Tensor, TraceTensor, np.ndarray)):
        return v, np.zeros(_shape(v))
    return v, 0.0


def _gathered(items: list[Any], shape: tuple[int, ...]) -> Any:
    """Elements as an array: floats as a float array, anything else as an object array."""
    if all(isinstance(e, _PLAIN_REAL) for e in items):
        return np.array(items, dtype=np.float64).reshape(shape)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


def _join(primal: Any, tangent: Any) -> Any:
    """A value one level up from its two parts (scalars: a Trace; arrays: a TraceTensor)."""
    arrays = (Tensor, TraceTensor, np.ndarray)
    if not isinstance(primal, arrays) and not isinstance(tangent, arrays):
        return Trace(primal, tangent)
    if isinstance(primal, np.ndarray) and isinstance(tangent, np.ndarray):
        return TraceTensor(primal, tangent)
    if not isinstance(primal, (Tensor, TraceTensor)):
        primal = Tensor.constant(np.asarray(primal, dtype=np.float64))
    if not isinstance(tangent, (Tensor, TraceTensor)):
        return _lift(primal, tangent)
    return TraceTensor._of(primal, tangent)


def _detached(v: Any) -> Any:
    """An output of a reverse transform on its own list, for the levels around it: its
    Trace levels kept, its Records read as numbers."""
    if isinstance(v, TraceTensor):
        return _join(_detached(v._value), _detached(v._tangent))
    if isinstance(v, Trace) and type(v) is not Trace:
        return Trace(_detached(v.number), _detached(v.derivative))
    if isinstance(v, np.ndarray) and v.dtype == object:
        return _gathered([_detached(e) for e in v.reshape(-1)], v.shape)
    if isinstance(v, Trace):
        return v
    return _value(v)


# ---- inputs ---------------------------------------------------------------------------

def _as_array(x: Any, what: str) -> NDArray[np.float64]:
    if isinstance(x, Tensor):
        if in_program(x):
            # read as numbers it would be a constant of the recording (a guard on its value)
            raise NotImplementedError(
                f"{what}: this derivative transform reads its argument as numbers (as "
                f"ad.jacobian and ad.hessian with sparse=True do), so at a tensor that "
                f"ad.record is recording it cannot be recorded; call it outside the "
                f"recording, or record f and differentiate the recording (F.jacobian(x, "
                f"sparse=True), F.gradient, F.vjp, F.hvp)")
        if _shapes_only(x):
            # eval_shape of a transform: a placeholder of the shape (calloc'd pages, never
            # read); inside the frame the transform's input tensor is made shapes-only again
            return np.zeros(x.shape, dtype=np.float64)
        return np.array(x.value, dtype=np.float64)
    array = np.asarray(x)
    _arrays.check_real(array, what)
    return np.array(array, dtype=np.float64)


def in_program(v: Any) -> bool:
    """Whether ``v`` is (or carries, as a TraceTensor) a tensor of a program ad.record is
    capturing: a transform at such a point is recorded too, as program kernels."""
    if isinstance(v, TraceTensor):
        return in_program(v._value) or in_program(v._tangent)
    return isinstance(v, Tensor) and v._backend.interpreter.replays


def _recording_point(v: Any) -> NDArray[np.float64]:
    """A recorded tensor's value at the recording point, read without a guard: only its
    shape is used (the transform computes from the recorded tensor itself)."""
    v = _base(v)
    return np.array(v._backend.real.to_numpy(v._data.value), dtype=np.float64)


def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", type(f).__name__)


def _shapes_only(v: Any) -> bool:
    """Whether ``v`` is a tensor of eval_shape's (a shape and dtype, no values)."""
    if isinstance(v, TraceTensor):
        v = v._value
    return isinstance(v, Tensor) and not v._backend.interpreter.has_values


def _shapes_jacobian(leaves: list[Any], point_shapes: list[tuple[int, ...]]) -> list[Any]:
    """eval_shape of a Jacobian (an output leaf of eval_shape's): per output leaf, the
    blocks out_shape + in_shape as shapes-only tensors, one per input leaf. Nothing is
    swept: a Jacobian's shape rule needs f's output shapes alone."""
    like = next(v for v in leaves if _shapes_only(v))
    like = like._value if isinstance(like, TraceTensor) else like
    be = like._backend
    return [[wrap(Tensor, be, be.full(_shape(v) + s, 0.0, FLOAT64), _shape(v) + s, FLOAT64)
             for s in point_shapes] for v in leaves]


def _device_of(v: Any) -> Any:
    """The device of a tensor leaf; None for other leaves and for eval_shape's shapes-only
    tensors (the frame puts the transform's inputs on its own backend)."""
    if _shapes_only(v):
        return None
    return v.device if isinstance(v, (Tensor, TraceTensor)) else None


class _Point:
    """A structure of plain arrays: where a transform evaluates ``f``."""

    def __init__(self, x0: Any, what: str = "x0") -> None:
        leaves, self.tree = _point_leaves(x0)
        names = _trees.paths(self.tree, what)
        # recorded leaves (a forward transform inside a reverse one) are kept: the
        # forward pass runs on TraceTensors over them
        self.recorded = [_as_recorded(v) if _trees.is_recorded(v) or in_program(v)
                         or isinstance(v, (Trace, TraceTensor)) else None for v in leaves]
        self.arrays = [_as_array(v if r is None else _number(r), n)
                       for v, r, n in zip(leaves, self.recorded, names)]
        # numbers give floats back; 0-d arrays too (as numpy would)
        self.scalar = [a.ndim == 0 for a in self.arrays]
        self.devices = [_device_of(v) for v in leaves]
        self.level: tuple[int, WengertList | None] = (1, None)     # see _forward_point

    @property
    def size(self) -> int:
        return sum(a.size for a in self.arrays)

    def like(self, v: Any, what: str) -> list[NDArray[np.float64]]:
        """``v`` (a direction) as arrays of this point's structure and shapes."""
        leaves, tree = _trees.flatten(v)
        if tree != self.tree:
            if self.tree.is_leaf and len(leaves) == 1:
                pass
            else:
                raise ValueError(f"{what} must have the structure of x0 "
                                 f"({self.tree.describe()}), got {tree.describe()}")
        out = []
        for a, leaf, name in zip(self.arrays, leaves, _trees.paths(self.tree, what)):
            if in_program(leaf):       # a recorded direction: kept, the pass records it
                if tuple(leaf.shape) != a.shape:
                    raise ValueError(f"{name} must have the shape of x0's leaf, {a.shape}, "
                                     f"got {tuple(leaf.shape)}")
                out.append(leaf)
                continue
            array = _as_array(leaf, name)
            if array.shape != a.shape:
                raise ValueError(f"{name} must have the shape of x0's leaf, {a.shape}, got "
                                 f"{array.shape}")
            out.append(array)
        return out

    def rebuild(self, leaves: list[Any]) -> Any:
        return _trees.unflatten(self.tree, leaves)

    def numbers(self, arrays: list[Any]) -> Any:
        """Arrays of this point's structure, numbers as floats."""
        return self.rebuild([float(a) if s and isinstance(a, np.ndarray) else a
                             for a, s in zip(arrays, self.scalar)])


def _call(f: Callable[..., Any], x: Any, args: tuple[Any, ...]) -> Any:
    return f(x, *args)


def _arguments(extra: tuple[Any, ...], args: Any) -> tuple[Any, ...]:
    if args is None:
        return extra
    if extra:
        raise TypeError("pass f's extra arguments either positionally or as args=(...), "
                        "not both")
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


# ---- what f returned ------------------------------------------------------------------

def _output_leaves(result: Any, f: Callable[..., Any], mode: str) -> tuple[list[Any], TreeDef]:
    """f's result as leaves (Records/Traces/numbers, tensors, or object arrays)."""
    leaves, tree = _trees.flatten(result)
    out = []
    for leaf in leaves:
        if isinstance(leaf, (list, tuple)):
            leaf = np.array(leaf, dtype=object)
        if isinstance(leaf, np.ndarray) and leaf.dtype.kind in "biuf":
            leaf = np.array(leaf, dtype=np.float64)
        elif isinstance(leaf, np.ndarray) and leaf.dtype == object and leaf.ndim == 0:
            leaf = leaf[()]
        if not isinstance(leaf, (Record, Trace, Tensor, TraceTensor, np.ndarray, *_PLAIN_REAL)):
            raise TypeError(f"{_name(f)} must return numbers, arrays or tensors (or tuples, "
                            f"lists or dicts of them), got {type(leaf).__name__}")
        _check_mode(leaf, f, mode)
        out.append(leaf)
    return out, tree


def _check_mode(leaf: Any, f: Callable[..., Any], mode: str) -> None:
    if mode == "any":
        return
    items = leaf.reshape(-1) if isinstance(leaf, np.ndarray) and leaf.dtype == object else [leaf]
    for item in items:
        if mode == "reverse" and isinstance(item, (Trace, TraceTensor)):
            raise TypeError(f"{_name(f)} returned a Trace in reverse mode: it must compute "
                            f"from its argument only, not from Traces made elsewhere")
        if mode == "forward" and (type(item) is Record and item.tape is not None
                                  or isinstance(item, Tensor) and item.tape is not None):
            raise TypeError(f"{_name(f)} returned a Record in forward mode: it must compute "
                            f"from its argument only, not from Records made elsewhere")
        if not isinstance(item, (Record, Trace, Tensor, TraceTensor, *_PLAIN_REAL)):
            raise TypeError(f"{_name(f)} must return numbers, but an element of its output "
                            f"is a {type(item).__name__}")


def _shape(leaf: Any) -> tuple[int, ...]:
    if isinstance(leaf, (Tensor, TraceTensor, np.ndarray)):
        return tuple(leaf.shape)
    return ()


def _value(leaf: Any) -> Any:
    """The value of an output leaf: a float for a scalar, else an ndarray."""
    if isinstance(leaf, (Record, Trace)):
        return leaf.number
    if _shapes_only(leaf):
        # eval_shape of a transform: the shapes are the result
        return leaf._value if isinstance(leaf, TraceTensor) else leaf
    if isinstance(leaf, (Tensor, TraceTensor)):
        return np.array(leaf.value, dtype=np.float64)
    if isinstance(leaf, np.ndarray):
        if leaf.dtype == object:
            return np.array([_value(e) for e in leaf.reshape(-1)],
                            dtype=np.float64).reshape(leaf.shape)
        return leaf
    return float(leaf)


def _is_scalar_output(leaves: list[Any], tree: TreeDef) -> bool:
    return tree.is_leaf and _shape(leaves[0]) == ()


def _scalar_output(result: Any, f: Callable[..., Any], caller: str,
                   mode: str = "reverse") -> Any:
    if type(result) is Record or type(result) is float:     # the common case
        return result
    leaves, tree = _output_leaves(result, f, mode)
    if not _is_scalar_output(leaves, tree):
        got = (f"a structure ({tree.describe()})" if not tree.is_leaf
               else f"shape {_shape(leaves[0])}")
        hint = ("; if its second output is auxiliary data, pass has_aux=True"
                if isinstance(result, (tuple, list)) and len(result) == 2 else "")
        raise TypeError(
            f"{caller} needs {_name(f)} to return a scalar, but it returned {got}: use "
            f"ad.jacobian(f) for all the derivatives, or ad.vjp(f, x0, u) for the gradient "
            f"of one weighted sum u . f{hint}")
    leaf = leaves[0]
    if isinstance(leaf, (Tensor, TraceTensor)):
        return leaf.sum()      # a 0-d tensor: its scalar Record (or Trace)
    return leaf


# ---- the parts of nested values (both modes read them) --------------------------------

def _nested_trace(v: Any) -> bool:
    return isinstance(v, Trace) and type(v) is not Trace


def _over_tape(v: Any) -> bool:
    """A TraceTensor or Trace whose parts are recorded (forward inside reverse)."""
    return _recorded_parts_of(v)


def _tangent_of(v: Any) -> Any:
    if isinstance(v, TraceTensor):        # parts of levels below (or recorded) kept
        return v._tangent if _over_tape(v) or _depth(v) > 1 else \
            np.array(v.tangent, dtype=np.float64)
    if isinstance(v, Trace):
        return v.derivative if _nested_trace(v) else float(v.derivative)
    return None


def _primal_of(v: Any) -> Any:
    if isinstance(v, TraceTensor):
        return v._value if _over_tape(v) or _depth(v) > 1 else \
            np.array(v.value, dtype=np.float64)
    if isinstance(v, Trace):
        return v.number if _nested_trace(v) else float(v.number)
    return v


def _lift(value: Any, tangent: Any) -> Any:
    """A value with a tangent: a TraceTensor over a (recorded) tensor, a Trace (of a
    Record), or, from numbers and arrays, a plain TraceTensor or Trace."""
    if isinstance(value, Tensor):
        if isinstance(tangent, _levels.BatchedBase):   # (vmap_lift's batched basis)
            return TraceTensor._of(value, tangent)
        if not isinstance(tangent, Tensor):
            tangent = Tensor.constant(np.broadcast_to(np.asarray(tangent, dtype=np.float64),
                                                      value.shape), device=value.device)
        return TraceTensor._of(value, tangent)
    if isinstance(value, TraceTensor) and not isinstance(tangent, TraceTensor):
        # forward over forward: the new direction, constant at the levels below
        return TraceTensor._of(value, _constant_like(np.asarray(tangent, np.float64), value))
    if isinstance(value, np.ndarray) and isinstance(tangent, Tensor):   # (recorded)
        return TraceTensor._of(Tensor.constant(value, device=tangent.device), tangent)
    if isinstance(value, np.ndarray):
        return TraceTensor(value, np.broadcast_to(np.asarray(tangent), value.shape))
    if isinstance(tangent, Tensor):          # a scalar value with a recorded 0-d tangent
        tangent = tangent.sum()
    return Trace(value, tangent if isinstance(tangent, (Record, Trace)) else float(tangent))


def _constant_like(array: NDArray[np.float64], like: Any) -> Any:
    """``array`` with ``like``'s levels of tangents, all of them zero."""
    if isinstance(like, TraceTensor):
        return TraceTensor._of(_constant_like(array, like._value),
                               _constant_like(np.zeros(like.shape), like._tangent))
    return Tensor.constant(np.broadcast_to(array, like.shape), device=like.device,
                           dtype=like.dtype)


def _traces_block(items: list[Any], shape: tuple[int, ...]) -> Any:
    """Scalars (Traces of any depth, over Records or floats) as one tensor of ``shape``: a
    TraceTensor of their levels over a recorded Tensor or a constant one."""
    top = max((_depth(v) for v in items), default=0)
    if top:
        parts = [_split_top(v, top) for v in items]
        return TraceTensor._of(_traces_block([p[0] for p in parts], shape),
                               _traces_block([p[1] for p in parts], shape))
    if any(type(v) is Record for v in items):
        return from_scalars(Tensor, resolve(None), np.dtype(np.float64), items, shape)
    return Tensor.constant(np.array(items, dtype=np.float64).reshape(shape))


def _tape_of(v: Any) -> Any:
    if isinstance(v, Tensor) or type(v) is Record:
        return v.tape
    if isinstance(v, np.ndarray) and v.dtype == object:
        for e in v.reshape(-1):
            if type(e) is Record and e.tape is not None:
                return e.tape
    return None


# ---- leaves as recorded values or numbers (a point's inputs) --------------------------

def _as_recorded(v: Any) -> Any:
    """A recorded leaf as a Tensor or a Record (object arrays of Records gathered)."""
    if isinstance(v, np.ndarray):
        items = [e if type(e) is Record else float(e) for e in v.reshape(-1)]
        return from_scalars(Tensor, resolve(None), np.dtype(np.float64), items, v.shape)
    return v


def _number(v: Any) -> Any:
    if in_program(v):
        return _recording_point(v)
    if isinstance(v, (Tensor, TraceTensor)):       # (a TraceTensor: its innermost values)
        return v.value
    while isinstance(v, (Trace, Record)):      # a Trace (of Traces): its innermost value
        v = v.number
    return v

"""How a transform evaluates ``f``: its point, its inputs in each mode, and what it reads
back from f's outputs (the machinery under ``functional.py``'s API).

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

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _arrays, _levels, _trees
from easyad._core import Node, Record, Trace, WengertList
from easyad._trees import LEAF, TreeDef
from easyad.errors import TapeMismatchError
from easyad.tensor import Tensor, TraceTensor, _meta, get_device, stack
from easyad.tensor._base import FLOAT64, Elements, _no_vjp, wrap
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
        return np.array(x.value, dtype=np.float64)
    array = np.asarray(x)
    _arrays.check_real(array, what)
    return np.array(array, dtype=np.float64)


def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", type(f).__name__)


class _Point:
    """A structure of plain arrays: where a transform evaluates ``f``."""

    def __init__(self, x0: Any, what: str = "x0") -> None:
        leaves, self.tree = _point_leaves(x0)
        names = _trees.paths(self.tree, what)
        # recorded leaves (a forward transform inside a reverse one) are kept: the
        # forward pass runs on TraceTensors over them
        self.recorded = [_as_recorded(v) if _trees.is_recorded(v)
                         or isinstance(v, (Trace, TraceTensor)) else None for v in leaves]
        self.arrays = [_as_array(v if r is None else _number(r), n)
                       for v, r, n in zip(leaves, self.recorded, names)]
        # numbers give floats back; 0-d arrays too (as numpy would)
        self.scalar = [a.ndim == 0 for a in self.arrays]
        self.devices = [v.device if isinstance(v, (Tensor, TraceTensor)) else None
                        for v in leaves]
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


# ---- reverse mode ---------------------------------------------------------------------

class _Reverse:
    """One reverse-mode evaluation of ``f``: its inputs on a list, f's output on it.

    At the top level the inputs are fresh variables (Tensors whose elements are Records,
    Records for numbers) and the sweeps are the plain ones. Inside another reverse
    transform (the point is recorded) the inputs are copies on the SAME list and the
    sweeps are recorded (``create_graph``), so the results can be differentiated again.
    """

    def __init__(self, f: Callable[..., Any], x0: Any, args: tuple[Any, ...],
                 elements: bool = True) -> None:
        open_depth, open_tape = _LEVEL.get()
        if (type(x0) is np.ndarray and x0.ndim and x0.dtype.kind in "biuf"
                and open_depth == 0 and open_tape is None):
            self._one_array(f, x0, args, elements)
            return
        leaves, tree = _point_leaves(x0)
        # under forward levels (Traces reach us, in the point or in f's closure): forward
        # over reverse. The inputs are variables under the point's Trace levels (raised
        # to the open depth), f runs on Traces of Records (TraceTensors over recorded
        # tensors), and each derivative is swept from every part of the output, which
        # gives the gradient with its tangents (H v) at each of those levels
        self.depth = max([open_depth] + [_depth(v) for v in leaves])
        traced = leaves
        if self.depth:
            leaves = [_base(v) for v in leaves]
            if any(isinstance(v, np.ndarray) and v.dtype == object and _depth(v)
                   for v in leaves):
                raise NotImplementedError(
                    "a reverse transform at a point of arrays of Traces: pass a TraceTensor "
                    "(or use forward mode for the inner transform)")
        tapes = {id(t): t for t in (_tape_of(v) for v in leaves) if t is not None}
        if len(tapes) > 1:
            raise ValueError("the point holds records of two different WengertLists")
        if not tapes and open_tape is not None:
            # f may close over Records of an outer reverse transform: record on its list
            tapes = {id(open_tape): open_tape}
        self.nested = bool(tapes)
        self.tape: WengertList = next(iter(tapes.values())) if tapes else WengertList()
        self.point = None if self.nested else _Point(_trees.unflatten(tree, leaves))
        if self.nested:
            self.inputs = [self._copy(v) for v in leaves]
            self.scalar = [not isinstance(v, Tensor) for v in self.inputs]
        else:
            assert self.point is not None
            self.scalar = list(self.point.scalar)
            self.inputs = [self._make(a, s, d, elements) for a, s, d in
                           zip(self.point.arrays, self.point.scalar, self.point.devices)]
        self.tree = tree
        self.shapes = [() if s else tuple(i.shape) for s, i in zip(self.scalar, self.inputs)]
        given = self.inputs
        if self.depth:
            given = [_rebase(v, x, self.depth) for v, x in zip(traced, self.inputs)]
        with _level(self.depth, self.tape):
            self.result = _call(f, _trees.unflatten(tree, given), args)

    def _one_array(self, f: Callable[..., Any], x0: NDArray[Any], args: tuple[Any, ...],
                   elements: bool) -> None:
        """The common case, set up without the structure machinery: one plain array of
        reals (no structure, nothing recorded or traced) on a fresh list."""
        self.depth = 0
        self.nested = False
        self.tape = WengertList()
        self.point = None
        self.tree = LEAF
        self.scalar = [False]
        self.shapes = [x0.shape]
        x = _input_tensor(x0, self.tape, elements)
        self.inputs = [x]
        token = _LEVEL.set((0, self.tape))     # (_level, inlined: the common case)
        try:
            self.result = f(x, *args)
        finally:
            _LEVEL.reset(token)

    @property
    def mode(self) -> str:
        """What f's outputs may hold: Traces too under a forward transform."""
        return "any" if self.depth else "reverse"

    def _make(self, a: NDArray[np.float64], scalar: bool, device: Any, elements: bool) -> Any:
        if scalar:
            return self.tape.variable(float(a))
        return _input_tensor(a, self.tape, elements, device)

    def _copy(self, v: Any) -> Any:
        # a new entry for the inner transform to differentiate by (its adjoint is the
        # derivative with respect to this argument alone)
        if isinstance(v, Tensor):
            return v + 0.0 if v.tape is not None else Tensor.variable(v.value, self.tape,
                                                                      device=v.device)
        if type(v) is Record:
            return v + 0.0 if v.tape is not None else self.tape.variable(v.number)
        if isinstance(v, np.ndarray) and v.dtype == object:
            items = [e if type(e) is Record else float(e) for e in v.reshape(-1)]
            return from_scalars(Tensor, resolve(None), np.dtype(np.float64), items,
                                v.shape) + 0.0
        a = _as_array(v, "x0")
        return self.tape.variable(float(a)) if a.ndim == 0 else \
            Tensor.variable(a, self.tape, device=get_device())

    def sweep(self, z: Any, seed: Any = None, last: bool = False) -> list[Any]:
        """d z / d inputs: arrays and floats at the top level, recorded values inside.
        A tensor ``z`` at the top level sweeps with adjoint ``seed`` (ones: its sum).
        Under a forward transform: Traces/TraceTensors (derivative, its tangent).
        ``last``: no sweep of this evaluation follows, so a list of its own (top level)
        releases the values tensor operations saved as the sweep passes them."""
        if self.depth:
            return self._swept_levels(z, last)
        return self._plain_sweep(z, seed, last)

    def _swept_levels(self, z: Any, last: bool) -> list[Any]:
        """Under forward levels: each part of z swept (its top level split, recursively),
        the derivatives joined again level by level."""
        if isinstance(z, TraceTensor):
            z = z.sum()
        if isinstance(z, Trace):
            first = self._swept_levels(z.number, False)
            second = self._swept_levels(z.derivative, last)
            return [_join(g0, g1) for g0, g1 in zip(first, second)]
        return self._plain_sweep(z, last=last)

    def value(self, out: Any) -> Any:
        """An output for the caller: as it is on a shared list, else numbers (under
        forward levels: Traces of numbers)."""
        if self.nested:
            return out
        return _detached(out) if self.depth else _value(out)

    def _plain_sweep(self, z: Any, seed: Any = None, last: bool = False) -> list[Any]:
        if type(z) is Record and z.tape is self.tape and not self.nested:   # the common case
            return self._read(self.tape._backward_from(z, None, last))
        if isinstance(z, Tensor) and not self.nested and z.tape is self.tape:
            d = z.derivatives(np.ones(z.shape) if seed is None else seed)
            return self._read(d)
        if isinstance(z, Tensor):
            z = z.sum()
        if type(z) is not Record or z.tape is None:
            return [self._zero(k) for k in range(len(self.inputs))]
        if z.tape is not self.tape:
            raise TapeMismatchError("f returned a Record of another WengertList; it must "
                                    "compute from its argument only")
        if self.nested:
            d = z.derivatives(create_graph=True)
            return [d[x] for x in self.inputs]
        return self._read(self.tape._backward_from(z, None, last))

    def _read(self, d: Any) -> list[Any]:
        # top level only: each sweep's Derivatives are read once, so the gradients are
        # taken out of them (uncopied where nothing else holds them)
        return [d[x] if s else _input_gradient(x, d) for x, s in zip(self.inputs, self.scalar)]

    def _zero(self, k: int) -> Any:
        if self.nested:
            x = self.inputs[k]
            return 0.0 if self.scalar[k] else x.detach() * 0.0
        return 0.0 if self.scalar[k] else np.zeros(self.shapes[k])

    def gradient(self, cotangents: list[Any]) -> Any:
        return _trees.unflatten(self.tree, cotangents)


def _input_tensor(a: NDArray[Any], tape: WengertList, elements: bool,
                  device: Any = None) -> Tensor:
    """A transform's input tensor on ``tape`` for the array ``a`` (on ``device``, None: the
    default): on the host (numpy) a float64 C-contiguous ``a`` is read in place, through a
    read-only view (no copy: the tensor layer never writes into an operand's buffer, and
    the view makes sure of it)."""
    device = get_device() if device is None else device
    be = resolve(device)
    if be.kind != "numpy" or _meta.tracing():
        array = np.asarray(a, dtype=np.float64)
        return (Tensor._input(array, tape, device=device) if elements
                else Tensor.variable(array, tape, device=device))
    if a.dtype == np.float64 and a.flags.c_contiguous and a.flags.aligned:
        data = a.view()     # (dtype equality includes byte order: a native array)
        data.flags.writeable = False
    else:
        data = np.array(a, dtype=np.float64, order="C")
    handle = tape._push_node(Node("variable", (), _no_vjp))
    x: Tensor = wrap(Tensor, be, be._track(data), a.shape, FLOAT64, tape, handle)
    if elements:
        x._elements = Elements(data)
    return x


def _input_gradient(x: Tensor, d: Any) -> NDArray[np.float64]:
    """The derivative of a transform's input ``x`` in the sweep ``d`` (of its own list,
    read once): its tensor adjoint plus its elements' adjoints, as an array the caller
    owns. On the host the adjoint's own buffer is handed over when nothing else holds it
    (a fresh C-contiguous float64 array: the sum the sweep made), not copied again."""
    if x._backend.kind != "numpy":
        return x.input_derivative(d)
    elements = x._elements
    extra = None
    if elements is not None and elements.records is not None:
        extra = np.fromiter((d[r] for r in elements.records.reshape(-1)), dtype=np.float64,
                            count=x.size).reshape(x._shape)
    a = d._take_node_adjoint(x._index)
    if a is None:
        return extra if extra is not None else np.zeros(x._shape)
    # two references: ``a`` and getrefcount's argument. Anything more (a buffer a custom
    # vjp also keeps, one adjoint given to two inputs) or a view, a broadcast, another
    # dtype: copied
    if (type(a) is not np.ndarray or a.base is not None or a.dtype != np.float64
            or a.shape != x._shape or not a.flags.c_contiguous or not a.flags.writeable
            or sys.getrefcount(a) > 2):
        a = np.array(a, dtype=np.float64).reshape(x._shape)
    if extra is not None:
        a += extra
    return a


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
        if not isinstance(tangent, Tensor):
            tangent = Tensor.constant(np.broadcast_to(np.asarray(tangent, dtype=np.float64),
                                                      value.shape), device=value.device)
        return TraceTensor._of(value, tangent)
    if isinstance(value, TraceTensor) and not isinstance(tangent, TraceTensor):
        # forward over forward: the new direction, constant at the levels below
        return TraceTensor._of(value, _constant_like(np.asarray(tangent, np.float64), value))
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


def _rows(run: _Reverse, leaf: Any) -> tuple[tuple[int, ...], list[list[Any]]]:
    """An output leaf's shape and, per element (flat), its derivatives by the inputs."""
    if isinstance(leaf, Tensor) and not run.nested and leaf.tape is run.tape:
        # seeded sweeps from the tensor: no entry per row on the list
        rows = []
        for i in range(leaf.size):
            seed = np.zeros(leaf.size)
            seed[i] = 1.0
            rows.append(run.sweep(leaf, seed.reshape(leaf.shape)))
        return leaf.shape, rows
    shape, element = _scalars_of(leaf)
    return shape, [run.sweep(element(i)) for i in range(int(np.prod(shape, dtype=int)))]


def _scalars_of(leaf: Any) -> tuple[tuple[int, ...], Callable[[int], Any]]:
    """An output leaf's shape and a function giving its element i (flat) as a scalar."""
    if isinstance(leaf, (Tensor, TraceTensor)):      # (under forward levels: TraceTensors)
        if leaf.shape == ():
            return (), lambda i: leaf.sum()
        flat = leaf.reshape(-1)
        return leaf.shape, lambda i: flat[i]
    if isinstance(leaf, np.ndarray):
        items = leaf.reshape(-1)
        return leaf.shape, lambda i: items[i]
    return (), lambda i: leaf


def _assemble(rows: list[Any], out_shape: tuple[int, ...], in_shape: tuple[int, ...],
              scalar_in: bool, nested: bool) -> Any:
    """Rows (one per output element: the derivative with respect to one input) as the
    block of shape out_shape + in_shape (recorded when nested; a TraceTensor of the
    blocks of both parts under a forward transform)."""
    if rows and isinstance(rows[0], (Trace, TraceTensor)):
        parts = [_assemble([_primal_of(r) for r in rows], out_shape, in_shape, scalar_in,
                           nested),
                 _assemble([_tangent_of(r) for r in rows], out_shape, in_shape, scalar_in,
                           nested)]
        return _join(*parts)
    if not nested:
        block = np.array(rows, dtype=np.float64).reshape(out_shape + in_shape)
        return float(block) if block.ndim == 0 else block
    if out_shape == () and len(rows) == 1:
        return rows[0]
    if scalar_in:
        return from_scalars(Tensor, resolve(None), np.dtype(np.float64), rows, out_shape)
    return stack(rows).reshape(out_shape + in_shape)


def _jacobian_reverse(f: Callable[..., Any], x0: Any, args: tuple[Any, ...]) -> Any:
    run = _Reverse(f, x0, args)
    leaves, out_tree = _output_leaves(run.result, f, run.mode)
    blocks = []
    for leaf in leaves:
        shape, rows = _rows(run, leaf)
        per_input = [_assemble([r[k] for r in rows], shape, run.shapes[k], run.scalar[k],
                               run.nested) for k in range(len(run.inputs))]
        blocks.append(_trees.unflatten(run.tree, per_input))
    return _trees.unflatten(out_tree, blocks)


# ---- forward mode ---------------------------------------------------------------------

def _as_recorded(v: Any) -> Any:
    """A recorded leaf as a Tensor or a Record (object arrays of Records gathered)."""
    if isinstance(v, np.ndarray):
        items = [e if type(e) is Record else float(e) for e in v.reshape(-1)]
        return from_scalars(Tensor, resolve(None), np.dtype(np.float64), items, v.shape)
    return v


def _number(v: Any) -> Any:
    if isinstance(v, (Tensor, TraceTensor)):       # (a TraceTensor: its innermost values)
        return v.value
    while isinstance(v, (Trace, Record)):      # a Trace (of Traces): its innermost value
        v = v.number
    return v


def _forward_point(x0: Any, caller: str) -> _Point:
    leaves, _ = _trees.flatten(x0)
    # a Trace or TraceTensor is nested (forward over forward); object arrays of Traces not
    if any(_trees.is_traced(v) and not isinstance(v, (Trace, TraceTensor)) for v in leaves):
        raise NotImplementedError(
            f"{caller} (forward mode) inside another forward-mode transform: nest Traces "
            f"directly, or use reverse mode for one of them")
    point = _Point(x0)
    # this transform's level: one depth above every level open around it and above the
    # point; over Records when a reverse transform is open (or the point is recorded)
    open_depth, tape = _LEVEL.get()
    depth = max([open_depth] + [_depth(r) for r in point.recorded if r is not None]) + 1
    if tape is None:
        tape = next((t for t in (_tape_of(_base(r)) for r in point.recorded
                                 if r is not None) if t is not None), None)
    point.level = (depth, tape)
    return point


def _forward_inputs(point: _Point, tangents: list[Any]) -> list[Any]:
    depth, tape = point.level
    inputs: list[Any] = []
    for a, t, scalar, device, recorded in zip(point.arrays, tangents, point.scalar,
                                              point.devices, point.recorded):
        if recorded is None and depth == 1 and tape is None:      # the common case
            inputs.append(Trace(float(a), float(t)) if scalar else TraceTensor._input(
                a, t, device if device is not None else get_device()))
            continue
        device = device if device is not None else get_device()
        base = recorded
        if base is None:
            # inside a reverse transform: on its list, so the Records f's closure holds
            # meet a Trace over Records (a float Trace and a Record do not mix)
            base = float(a) if tape is None and scalar else a if tape is None else \
                tape.variable(float(a)) if scalar else Tensor.variable(a, tape, device=device)
        inputs.append(_lift(_constant_above(base, depth - 1), t))
    return inputs


def _forward_run(f: Callable[..., Any], point: _Point, tangents: list[Any],
                 args: tuple[Any, ...]) -> Any:
    inputs = _forward_inputs(point, tangents)
    token = _LEVEL.set(point.level)       # (_level, inlined: every forward pass)
    try:
        return _call(f, point.rebuild(inputs), args)
    finally:
        _LEVEL.reset(token)


def _forward_nested(point: _Point) -> bool:
    """Whether a forward transform's results stay values of the levels around it
    (Traces, Records) rather than numbers."""
    depth, tape = point.level
    return depth > 1 or tape is not None


def _tangent(leaf: Any) -> Any:
    """The tangent f carried out in an output leaf (zeros for constants)."""
    if isinstance(leaf, Trace):
        return leaf.derivative
    if isinstance(leaf, TraceTensor):
        return np.array(leaf.tangent, dtype=np.float64)
    if isinstance(leaf, Tensor):
        return np.zeros(leaf.shape)
    if isinstance(leaf, np.ndarray):
        if leaf.dtype == object:
            return np.array([_tangent(e) for e in leaf.reshape(-1)],
                            dtype=np.float64).reshape(leaf.shape)
        return np.zeros(leaf.shape)
    return 0.0


def _jacobian_forward(f: Callable[..., Any], point: _Point, args: tuple[Any, ...],
                      first: Any = None) -> Any:
    columns: list[list[Any]] = []       # per input element: the output leaves' tangents
    nested = _forward_nested(point)
    depth = point.level[0]
    mode = "any" if nested else "forward"
    out_tree: TreeDef | None = None
    out_shapes: list[tuple[int, ...]] = []
    for k, a in enumerate(point.arrays):
        for j in range(a.size):
            if first is not None and not columns:
                result = first
            else:
                tangents = [np.zeros(b.shape) for b in point.arrays]
                tangents[k].reshape(-1)[j] = 1.0
                result = _forward_run(f, point, tangents, args)
            leaves, tree = _output_leaves(result, f, mode)
            shapes = [_shape(v) for v in leaves]
            if out_tree is None:
                out_tree, out_shapes = tree, shapes
            elif (tree, shapes) != (out_tree, out_shapes):
                raise ValueError(f"{_name(f)} returned outputs of another structure or shape "
                                 f"on one pass than on another: its output must not change "
                                 f"size")
            columns.append([_split_top(v, depth)[1] if nested else _tangent(v)
                            for v in leaves])
    if out_tree is None:       # no inputs: one evaluation tells the output's structure
        leaves, out_tree = _output_leaves(_forward_run(f, point, point.arrays, args), f,
                                          mode)
        out_shapes = [_shape(v) for v in leaves]
    blocks = []
    for i, out_shape in enumerate(out_shapes):
        per_input, start = [], 0
        for a in point.arrays:
            if nested:       # recorded columns: a recorded block
                part = [c[i] for c in columns[start:start + a.size]]
                start += a.size
                per_input.append(_recorded_block(part, out_shape, a.shape))
                continue
            cols = [np.asarray(c[i], dtype=np.float64) for c in columns[start:start + a.size]]
            start += a.size
            block = (np.stack(cols, axis=-1) if cols else np.zeros(out_shape + (0,)))
            block = block.reshape(out_shape + a.shape)
            per_input.append(float(block) if block.ndim == 0 else block)
        blocks.append(point.rebuild(per_input))
    return _trees.unflatten(out_tree, blocks)


def _recorded_block(columns: list[Any], out_shape: tuple[int, ...],
                    in_shape: tuple[int, ...]) -> Any:
    """Recorded columns (one per input element, each of out_shape) as the recorded block
    out_shape + in_shape."""
    if out_shape == ():
        if in_shape == ():
            return columns[0]
        return _traces_block(columns, in_shape)
    return stack(columns, axis=-1).reshape(out_shape + in_shape)

"""Reverse mode for the transforms of ``functional.py``: ``_Reverse``, one evaluation of f
on a list (fresh variables at the top level; copies on the same list, with recorded
sweeps, inside another reverse transform; TraceTensors over recorded tensors inside a
forward one), the inputs it makes and the gradients it reads back, and Jacobians
assembled row by row. Its own module because it is one transform: what it shares with
forward mode (levels, points, nested values, outputs) is ``_evaluation.py``.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _higher, _trees
from easyad._core import Node, Record, Trace, WengertList
from easyad._evaluation import (in_program, _as_array, _base, _call, _depth, _detached, _join,
                                _name, _output_leaves, _Point, _point_leaves, _primal_of,
                                _rebase, _shape, _shapes_jacobian, _shapes_only, _tangent_of,
                                _tape_of, _value)
from easyad._levels import LEVEL as _LEVEL
from easyad._levels import opened as _level
from easyad._trees import LEAF
from easyad.errors import TapeMismatchError
from easyad.tensor import Tensor, TraceTensor, get_device, stack
from easyad.tensor._base import FLOAT64, Elements, _no_vjp, wrap
from easyad.tensor._devices import resolve
from easyad.tensor._interpreters import innermost, new_tensor_backend
from easyad.tensor._program import ProgramBackend
from easyad.tensor._structural import from_scalars


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
        # a point ad.record is recording as tensor code: the transform is recorded too
        # (inputs on a list over its slots, sweeps with create_graph: program kernels)
        program = any(in_program(v) for v in leaves)
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
        recording = innermost(ProgramBackend)
        if not tapes and program and recording is not None and recording.tape is not None:
            # f may close over the recording's inputs: record on the recording's list
            tapes = {id(recording.tape): recording.tape}
        self.nested = bool(tapes) or program
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

    def adopt(self, tensors: list[Tensor]) -> None:
        """Take tensors made on this list while f ran (top level, numpy: vmap's probes
        of values the same in every example) as inputs too: the sweep then gives their
        derivatives after the point's."""
        self.inputs = self.inputs + list(tensors)
        self.scalar = self.scalar + [False] * len(tensors)
        self.shapes = self.shapes + [tuple(t.shape) for t in tensors]

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
            if v.tape is not None:
                return v + 0.0
            if in_program(v):      # a recorded input off any list: a variable over its slot
                handle = self.tape._push_node(Node("variable", (), _no_vjp))
                return wrap(Tensor, v._backend, v._data, v.shape, v.dtype, self.tape, handle)
            return Tensor.variable(v.value, self.tape, device=v.device)
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
        if isinstance(z, Tensor) and z.tape is self.tape and self.nested:
            # recorded tensor code keeps numbers as 0-d tensors: the recorded sweep from one
            seed = wrap(Tensor, z._backend, z._backend.full(z.shape, 1.0, z.dtype), z.shape,
                        z.dtype)
            d = _higher.backward_graph(z.handle, seed)
            return [d[x] for x in self.inputs]
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
    default): on the host (numpy), with no interpreter frame open, a float64 C-contiguous
    ``a`` is read in place, through a read-only view (no copy: the tensor layer never
    writes into an operand's buffer, and the view makes sure of it). Inside a frame (a
    recording, eval_shape) the input goes where the frame puts new tensors, so the
    constants of the function differentiated there meet it on one backend."""
    device = get_device() if device is None else device
    be = resolve(device)
    if be.kind != "numpy" or new_tensor_backend() is not None:
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
    if not x._backend.interpreter.has_values:
        return x._derivative_tensor(d)      # eval_shape of a transform: shapes only
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
    base = a.base if type(a) is np.ndarray else None
    if (type(base) is np.ndarray and base.base is None and base.shape == x._shape
            and base.dtype == np.float64 and base.flags.c_contiguous
            and base.flags.writeable and a.flags.c_contiguous and sys.getrefcount(base) == 3
            and sys.getrefcount(a) == 2):
        a = base        # a same-shape view of an array nothing else holds: that array
    del base
    if (type(a) is not np.ndarray or a.base is not None or a.dtype != np.float64
            or a.shape != x._shape or not a.flags.c_contiguous or not a.flags.writeable
            or sys.getrefcount(a) > 2):
        a = np.array(a, dtype=np.float64).reshape(x._shape)
    if extra is not None:
        a += extra
    return a


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
    if any(_shapes_only(v) for v in leaves):        # eval_shape: shapes only
        return _trees.unflatten(out_tree, [_trees.unflatten(run.tree, b) for b in
                                           _shapes_jacobian(leaves, run.shapes)])
    blocks = []
    for leaf in leaves:
        shape, rows = _rows(run, leaf)
        per_input = [_assemble([r[k] for r in rows], shape, run.shapes[k], run.scalar[k],
                               run.nested) for k in range(len(run.inputs))]
        blocks.append(_trees.unflatten(run.tree, per_input))
    return _trees.unflatten(out_tree, blocks)


def weighted_sweep(run: _Reverse, f: Callable[..., Any], u: Any) -> tuple[Any, Any]:
    """ad.vjp's (value, u^T J) from the evaluation ``run`` of f: the sweep from sum(u * f),
    or, for one tensor output on the transform's own list, the sweep seeded with u."""
    leaves, tree = _output_leaves(run.result, f, run.mode)
    weights, wtree = _trees.flatten(u)
    if wtree != tree and not (tree.is_leaf and len(weights) == 1):
        raise ValueError(f"u must have the structure of {_name(f)}'s output "
                         f"({tree.describe()}), got {wtree.describe()}")
    if (len(leaves) == 1 and isinstance(leaves[0], Tensor) and not run.nested
            and not run.depth and leaves[0].tape is run.tape
            and leaves[0].dtype == np.float64 and isinstance(weights[0], np.ndarray)
            and weights[0].dtype == np.float64
            and tuple(weights[0].shape) == tuple(leaves[0].shape)):
        # one tensor output on the transform's own list: one sweep seeded with u (the
        # adjoint sum(u * f) would give it: u itself), not a recorded product and sum
        value = _trees.unflatten(tree, [run.value(leaves[0])])
        return value, run.gradient(run.sweep(leaves[0], weights[0]))
    total: Any = 0.0
    for leaf, weight, name in zip(leaves, weights, _trees.paths(tree, "u")):
        shape = _shape(leaf)
        # (weights ad.record is recording stay tensors: the weighted sum is recorded)
        w = weight if in_program(weight) else _as_array(weight, name)
        if tuple(w.shape) != shape and not (shape == () and tuple(w.shape) == (1,)):
            what = "a scalar" if shape == () else f"shape {shape}"
            raise ValueError(f"{name} must have one weight per output element of "
                             f"{_name(f)}, so {what}; got shape {w.shape}")
        total = total + _weighted(leaf, w.reshape(shape))
    value = _trees.unflatten(tree, [run.value(e) for e in leaves])
    return value, run.gradient(run.sweep(total, last=True))


def _weighted(leaf: Any, w: NDArray[np.float64]) -> Any:
    """sum(w * leaf), leaving out the zero weights."""
    if in_program(w):
        return (leaf * w).sum()
    if isinstance(leaf, Tensor):
        return (leaf * w).sum() if w.shape else leaf.sum() * float(w)
    if isinstance(leaf, np.ndarray):
        total: Any = 0.0
        for weight, element in zip(w.reshape(-1), leaf.reshape(-1)):
            if weight != 0.0:
                total = total + float(weight) * element
        return total
    return float(w) * leaf if float(w) != 0.0 else 0.0

"""What a TensorFunction records: one capture of f at a point (``_Recording``: the
program of ``tensor/_program.py``, its input and output slots, and the slots of each kind
of result: gradient, SGD step, HVP, VJP) and the small records of its inputs (arguments
after x split into leaves and statics, leaves already on the device). Kept apart from
``TensorFunction`` (``easyad/_recorded.py``) because recording is done once per kind of
result and replay many times: the two change for different reasons.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _arrays, _trees
from easyad._core import WengertList
from easyad.tensor import Tensor
from easyad.tensor._base import Node, TensorBase, _no_vjp, wrap
from easyad.tensor._parameters import ParameterValues
from easyad.tensor._interpreters import interpreting
from easyad.tensor._program import Program, ProgramBackend, Slot

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

_WHAT = ("value", "gradient", "hvp", "vjp")


def _recording_of(what: str) -> str:
    """Which recording answers ``what``: the gradient's (values, gradients, SGD steps), the
    HVP's (a second sweep) or the VJP's (cotangents of the outputs as inputs)."""
    return what if what in ("hvp", "vjp") else "first"


def _float_leaf(v: Any) -> bool:
    """Whether an argument after x is an input of the program (a float array), else a
    static. Complex numbers, dates and time spans are neither: refused (TypeError)."""
    if isinstance(v, TensorBase):
        return True
    if isinstance(v, (np.ndarray, list, tuple)):
        kind = (v if isinstance(v, np.ndarray) else np.asarray(v)).dtype.kind
        if kind in "cmM":
            _arrays.check_real(np.asarray(v), "an argument after x")
        return kind == "f"
    _arrays.refuse_complex_scalar(v, "an argument after x")
    return False


def _flatten_args(args: tuple[Any, ...]) -> tuple[list[Any], tuple[Any, ...]]:
    """The leaves of the arguments after x, each argument a structure of its own."""
    leaves: list[Any] = []
    trees = []
    for a in args:
        found, tree = _trees.flatten(a)
        leaves += found
        trees.append(tree)
    return leaves, tuple(trees)


def _unflatten_args(trees: tuple[Any, ...], leaves: list[Any]) -> list[Any]:
    out, k = [], 0
    for tree in trees:
        n = tree.leaf_count
        out.append(_trees.unflatten(tree, leaves[k:k + n]))
        k += n
    return out


class _Resident:
    """An x leaf or float argument already on the Function's device
    (``TensorFunction._resident``, ``_resident_argument``): its ``buffer`` goes into the
    program as it is; ``values``: the Parameter's values, which sgd_step replaces with the
    new buffer (None for a Tensor, which cannot change)."""

    __slots__ = ("buffer", "values", "leaf")

    def __init__(self, buffer: Any, values: ParameterValues | None, leaf: Any) -> None:
        self.buffer, self.values, self.leaf = buffer, values, leaf

    def host(self) -> np.ndarray:
        return self.values.read() if self.values is not None else np.asarray(self.leaf.value)


def _on_host(xs: list[Any]) -> list[np.ndarray]:
    """x's leaves as host arrays, for recording (again): device leaves are read."""
    return [a.host() if type(a) is _Resident else a for a in xs]


class _Static:
    """A static argument: compared with what replay is given."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def same(self, other: Any) -> bool:
        a = self.value
        if type(a) is np.ndarray and type(other) is np.ndarray and a.dtype == other.dtype \
                and a.dtype.kind in "biu" and a.shape == other.shape:
            # integer labels at each step: equal values are equal bytes (no NaN, no -0),
            # ~20x cheaper than array_equal's conversions
            return a.tobytes() == other.tobytes()
        if isinstance(a, np.ndarray) or isinstance(other, np.ndarray):
            return bool(np.array_equal(np.asarray(a), np.asarray(other)))
        if a is other:
            return True
        try:
            return bool(a == other)
        except Exception:
            return False


class _Recording:
    """One capture of f at a point: the program, its input slots in order (the
    differentiated leaves, then the float arguments), the output slots and, per kind of
    result, the slots that answer it."""

    def __init__(self, f: Any, x_leaves: list[np.ndarray], x_tree: Any, arg_leaves: list[Any],
                 arg_tree: Any, backend: Backend, kind: str,
                 out_specs: list[tuple[tuple[int, ...], Any]] | None = None) -> None:
        hvp = kind == "hvp"
        self.program = program = Program()
        be = ProgramBackend(backend, program)
        lst = be.tape = WengertList()
        tape: Any = lst
        xs = []
        for a in x_leaves:
            slot = be.input(a, a.dtype)
            handle = tape._push_node(Node("variable", (), _no_vjp))
            xs.append(wrap(Tensor, be, slot, a.shape, a.dtype, lst, handle))
        args = []
        for v in arg_leaves:
            if isinstance(v, _Static):
                args.append(v.value)
            else:
                slot = be.input(v, v.dtype)
                args.append(wrap(Tensor, be, slot, v.shape, v.dtype))
        tangents = []
        if hvp:
            for a in x_leaves:
                slot = be.input(a, a.dtype)
                tangents.append(wrap(Tensor, be, slot, a.shape, a.dtype))
        elif kind == "vjp":    # a cotangent per output leaf (shapes from the first recording)
            for shape, dtype in out_specs or ():
                slot = be.input(np.zeros(shape, dtype), dtype)
                tangents.append(wrap(Tensor, be, slot, shape, dtype))
        else:      # an input of every call (before the module parameters f reads)
            learning_rate = be.input(np.zeros(()), np.float64)
        with interpreting(be):
            y = f(_trees.unflatten(x_tree, xs), *_unflatten_args(arg_tree, args))
            out_leaves, self.out_tree = _trees.flatten(y)
            self.outputs = [self._output(be, v) for v in out_leaves]
            self.n_forward = len(program.instructions)
            self.gradient: list[int] | None = None
            self.descended: list[int] | None = None
            self.hvp: list[int] | None = None
            self.vjp: list[int] | None = None
            self.out_specs = [(tuple(np.shape(v)), v.dtype if isinstance(v, TensorBase)
                               else np.dtype(np.float64)) for v in out_leaves]
            if kind == "vjp":
                self.vjp = self._vjp(be, lst, out_leaves, xs, tangents)
            elif len(out_leaves) == 1 and isinstance(out_leaves[0], TensorBase) \
                    and out_leaves[0].size == 1 and out_leaves[0].tape is lst:
                z = out_leaves[0]
                if hvp:
                    self.hvp = self._hvp(be, lst, z, xs, tangents)
                else:
                    seed = be.full(z.shape, 1.0, z.dtype)
                    d = tape._backward_from(z.handle, seed)
                    adjoints = [self._adjoint(be, d, t) for t in xs]
                    self.gradient = [g.index for g in adjoints]
                    self.descended = [self._descend(be, t._data, g, learning_rate)
                                      for t, g in zip(xs, adjoints)]
            self.scalar_output = len(out_leaves) == 1 and np.ndim(out_leaves[0]) == 0
        self.guards = sum(1 for i in program.instructions if i.op == "guard")

    @staticmethod
    def _output(be: ProgramBackend, v: Any) -> int:
        if isinstance(v, TensorBase):
            if v._backend is not be:
                raise ValueError("f returned a tensor made outside it (not from its inputs)")
            return int(v._data.index)
        a = _arrays.real_array(v, "an output of f")    # (complex: refused, not dropped)
        return be._constant(be.real.asarray(a, a.dtype)).index

    @staticmethod
    def _adjoint(be: ProgramBackend, d: Any, t: TensorBase) -> Slot:
        found = d._node_adjoint(t._index)
        if found is None:
            found = be.full(t.shape, 0.0, t.dtype)
        return found   # type: ignore[no-any-return]

    @staticmethod
    def _descend(be: ProgramBackend, x: Slot, g: Slot, learning_rate: Slot) -> int:
        """The slot of ``x - g * lr`` (``optim.SGD``'s update), which replay may write
        into x's own memory."""
        (out,) = be.map("sgd_step", ("x - g * lr",), {"x": x, "g": g, "lr": learning_rate},
                        x.shape, (x.dtype,))
        be.program.in_place[out.index] = x.index
        return int(out.index)

    @classmethod
    def _vjp(cls, be: ProgramBackend, lst: Any, outs: list[Any], xs: list[Any],
             cotangents: list[Any]) -> list[int]:
        """The slots of sum_i <u_i, y_i>'s gradient: the VJP with the cotangent inputs."""
        total: Any = None
        for y, u in zip(outs, cotangents):
            if isinstance(y, TensorBase) and y.tape is lst:
                term = (y * u).sum()
                total = term if total is None else total + term
        if not isinstance(total, TensorBase) or total.tape is not lst:
            return [be.full(x.shape, 0.0, x.dtype).index for x in xs]
        d = lst._backward_from(total.handle, be.full(total.shape, 1.0, total.dtype))
        return [cls._adjoint(be, d, t).index for t in xs]

    @staticmethod
    def _hvp(be: ProgramBackend, lst: Any, z: TensorBase, xs: list[Any],
             tangents: list[Any]) -> list[int]:
        from easyad import _higher
        seed = wrap(Tensor, be, be.full(z.shape, 1.0, z.dtype), z.shape, z.dtype)
        d = _higher.backward_graph(z.handle, seed)
        total: Any = None
        for x, v in zip(xs, tangents):
            g = d[x]
            term = (g * v).sum() if isinstance(g, TensorBase) else None
            if term is not None:
                total = term if total is None else total + term
        if not isinstance(total, TensorBase) or total.tape is None:
            return [be.full(x.shape, 0.0, x.dtype).index for x in xs]
        d2 = total.derivatives()
        out = []
        for x in xs:
            found = d2._node_adjoint(x._index)
            out.append(int((found if found is not None else be.full(x.shape, 0.0,
                                                                    x.dtype)).index))
        return out

"""``ad.record`` of tensor code: a ``TensorFunction``, recorded once and replayed at new
inputs with no tape, no Tensor objects and no Python per elementwise operation.

``f`` is called once, at ``x0`` (any structure of arrays: ``_trees``), on Tensors of a
``ProgramBackend`` (``tensor/_program.py``): every kernel it runs, and every kernel of the
backward sweep (and, for ``hvp``, of a second sweep over the first, recorded with
``create_graph``), becomes an instruction of one program. Replay runs the instructions
needed for what is asked (value; value and gradient; Hessian-vector product) on the
device's backend: on the numpy device, runs of elementwise, indexing and reduction
instructions are generated C (``compiler/program/fused_c.py``: one loop per fused group, all
the group's values in registers), the rest (matmul, ``linear``) numpy's kernels; on an
OpenCL device each such group is one generated kernel (``compiler/program/fused_cl.py``), the
rest the backend's kernels. ``fuse=False``: every instruction the backend's kernel.

Arguments after ``x0`` are not differentiated: float arrays are inputs of the program
(new values at each call; on an OpenCL device a Tensor already there, of the recorded
shape and dtype, goes in as it is, with no copy: a batch made once on the device; a
Tensor on another device is read and uploaded as a host array is); integer arrays,
numbers and other objects are *static*, part
of the recording: replay checks that they are the same (integer arrays by value, others
by ``==``) and raises ValueError otherwise (class labels that change per batch: pass them
one-hot, as floats).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad import _arrays, _trees
from easyad._core import WengertList
from easyad.errors import BranchChangedError
from easyad.tensor import Tensor, _devices
from easyad.tensor._base import FLOAT_DTYPES, Node, TensorBase, _no_vjp, wrap
from easyad.tensor._parameters import ParameterValues
from easyad.tensor._program import BoundProgram, Program, ProgramBackend, Slot, captured

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
                 arg_tree: Any, backend: Any, kind: str,
                 out_specs: list[tuple[tuple[int, ...], Any]] | None = None) -> None:
        hvp = kind == "hvp"
        self.program = program = Program()
        be = ProgramBackend(backend, program)
        lst = WengertList()
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
        with captured(be):
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


class TensorFunction:
    """A tensor function recorded once by ``ad.record``: its value, gradient and
    Hessian-vector products at new inputs of the recorded shapes, replayed from the
    recorded program (see the module docstring).

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> F = ad.record(lambda x, w: ad.sum(w * x ** 2), np.zeros(3), np.ones(3))
    >>> F(np.array([1.0, 2.0, 3.0]), np.ones(3))
    14.0
    >>> F.gradient(np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 2.0]))
    array([ 2.,  0., 12.])
    """

    def __init__(self, f: Any, x0: Any, args: tuple[Any, ...], *,
                 on_branch_change: str = "raise", device: Any = None,
                 fuse: bool = True) -> None:
        if on_branch_change not in ("raise", "retape"):
            raise ValueError("tensor code replays with on_branch_change 'raise' or 'retape' "
                             f"('mask' is for batches of scalar code), not {on_branch_change!r}")
        self.f, self.on_branch_change, self.fuse = f, on_branch_change, fuse
        self._backend = _devices.resolve(device)
        leaves, self._x_tree = _trees.flatten(x0)
        self._x_specs = [(a.shape, a.dtype) for a in (self._float(v, "x0") for v in leaves)]
        arg_leaves, self._arg_tree = _flatten_args(args)
        self._arg_kinds = [None if _float_leaf(v) else _Static(v) for v in arg_leaves]
        # (shape, dtype) of each float argument: the program's input slot reads that dtype
        self._arg_specs: list[Any] = []
        for kind, v in zip(self._arg_kinds, arg_leaves):
            a = self._float(v) if kind is None else None
            self._arg_specs.append(None if a is None else (a.shape, a.dtype))
        self._simple = self._x_tree.is_leaf and not arg_leaves
        self._flat_keys = self._x_tree.keys if self._x_tree.kind == "dict" and all(
            c.is_leaf for c in self._x_tree.children) else None
        self._fast = self._simple and self._backend.kind == "numpy"
        self._recordings: dict[str, _Recording] = {}
        self._bound: dict[str, BoundProgram] = {}
        self._learning_rate = np.zeros(())     # sgd_step's, an input of the program
        self._lr_on_device: tuple[bytes, Any] | None = None   # (lr, its device buffer)
        statics = [k if k is not None else self._float(v)
                   for k, v in zip(self._arg_kinds, arg_leaves)]
        self._record("gradient", [self._float(v, "x0") for v in leaves], statics)

    # -- inputs --
    @staticmethod
    def _float(v: Any, what: str = "an argument") -> np.ndarray:
        """A float leaf as tensors hold it: float32 stays float32 (in native byte order),
        other reals become float64 (``_arrays.real_array``: complex and the like raise)."""
        if isinstance(v, TensorBase):
            v = v.value
        a = np.asarray(v)
        # np.dtype(type): numpy's own dtype object (a newbyteorder copy is equal but not
        # identical, and the core's fast paths test dtypes by identity)
        native = np.dtype(a.dtype.type) if a.dtype.kind == "f" else a.dtype
        return _arrays.real_array(a, what, native if native in FLOAT_DTYPES else np.float64)

    def _inputs(self, x: Any, args: tuple[Any, ...]) -> tuple[list[np.ndarray], list[Any]]:
        if type(x) is np.ndarray and not args and self._simple:   # one array, no arguments
            shape, dtype = self._x_specs[0]
            if x.shape == shape and x.dtype == dtype:
                return [x], []
        found = self._plain_inputs(x, args)
        if found is not None:
            return found
        leaves, tree = _trees.flatten(x)
        if tree != self._x_tree:
            raise ValueError(f"recorded for {self._x_tree.describe()} as x, got "
                             f"{tree.describe()}")
        xs: list[Any] = []
        for v, (shape, dtype) in zip(leaves, self._x_specs):
            resident = self._resident(v, shape, dtype)
            if resident is not None:
                xs.append(resident)
                continue
            a = _arrays.real_array(v.value if isinstance(v, TensorBase) else v, "x", dtype)
            if a.shape != shape:
                raise ValueError(f"recorded for an input of shape {shape}, got {a.shape}; "
                                 f"record again for another shape")
            xs.append(a)
        arg_leaves, arg_tree = _flatten_args(args)
        if arg_tree != self._arg_tree:
            raise ValueError(f"recorded with {len(self._arg_tree)} arguments after x "
                             f"({', '.join(t.describe() for t in self._arg_tree)}), got "
                             f"{len(arg_tree)} ({', '.join(t.describe() for t in arg_tree)})")
        out: list[Any] = []
        for v, kind, spec in zip(arg_leaves, self._arg_kinds, self._arg_specs):
            if kind is not None:
                if not kind.same(v):
                    _float_leaf(v)      # complex, dates: the TypeError naming the dtype
                    raise ValueError(
                        "an argument that is not a float array (integers, a number, an "
                        "object) is part of the recording and changed; pass values that "
                        "change as float arrays (class labels one-hot), or record again")
                out.append(kind)
            else:
                shape, dtype = spec
                resident = self._resident_argument(v, shape, dtype)
                if resident is not None:
                    out.append(resident)
                    continue
                a = _arrays.real_array(v.value if isinstance(v, TensorBase) else v,
                                       "an argument after x", dtype)
                if a.shape != shape:
                    raise ValueError(f"recorded for an argument of shape {shape}, got "
                                     f"{a.shape}")
                out.append(a)
        return xs, out

    def _resident(self, v: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An x leaf whose values stay where they are: a model's Parameter (its host array
        on the numpy device, which sgd_step writes in place; its device buffer elsewhere,
        uploaded once) or a Tensor already on this Function's device. None: copy it."""
        values = getattr(v, "_values", None)
        if not isinstance(values, ParameterValues):
            values = None
            if not (isinstance(v, TensorBase) and v._backend is self._backend
                    and self._backend.kind != "numpy"):
                return None
        got = (values.shape, values.dtype) if values is not None else (v.shape, v.dtype)
        if got != (shape, dtype):
            raise ValueError(f"recorded for an input of shape {shape} and dtype {dtype}, got "
                             f"{got[0]} and {got[1]}; pass that shape and dtype "
                             f"(dtype={np.dtype(dtype).name}) or record again for another")
        if values is not None and self._backend.kind == "numpy":
            return values.writable()
        return _Resident(values.for_tensor(self._backend.device) if values is not None
                         else v._data, values, v)

    def _resident_argument(self, v: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """A float argument after x that is a Tensor on this Function's (OpenCL) device:
        its buffer goes into the program as it is (no read to the host and upload again).
        Its shape and dtype must be the recorded ones (ValueError: no silent cast, which
        would copy it each call). A Tensor on another device is read to the host and
        uploaded, as a host array is (None)."""
        if not (isinstance(v, TensorBase) and v._backend is self._backend
                and self._backend.kind != "numpy"):
            return None
        if (v.shape, v.dtype) != (shape, dtype):
            raise ValueError(
                f"recorded for an argument of shape {shape} and dtype {dtype}, got a device "
                f"Tensor of shape {v.shape} and dtype {v.dtype}; make it with "
                f"dtype={np.dtype(dtype).name} and that shape (or record again for another)")
        return _Resident(v._data, None, v)

    def _plain_inputs(self, x: Any, args: tuple[Any, ...]
                      ) -> tuple[list[np.ndarray], list[Any]] | None:
        """The common call of a training step, without walking structures: x an array or a
        flat dict of arrays or, on the numpy device, of a model's Parameters (the recorded
        keys, in order), every argument an array, all of the recorded shapes and dtypes.
        None: take the general path (which explains)."""
        keys = self._flat_keys
        if type(x) is dict and keys is not None and tuple(x) == keys:
            values = list(x.values())
        elif type(x) is np.ndarray and self._x_tree.is_leaf:
            values = [x]
        else:
            return None
        if len(args) != len(self._arg_tree) or any(
                type(a) is not np.ndarray or not t.is_leaf for a, t in zip(args, self._arg_tree)):
            return None
        on_host = self._backend.kind == "numpy"
        for i, (v, (shape, dtype)) in enumerate(zip(values, self._x_specs)):
            if type(v) is not np.ndarray:
                # a model's Parameter on the numpy device (sgd_step's usual x): its host
                # array, as _resident gives it, without the general path's walk
                held = getattr(v, "_values", None) if on_host else None
                if not isinstance(held, ParameterValues):
                    return None
                v = values[i] = held.writable()
            if v.shape != shape or v.dtype != dtype or not v.flags.aligned:
                return None
        out: list[Any] = []
        for a, kind, spec in zip(args, self._arg_kinds, self._arg_specs):
            if kind is not None:
                if not kind.same(a):
                    return None
                out.append(kind)
            elif (a.shape, a.dtype) != spec or not a.flags.aligned:
                return None     # (the general path converts it to the recorded dtype)
            else:
                out.append(a)
        return values, out

    # -- recording and binding --
    def _record(self, what: str, xs: list[np.ndarray], statics: list[Any]) -> _Recording:
        key = _recording_of(what)
        first = self._recordings.get("first")
        rec = _Recording(self.f, xs, self._x_tree, statics, self._arg_tree, self._backend,
                         key, first.out_specs if first is not None else None)
        self._recordings[key] = rec
        for k in [k for k in self._bound if _recording_of(k) == key]:
            del self._bound[k]
        return rec

    def _bind(self, what: str, xs: list[np.ndarray], args: list[Any]) -> Any:
        bound = self._bound.get(what)
        if bound is not None:
            return bound
        key = _recording_of(what)
        rec = self._recordings.get(key)
        if rec is None:
            rec = self._record(what, _on_host(xs), _on_host(args))
        if what == "value":
            outputs = rec.outputs
        elif what in ("gradient", "sgd_step"):
            if rec.gradient is None or rec.descended is None:
                raise ValueError(f"{what} needs f to return one number (a tensor of "
                                 "one element or a scalar); it returned "
                                 f"{rec.out_tree.describe()}")
            outputs = rec.outputs + (rec.gradient if what == "gradient" else rec.descended)
        elif what == "vjp":
            outputs = rec.vjp or []
        else:
            if rec.hvp is None:
                raise ValueError("hvp needs f to return one number")
            outputs = rec.hvp
        bound = None
        if self.fuse and self._backend.kind == "numpy":
            from easyad.compiler.program import fused_c
            bound = fused_c.fused(rec.program, outputs, self._backend, self._guard_failed)
        elif self.fuse and self._backend.kind == "opencl":
            from easyad.compiler.program import fused_cl
            bound = fused_cl.fused(rec.program, outputs, self._backend, self._guard_failed)
        if bound is None:
            bound = BoundProgram(rec.program, self._backend, outputs, self._guard_failed)
        self._bound[what] = bound
        return bound

    @staticmethod
    def _guard_failed(value: Any, recorded: Any) -> None:
        raise _Retape(value, recorded)

    def _run(self, what: str, x: Any, args: tuple[Any, ...], tangents: Sequence[Any] = (),
             xs_statics: Any = None) -> list[Any]:
        xs, statics = xs_statics or self._inputs(x, args)
        floats = [a for a in statics if not isinstance(a, _Static)]
        extra = list(tangents) if what in ("hvp", "vjp") else [self._learning_rate]
        for attempt in range(2):
            bound = self._bind(what, xs, statics)
            be = self._backend
            live = self._live(what)
            if be.kind == "numpy":
                inputs = [a.buffer if type(a) is _Resident else np.ascontiguousarray(a)
                          for a in xs + floats + extra + live]
            else:
                inputs = [a.buffer if type(a) is _Resident else be.asarray(a, a.dtype)
                          for a in xs + floats]
                inputs += ([be.asarray(a, a.dtype) for a in extra]
                           if what in ("hvp", "vjp") else [self._device_learning_rate()])
                inputs += [be.asarray(a, a.dtype) for a in live]
            try:
                return bound.run(inputs)
            except _Retape:
                if self.on_branch_change != "retape" or attempt:
                    raise BranchChangedError(
                        "a value f read while recorded (a branch on bool(t), float(t) or "
                        "t.value) comes out differently at this input; record again here "
                        "(ad.record(..., on_branch_change='retape') does it itself) or "
                        "use ad.where for elementwise choices") from None
                self._record(what, _on_host(xs), _on_host(statics))
        raise AssertionError("unreachable")   # pragma: no cover

    def _device_learning_rate(self) -> Any:
        """sgd_step's learning rate on the device: uploaded when it changes, not at every
        step (programs only read their inputs; a new buffer, as earlier steps may still
        be queued to read the old one)."""
        lr = self._learning_rate.tobytes()      # (-0.0 is not 0.0 here)
        kept = self._lr_on_device
        if kept is None or kept[0] != lr:
            kept = self._lr_on_device = (lr, self._backend.asarray(self._learning_rate,
                                                                   np.float64))
        return kept[1]

    def _live(self, what: str) -> list[np.ndarray]:
        """The current values of the module parameters f used (read at every call)."""
        rec = self._recordings[_recording_of(what)]
        out = []
        for _, read, shape, dtype in rec.program.live:
            a = np.asarray(read())
            if a.shape != shape or a.dtype != dtype:
                raise ValueError(f"a module parameter f uses changed from {shape} "
                                 f"{dtype} to {a.shape} {a.dtype} since it was recorded; "
                                 f"record again")
            out.append(a)
        return out

    def _host(self, buf: Any) -> np.ndarray:
        if type(buf) is np.ndarray:      # the numpy device: a new array already
            return buf
        return np.asarray(self._backend.to_numpy(buf))

    # -- batches: x with one more leading axis --
    def _batch_count(self, x: Any) -> int | None:
        """The number of points when every leaf of x has one more leading axis than
        recorded (a batch), else None."""
        if type(x) is np.ndarray and self._x_tree.is_leaf:
            shape = self._x_specs[0][0]
            return x.shape[0] if x.ndim == len(shape) + 1 and x.shape[1:] == shape else None
        leaves, tree = _trees.flatten(x)
        if tree != self._x_tree:
            return None
        counts = set()
        for v, (shape, _) in zip(leaves, self._x_specs):
            if isinstance(v, TensorBase) and self._device_rows(v) is None:
                return None
            got = tuple(v.shape) if self._device_rows(v) is not None else np.shape(v)
            if len(got) != len(shape) + 1 or tuple(got[1:]) != shape:
                return None
            counts.add(got[0])
        return counts.pop() if len(counts) == 1 else None

    def _device_rows(self, v: Any) -> Any:
        """The buffer of a batch leaf already on this Function's OpenCL device (a Tensor
        there, or a pyopencl array of its context), else None."""
        be = self._backend
        if be.kind != "opencl":
            return None
        data = v._data if isinstance(v, TensorBase) and v._backend is be else v
        return data if be.owns(data) else None

    def _batched(self, what: str, x: Any, args: tuple[Any, ...], count: int,
                 tangents: Sequence[Any] = (),
                 tangent_specs: Sequence[tuple[tuple[int, ...], Any]] | None = None
                 ) -> list[np.ndarray]:
        """``what`` at every point of the batch ``x``, outputs with a leading axis: one C
        loop without the GIL where the fused program allows it (no Python step in it), on
        an OpenCL device one launch per fused kernel (``compiler.program.batch_cl``: no
        backend step in it; x's leaves may be rows there already: Tensors or pyopencl
        arrays), else one replay per point. ``tangents`` (hvp: of x's shapes; vjp: of the
        outputs', ``tangent_specs``) may be batched too."""
        if count == 0:
            raise ValueError("a batch of no points: x's leading axis is 0")
        leaves, _ = _trees.flatten(x)
        X = [self._device_rows(v) for v in leaves]      # rows already on this device
        X = [_arrays.real_array(v, "x", dt) if a is None else a
             for a, v, (_, dt) in zip(X, leaves, self._x_specs)]
        on_device = [type(a) is not np.ndarray for a in X]
        for a, (_, dt) in zip(X, self._x_specs):
            if type(a) is not np.ndarray and a.dtype != dt:
                raise ValueError(f"recorded for x of dtype {dt}, got device rows of "
                                 f"{a.dtype}; record again for another")
        point = _trees.unflatten(self._x_tree, [a[:1].get()[0] if device else a[0]
                                                for a, device in zip(X, on_device)])
        xs, statics = self._inputs(point, args)
        floats = [a for a in statics if not isinstance(a, _Static)]
        extra = list(tangents) if what in ("hvp", "vjp") else [self._learning_rate]
        from easyad.compiler.program.fused_c import FusedProgram
        bound = self._bind(what, xs, statics)
        if isinstance(bound, FusedProgram) and bound.batchable():
            return bound.run_batch(X + floats + extra + self._live(what), count)
        if self._backend.kind == "opencl":     # one launch per kernel for all the points
            from easyad.compiler.program import batch_cl
            program = batch_cl.batched(bound)
            try:
                if program is not None:       # (device arguments go in as they are)
                    shared = [a.buffer if type(a) is _Resident else a for a in floats]
                    return program.run(X + shared + extra + self._live(what), count)
            except batch_cl.Diverged:
                pass       # a guard reads another value somewhere: point by point
        X = [self._host(a) if device else a for a, device in zip(X, on_device)]
        outs = []
        for b in range(count):
            point = _trees.unflatten(self._x_tree, [a[b] for a in X])
            ts = [t[b] if np.ndim(t) > len(s) else t
                  for t, (s, _) in zip(tangents, tangent_specs or self._x_specs)]
            outs.append([self._host(o) for o in self._run(what, point, args, ts)])
        return [np.stack([o[k] for o in outs]) for k in range(len(outs[0]))]

    # -- what it computes --
    def __call__(self, x: Any, *args: Any) -> Any:
        """f at ``x`` (the recorded structure and shapes), in f's output structure; at
        every point of a batch (each leaf of x with one more leading axis), the outputs
        with that axis."""
        count = self._batch_count(x)
        if count is not None:
            rec = self._recordings["first"]
            values = self._batched("value", x, args, count)
            if rec.scalar_output:
                return values[0].reshape(count)
            return _trees.unflatten(rec.out_tree, values)
        out = self._run("value", x, args)
        rec = self._recordings["first"]
        values = [self._host(v) for v in out]
        if rec.scalar_output:
            return float(values[0].reshape(()))
        return _trees.unflatten(rec.out_tree, values)

    def value_and_gradient(self, x: Any, *args: Any) -> tuple[Any, Any]:
        """(f(x), its gradient in x's structure) for f returning one number; for a batch
        of points (each leaf of x with one more leading axis), the values as an array and
        the gradients with that axis, in one C loop where the program allows."""
        bound = self._bound.get("gradient")
        if bound is not None and self._fast and type(x) is np.ndarray and not args \
                and not self._recordings["first"].program.live \
                and x.shape == self._x_specs[0][0] and x.dtype == self._x_specs[0][1]:
            try:        # one array in, numpy device, bound already: straight to the program
                value, g = bound.run((x, self._learning_rate))
                return value.item(), g.reshape(x.shape)
            except _Retape:
                pass    # the general path raises or records again
        count = self._batch_count(x)
        if count is not None:
            out = self._batched("gradient", x, args, count)
            return out[0].reshape(count), _trees.unflatten(
                self._x_tree, [g.reshape((count,) + s) for g, (s, _)
                               in zip(out[1:], self._x_specs)])
        out = self._run("gradient", x, args)
        value = float(self._host(out[0]).reshape(()))
        grads = [self._host(g).reshape(s) for g, (s, _) in zip(out[1:], self._x_specs)]
        return value, _trees.unflatten(self._x_tree, grads)

    def sgd_step(self, x: Any, *args: Any, lr: float, lazy: bool = False) -> Any:
        """One step of gradient descent on ``x``, in place: ``x -= lr * gradient`` (as
        ``optim.SGD`` without momentum or weight decay), inside the replayed program;
        returns f at ``x`` before the step. ``x``'s leaves (an array, or a dict or list of
        them) are a model's Parameters or writable, C-contiguous numpy arrays of the
        recorded dtypes (a parameter's ``.data``). On the numpy device the update is
        written straight into them by the generated C, with no gradient arrays made; on
        another device, Parameters stay there (uploaded once; the new values are the
        program's output buffers), so a step moves only the batch and the loss (nothing
        with the batch already there as device Tensors).

        ``lazy=True`` returns the loss as a 0-d Tensor on the Function's device instead of
        a float: it is read only when used (``float(loss)``, ``loss.value``), so on an
        OpenCL device steps queue one after another without waiting for the device."""
        if not isinstance(lazy, bool):
            raise TypeError(f"sgd_step's lazy is True or False, not {lazy!r}")
        if isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating)) \
                or not np.isfinite(lr):
            raise ValueError(f"sgd_step needs lr, a finite number; got {lr!r}")
        xs, statics = self._inputs(x, args)
        flat = type(x) is dict and tuple(x) == self._flat_keys
        for given, used in zip(x.values() if flat else _trees.flatten(x)[0], xs):
            if type(used) is _Resident:
                if used.values is None:
                    raise ValueError(
                        "sgd_step updates x in place, and a Tensor does not change; pass "
                        "the model's Parameters (they stay on the device) or host arrays")
                continue
            if isinstance(getattr(given, "_values", None), ParameterValues):
                given = used             # a Parameter on the numpy device: its host array
            if given is not used or not used.flags.writeable or not used.flags.c_contiguous:
                raise ValueError(
                    "sgd_step updates x's arrays in place: each must be a writable, "
                    "C-contiguous numpy array of the recorded dtype (got "
                    f"{type(given).__name__}"
                    f"{' ' + str(given.dtype) if hasattr(given, 'dtype') else ''}); use "
                    "value_and_gradient and an optimizer for other inputs")
        self._learning_rate[()] = lr
        out = self._run("sgd_step", x, args, xs_statics=(xs, statics))
        for leaf, new in zip(xs, out[1:]):
            if type(leaf) is _Resident:             # a Parameter's new values: kept there
                leaf.values.adopt(self._backend.reshape(new, leaf.values.shape),
                                  self._backend)
                continue
            new = self._host(new)
            if not np.may_share_memory(leaf, new):    # not written in place: copied
                np.copyto(leaf, new.reshape(leaf.shape))
        if lazy:      # (a Tensor of the program's output buffer, new at each call)
            loss = self._backend.reshape(out[0], ())
            return wrap(Tensor, self._backend, loss, (), loss.dtype)
        return float(self._host(out[0]).reshape(()))

    def gradient(self, x: Any, *args: Any) -> Any:
        """The gradient of f (one number) at ``x``, in x's structure."""
        return self.value_and_gradient(x, *args)[1]

    def hvp(self, x: Any, v: Any, *args: Any) -> Any:
        """The Hessian of f (one number) at ``x`` times ``v`` (x's structure)."""
        vs, tree = _trees.flatten(v)
        if tree != self._x_tree:
            raise ValueError(f"v must have x's structure ({self._x_tree.describe()})")
        count = self._batch_count(x)
        if count is not None:       # v: one direction for all points, or one per point
            tangents = [_arrays.real_array(t, "v", dt) for t, (_, dt) in zip(vs, self._x_specs)]
            for t, (s, _) in zip(tangents, self._x_specs):
                if t.shape not in (s, (count,) + s):
                    raise ValueError(f"v's leaf must have shape {s} or {(count,) + s}, got "
                                     f"{t.shape}")
            out = self._batched("hvp", x, args, count, tangents)
            return _trees.unflatten(self._x_tree, [g.reshape((count,) + s) for g, (s, _)
                                                   in zip(out, self._x_specs)])
        tangents = [_arrays.real_array(t, "v", dt) for t, (_, dt) in zip(vs, self._x_specs)]
        for t, (s, _) in zip(tangents, self._x_specs):
            if t.size != int(np.prod(s, dtype=int)):
                raise ValueError(f"v's leaf must have shape {s}, got {t.shape}")
        tangents = [t.reshape(s) for t, (s, _) in zip(tangents, self._x_specs)]
        out = self._run("hvp", x, args, tangents)
        return _trees.unflatten(self._x_tree, [self._host(g).reshape(s) for g, (s, _)
                                               in zip(out, self._x_specs)])

    def hessian(self, x: Any, *args: Any) -> Any:
        """The Hessian of f (one number) at ``x``, dense: the HVP program with each unit
        direction, as one batch (one C loop where the program allows, else a replay per
        element of x: for x of modest size; ``hvp`` for products with a direction).
        Shape ``x.shape + x.shape`` for one array; ``H[a][b]`` of shape ``a.shape +
        b.shape`` for a structure of arrays, as ``ad.hessian``."""
        columns = self._unit_batch("hvp", x, args, self._x_specs)
        rows = []
        for a, (shape_a, _) in enumerate(self._x_specs):
            blocks = [np.moveaxis(c, 0, -1).reshape(shape_a + shape_b)
                      for c, (shape_b, _) in zip(self._split(columns[a]), self._x_specs)]
            rows.append(_trees.unflatten(self._x_tree, blocks))
        return _trees.unflatten(self._x_tree, rows)

    def _unit_batch(self, what: str, x: Any, args: tuple[Any, ...],
                    specs: list[tuple[tuple[int, ...], Any]]) -> list[np.ndarray]:
        """``what`` ("hvp", "vjp") at x with every unit vector of ``specs`` (x's leaves
        for hvp, the outputs' for vjp) as the direction: one batch of as many points as
        those have elements; results (points,) + each x leaf's shape."""
        xs, _ = self._inputs(x, args)
        sizes = [int(np.prod(s, dtype=int)) for s, _ in specs]
        total = sum(sizes)
        if total == 0:
            return [np.zeros((0,) + s, dtype=dt) for s, dt in self._x_specs]
        hosts = _on_host(xs)
        X = _trees.unflatten(self._x_tree, [np.broadcast_to(a, (total,) + a.shape)
                                            for a in hosts])
        units, start = [], 0
        for (shape, dtype), size in zip(specs, sizes):
            u = np.zeros((total, size), dtype=dtype)
            u[np.arange(start, start + size), np.arange(size)] = 1.0
            units.append(u.reshape((total,) + shape))
            start += size
        out = self._batched(what, X, args, total, units, specs)
        return [o.reshape((total,) + s) for o, (s, _) in zip(out, self._x_specs)]

    def _split(self, rows: np.ndarray) -> list[np.ndarray]:
        """A batch over every element of x, split into the points of each leaf."""
        out, start = [], 0
        for shape, _ in self._x_specs:
            size = int(np.prod(shape, dtype=int))
            out.append(rows[start:start + size])
            start += size
        return out

    def vjp(self, x: Any, u: Any, *args: Any) -> Any:
        """The vector-Jacobian product u^T J of f at ``x`` (x's structure), ``u`` in the
        structure and shapes of f's output: one replay of the VJP program (recorded on
        first use: the backward sweep of sum(u * f(x)) with u as an input)."""
        specs = self._recordings["first"].out_specs
        us, tree = _trees.flatten(u)
        if tree != self._recordings["first"].out_tree:
            raise ValueError("u must have the structure of f's output "
                             f"({self._recordings['first'].out_tree.describe()})")
        cotangents = []
        for v, (shape, dtype) in zip(us, specs):
            a = _arrays.real_array(v, "u", dtype)
            if a.shape != shape:
                raise ValueError(f"u's leaf must have the shape of f's output, {shape}, got "
                                 f"{a.shape}")
            cotangents.append(a)
        out = self._run("vjp", x, args, cotangents)
        return _trees.unflatten(self._x_tree, [self._host(g).reshape(s) for g, (s, _)
                                               in zip(out, self._x_specs)])

    def jacobian(self, x: Any, *args: Any) -> Any:
        """The Jacobian of f at ``x``: one VJP replay per element of f's output, laid out
        as ``ad.jacobian``'s (``out.shape + in.shape`` for one array in and out; the
        output's structure of x's structure of such blocks)."""
        first = self._recordings["first"]
        specs = first.out_specs
        rows = self._unit_batch("vjp", x, args, specs)    # per x leaf: (m,) + its shape
        per_output, start = [], 0
        for shape, _ in specs:
            size = int(np.prod(shape, dtype=int))
            blocks = []
            for r, (in_shape, _) in zip(rows, self._x_specs):
                block = r[start:start + size].reshape(shape + in_shape)
                blocks.append(float(block) if block.ndim == 0 else block)
            start += size
            per_output.append(_trees.unflatten(self._x_tree, blocks))
        return _trees.unflatten(first.out_tree, per_output)

    @property
    def program(self) -> Program:
        """The recorded program (value and gradient): its instructions, for inspection."""
        return self._recordings["first"].program

    def __reduce__(self) -> Any:
        raise TypeError("a TensorFunction does not pickle: it holds compiled code, and the "
                        "module parameters and host functions f used; record f again in the "
                        "other process (ad.record is fast, and its C is cached on disk)")

    def __repr__(self) -> str:
        rec = self._recordings["first"]
        return (f"<TensorFunction of {self._x_tree.describe()}: "
                f"{len(rec.program.instructions)} instructions, {rec.guards} guards>")


class _Retape(Exception):
    def __init__(self, value: Any, recorded: Any) -> None:
        super().__init__("guard")
        self.value, self.recorded = value, recorded


def record_tensor(f: Any, x0: Any, *args: Any, on_branch_change: str = "raise",
                  device: Any = None, fuse: bool = True) -> TensorFunction:
    """See ``ad.record``."""
    return TensorFunction(f, x0, args, on_branch_change=on_branch_change, device=device,
                          fuse=fuse)


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

This module holds the class's calls (value, gradient, sgd_step, hvp, hessian, vjp,
jacobian), its recording and binding; what it records is ``recorded/tensor_recording.py``,
how it takes a call's inputs ``recorded/tensor_inputs.py`` and its batches
``recorded/tensor_batches.py`` (mixins of the class).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from easyad import _arrays, _trees, distributed
from easyad.distributed import is_dask_array
from easyad.errors import BranchChangedError
from easyad.recorded import tensor_pickle
from easyad.recorded.tensor_sparse import TensorSparse
from easyad.recorded.tensor_recording import (_flatten_args, _float_leaf, _on_host,
                                              _Recording, _recording_of, _Resident, _Static)
from easyad.tensor import Tensor, _devices
from easyad.tensor._base import wrap
from easyad.tensor._parameters import ParameterValues
from easyad.tensor._program import BoundProgram, Program

if TYPE_CHECKING:
    from easyad.tensor._numpy import NumpyBackend
    from easyad.tensor._opencl import OpenCLBackend


class TensorFunction(TensorSparse):
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


    # -- recording and binding --
    def _record(self, what: str, xs: list[np.ndarray], statics: list[Any]) -> _Recording:
        key = _recording_of(what)
        if self.f is None:
            raise ValueError(f"{what} needs a recording this TensorFunction does not have, "
                             "and it has no f to make it (it was unpickled: f stays behind); "
                             f"call {what} once before pickling it, or record f again here")
        first = self._recordings.get("first")
        rec = _Recording(self.f, xs, self._x_tree, statics, self._arg_tree, self._backend,
                         key, first.out_specs if first is not None else None)
        self._recordings[key] = rec
        self._sgd_ready = None        # it runs a bound program of the old recording
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
        outputs = list(outputs) + rec.program.effect_slots    # hidden: see _effects
        bound = None
        if self.fuse and self._backend.kind == "numpy":
            from easyad.compiler.program import fused_c
            bound = fused_c.fused(rec.program, outputs, cast("NumpyBackend", self._backend),
                                  self._guard_failed)
        elif self.fuse and self._backend.kind == "opencl":
            from easyad.compiler.program import fused_cl
            bound = fused_cl.fused(rec.program, outputs, cast("OpenCLBackend", self._backend),
                                   self._guard_failed)
        if bound is None:
            # unfused: the same optimiser as the fused paths (folds, CSE, identities, DCE)
            from easyad.compiler.optimiser import optimise_program
            program, outputs = optimise_program(rec.program, outputs)
            bound = BoundProgram(program, self._backend, outputs, self._guard_failed)
        self._bound[what] = bound
        return bound

    @staticmethod
    def _guard_failed(value: Any, recorded: Any) -> None:
        raise _Retape(value, recorded)

    def _run(self, what: str, x: Any, args: tuple[Any, ...], tangents: Sequence[Any] = (),
             xs_statics: Any = None, effects: bool = True) -> list[Any]:
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
                out = bound.run(inputs)
                return self._effects(what, out) if effects else list(out)
            except _Retape:
                if self.on_branch_change != "retape" or attempt:
                    raise BranchChangedError(
                        "a value f read while recorded (a branch on bool(t), float(t) or "
                        "t.value) comes out differently at this input; record again here "
                        "(ad.record(..., on_branch_change='retape') does it itself) or "
                        "use ad.where for elementwise choices") from None
                self._record(what, _on_host(xs), _on_host(statics))
        raise AssertionError("unreachable")   # pragma: no cover

    def _effects(self, what: str, out: Sequence[Any], row: int | None = None) -> list[Any]:
        """The outputs of one replay less the hidden ones, after applying the recording's
        host effects (BatchNorm's running statistics) with them: at every replay, as eager
        code would at every call. ``row``: the outputs are a batch of one point's runs
        (hessian's directions): the effect applies once, with that row."""
        effects = self._recordings[_recording_of(what)].program.effects
        if not effects:
            return list(out)
        k = sum(len(slots) for _, slots in effects)
        hidden, out = out[len(out) - k:], list(out[:len(out) - k])
        start = 0
        for apply, slots in effects:
            values = [self._host(v) for v in hidden[start:start + len(slots)]]
            apply(*(v if row is None else v[row] for v in values))
            start += len(slots)
        return out

    def _refuse_effects(self, how: str) -> None:
        if self._recordings["first"].program.effects:
            raise ValueError(
                f"{how}: f updates running statistics (BatchNorm in training mode) at "
                "every replay, and a batch of points has no one batch whose statistics "
                "to take; call it once per point (F(x), F.value_and_gradient, "
                "F.sgd_step), or record after model.eval()")

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


    # -- what it computes --
    def __call__(self, x: Any, *args: Any) -> Any:
        """f at ``x`` (the recorded structure and shapes), in f's output structure; at
        every point of a batch (each leaf of x with one more leading axis), the outputs
        with that axis (lazy dask arrays for a dask array x: ``easyad.distributed``)."""
        bound = self._bound.get("value")
        if bound is not None and self._fast and type(x) is np.ndarray and not args \
                and x.shape == self._x_specs[0][0] and x.dtype == self._x_specs[0][1]:
            rec = self._recordings["first"]
            if not rec.program.live:
                try:    # one array in, numpy device, bound already: straight to the program
                    values = bound.run((x, self._learning_rate))
                except _Retape:
                    values = None       # the general path raises or records again
                if values is not None:
                    if rec.scalar_output:
                        return float(values[0].reshape(()))
                    return _trees.unflatten(rec.out_tree, [v.reshape(s) for v, (s, _)
                                                           in zip(values, rec.out_specs)])
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            return distributed.tensor_batch(self, "__call__", x, None, args)
        count = self._batch_count(x)
        if count is not None:
            rec = self._recordings["first"]
            values = self._batched("value", x, args, count)
            if rec.scalar_output:
                return values[0].reshape(count)
            return _trees.unflatten(rec.out_tree, [v.reshape((count,) + s) for v, (s, _)
                                                   in zip(values, rec.out_specs)])
        out = self._run("value", x, args)
        rec = self._recordings["first"]
        values = [self._host(v) for v in out]
        if rec.scalar_output:
            return float(values[0].reshape(()))
        # each leaf of the recorded shape (a 0-d leaf comes back from a program as (1,))
        return _trees.unflatten(rec.out_tree, [v.reshape(s) for v, (s, _)
                                               in zip(values, rec.out_specs)])

    def value_and_gradient(self, x: Any, *args: Any) -> tuple[Any, Any]:
        """(f(x), its gradient in x's structure) for f returning one number; for a batch
        of points (each leaf of x with one more leading axis), the values as an array and
        the gradients with that axis, in one C loop where the program allows (lazy dask
        arrays for a dask array x of points: ``easyad.distributed``)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            return distributed.tensor_batch(self, "value_and_gradient", x, None, args)
        bound = self._bound.get("gradient")
        if bound is not None and self._fast and type(x) is np.ndarray and not args \
                and not self._recordings["first"].program.live \
                and not self._recordings["first"].program.effects \
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
        ready = self._sgd_ready
        if ready is not None and lazy is False and type(lr) is float and lr - lr == 0.0:
            loss = ready(x, args, lr)         # the call prepared by the last general one
            if loss is not None:
                return loss
            self._sgd_ready, self._sgd_misses = None, self._sgd_misses + 1
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
            if new.base is not leaf and not np.may_share_memory(leaf, new):   # not in place
                np.copyto(leaf, new.reshape(leaf.shape))
        if lazy:      # (a Tensor of the program's output buffer, new at each call)
            loss = self._backend.reshape(out[0], ())
            return wrap(Tensor, self._backend, loss, (), loss.dtype)
        if self._sgd_misses < 4:    # (x a new dict at each step: not worth preparing)
            self._sgd_ready = self._prepare_sgd(x, xs, statics)
        return float(self._host(out[0]).reshape(()))

    _sgd_ready: Any = None      # class defaults: an unpickled Function has neither yet
    _sgd_misses = 0

    def _prepare_sgd(self, x: Any, xs: list[Any], statics: list[Any]) -> Any:
        """The next steps with the same x as this one (the same dict of the same
        Parameters or arrays), as a training loop calls: a function of (x, args, lr)
        that checks only what can change between such calls (x's entries and their host
        arrays by identity, the arrays still writable, the arguments' shapes, dtypes and
        static values) and runs the bound program, or returns None for the general path
        (which explains any refusal). None where the step is not that simple: another
        device, an x that is not a flat dict, module parameters read at each call,
        effects, guards, or parameters not updated in place by the generated C."""
        from easyad.compiler.program.fused_c import FusedProgram
        bound = self._bound.get("sgd_step")
        rec = self._recordings[_recording_of("sgd_step")]
        if type(bound) is not FusedProgram or self._flat_keys is None or type(x) is not dict \
                or rec.program.live or rec.program.effects or rec.guards \
                or not rec.scalar_output or any(type(a) is not np.ndarray for a in xs) \
                or set(bound.in_place.values()) != set(bound.inputs[:len(xs)]):
            return None
        keys, leaves, arrays = tuple(x), tuple(x.values()), tuple(xs)
        holders = tuple(None if type(v) is np.ndarray else getattr(v, "_values", None)
                        for v in leaves)
        # each leaf is the very array the C writes into: the array given, or the host
        # array of a Parameter on the numpy device (never a converted copy)
        if not all(a is v if h is None else isinstance(h, ParameterValues)
                   for v, h, a in zip(leaves, holders, arrays)):
            return None
        kinds, specs = tuple(self._arg_kinds), tuple(self._arg_specs)
        lr_array, run = self._learning_rate, bound.run

        def step(given: Any, args: tuple[Any, ...], lr: float) -> float | None:
            if given is not x or tuple(x) != keys or len(args) != len(kinds):
                return None
            for v, want, held, a in zip(x.values(), leaves, holders, arrays):
                if v is not want or (held is not None and held.writable() is not a) \
                        or not a.flags.writeable:
                    return None
            floats = []
            for a, kind, spec in zip(args, kinds, specs):
                if kind is not None:
                    if not kind.same(a):
                        return None
                elif type(a) is not np.ndarray or (a.shape, a.dtype) != spec \
                        or not a.flags.aligned:
                    return None
                else:
                    floats.append(a)
            lr_array[()] = lr
            return float(run([*arrays, *floats, lr_array])[0].reshape(()))
        return step

    def gradient(self, x: Any, *args: Any) -> Any:
        """The gradient of f (one number) at ``x``, in x's structure."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            return distributed.tensor_batch(self, "gradient", x, None, args)
        return self.value_and_gradient(x, *args)[1]

    def hvp(self, x: Any, v: Any, *args: Any) -> Any:
        """The Hessian of f (one number) at ``x`` times ``v`` (x's structure)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            return distributed.tensor_batch(self, "hvp", x, v, args)
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

    def hessian(self, x: Any, *args: Any, sparse: bool = False,
                format: str | None = None) -> Any:
        """The Hessian of f (one number) at ``x``, dense: the HVP program with each unit
        direction, as one batch (one C loop where the program allows, else a replay per
        element of x: for x of modest size; ``hvp`` for products with a direction).
        Shape ``x.shape + x.shape`` for one array; ``H[a][b]`` of shape ``a.shape +
        b.shape`` for a structure of arrays, as ``ad.hessian``. ``sparse=True``: the
        structurally non-zero entries in x flattened (``hessian_pattern()``), one HVP per
        star colour, as ``format`` says ("csr" by default; docs/sparse.md). A batch of
        points (x one array with one more leading axis): the Hessians with that axis, all
        the points' unit directions as one batch (a dask array x: lazy,
        ``easyad.distributed``)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            if sparse or format is not None:
                raise ValueError("sparse= and format= are for numpy inputs, not a dask array")
            return distributed.tensor_batch(self, "hessian", x, None, args)
        if sparse:
            return self._sparse_hessian(x, args, format)
        if format is not None:
            raise ValueError("format= is for sparse results: pass sparse=True too")
        count = self._batch_count(x) if self._x_tree.is_leaf else None
        if count is not None:
            return self._batch_hessian(x, args, count)
        columns = self._unit_batch("hvp", x, args, self._x_specs)
        rows = []
        for a, (shape_a, _) in enumerate(self._x_specs):
            blocks = [np.moveaxis(c, 0, -1).reshape(shape_a + shape_b)
                      for c, (shape_b, _) in zip(self._split(columns[a]), self._x_specs)]
            rows.append(_trees.unflatten(self._x_tree, blocks))
        return _trees.unflatten(self._x_tree, rows)


    def vjp(self, x: Any, u: Any, *args: Any) -> Any:
        """The vector-Jacobian product u^T J of f at ``x`` (x's structure), ``u`` in the
        structure and shapes of f's output: one replay of the VJP program (recorded on
        first use: the backward sweep of sum(u * f(x)) with u as an input)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            raise NotImplementedError(
                "vjp does not take a dask array x yet (gradient, value_and_gradient, hvp, "
                "hessian and calls do); map it over numpy blocks: dask.array.map_blocks("
                "lambda b: np.stack([F.vjp(p, ...) for p in b]), X, ...)")
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

    def jacobian(self, x: Any, *args: Any, sparse: bool = False,
                 format: str | None = None) -> Any:
        """The Jacobian of f at ``x``: one VJP replay per element of f's output, laid out
        as ``ad.jacobian``'s (``out.shape + in.shape`` for one array in and out; the
        output's structure of x's structure of such blocks). ``sparse=True``: the
        structurally non-zero entries of the flattened output in the flattened x
        (``jacobian_pattern()``), one VJP per row colour, as one batch, as ``format``
        says ("csr" by default; docs/sparse.md)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            raise NotImplementedError(
                "jacobian does not take a dask array x yet (gradient, value_and_gradient, hvp, "
                "hessian and calls do); map it over numpy blocks: dask.array.map_blocks("
                "lambda b: np.stack([F.jacobian(p, ...) for p in b]), X, ...)")
        if sparse:
            return self._sparse_jacobian(x, args, format)
        if format is not None:
            raise ValueError("format= is for sparse results: pass sparse=True too")
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
        # as its program (recorded/tensor_pickle.py), checked on arrival; f stays behind
        return (_rebuild_tensor_function, tensor_pickle.state(self))

    def __repr__(self) -> str:
        rec = self._recordings["first"]
        return (f"<TensorFunction of {self._x_tree.describe()}: "
                f"{len(rec.program.instructions)} instructions, {rec.guards} guards>")


def _rebuild_tensor_function(*data: Any) -> TensorFunction:
    """A TensorFunction from its pickle (``tensor_pickle.rebuild``: every field checked)."""
    return tensor_pickle.rebuild(TensorFunction, *data)  # type: ignore[no-any-return]


class _Retape(Exception):
    def __init__(self, value: Any, recorded: Any) -> None:
        super().__init__("guard")
        self.value, self.recorded = value, recorded


def record_tensor(f: Any, x0: Any, *args: Any, on_branch_change: str = "raise",
                  device: Any = None, fuse: bool = True) -> TensorFunction:
    """See ``ad.record``."""
    return TensorFunction(f, x0, args, on_branch_change=on_branch_change, device=device,
                          fuse=fuse)


"""A ``TensorFunction`` over a batch of points (each leaf of x with one more leading
axis): one C loop without the GIL on the numpy device (``compiler/program/fused_c.py``;
with matmul steps, ``batch_np.py``: a C loop per run of C steps, a product per matmul),
one launch per fused kernel on OpenCL (``compiler/program/batch_cl.py``), else one replay
per point; and the batches of unit directions behind ``hessian`` and ``jacobian``. A
mixin of ``TensorFunction`` (``easyad/_recorded.py``): batching is a transform of the
replay, apart from a single call.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from easyad import _arrays, _trees
from easyad.recorded.tensor_inputs import TensorInputs
from easyad.recorded.tensor_recording import _on_host, _Resident, _Static
from easyad.tensor._base import TensorBase

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend


class TensorBatches(TensorInputs):
    """Batches of ``TensorFunction`` (see the module docstring)."""

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
        return data if cast("OpenCLBackend", be).owns(data) else None

    def _batched(self, what: str, x: Any, args: tuple[Any, ...], count: int,
                 tangents: Sequence[Any] = (),
                 tangent_specs: Sequence[tuple[tuple[int, ...], Any]] | None = None,
                 one_point: bool = False) -> list[np.ndarray]:
        """``what`` at every point of the batch ``x``, outputs with a leading axis: one C
        loop without the GIL where the fused program allows it (no Python step in it),
        else on the numpy device each C run over all points and each matmul/linear/
        reduce step one product for the batch (``compiler.program.batch_np``), on
        an OpenCL device one launch per fused kernel (``compiler.program.batch_cl``: no
        backend step in it; x's leaves may be rows there already: Tensors or pyopencl
        arrays), else one replay per point. ``tangents`` (hvp: of x's shapes; vjp: of the
        outputs', ``tangent_specs``) may be batched too. ``one_point``: every row is the
        same x (hessian's and jacobian's directions), so a recording's host effects
        (BatchNorm's running statistics) apply once, with the first row's values; other
        batches with effects are refused (which point's statistics?)."""
        if count == 0:
            raise ValueError("a batch of no points: x's leading axis is 0")
        # (the refusal's message is made only where there are effects to refuse)
        if not one_point and self._recordings["first"].program.effects:
            self._refuse_effects(f"{'a call' if what == 'value' else what} over a batch "
                                 f"of {count} points")
        return self._effects(what, self._batch_outputs(what, x, args, count, tangents,
                                                       tangent_specs), row=0)

    def _batch_outputs(self, what: str, x: Any, args: tuple[Any, ...], count: int,
                       tangents: Sequence[Any],
                       tangent_specs: Sequence[tuple[tuple[int, ...], Any]] | None
                       ) -> list[np.ndarray]:
        """``_batched``'s outputs, the hidden ones (host effects) included."""
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
        if isinstance(bound, FusedProgram):
            if bound.batchable():
                return bound.run_batch(X + floats + extra + self._live(what), count)
            from easyad.compiler.program import batch_np      # C runs and BLAS steps
            program = batch_np.batched(bound)
            try:
                if program is not None:
                    return program.run(X + floats + extra + self._live(what), count)
            except batch_np.Diverged:
                pass       # a guard reads another value somewhere: point by point
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
            outs.append([self._host(o) for o in self._run(what, point, args, ts,
                                                          effects=False)])
        return [np.stack([o[k] for o in outs]) for k in range(len(outs[0]))]

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
        out = self._batched(what, X, args, total, units, specs, one_point=True)
        return [o.reshape((total,) + s) for o, (s, _) in zip(out, self._x_specs)]

    def _batch_hessian(self, x: Any, args: tuple[Any, ...], count: int) -> np.ndarray:
        """The Hessians (count, *s, *s) at a batch of points of one array x of shape s:
        every point with every unit direction, one batch of count * size points (row j of
        point b's block: H_b e_j, the same numbers as ``hessian`` at that point alone)."""
        (shape, dtype), = self._x_specs
        rows = self._device_rows(x)
        X = self._host(rows) if rows is not None else _arrays.real_array(x, "x", dtype)
        size = int(np.prod(shape, dtype=int))
        if count == 0 or size == 0:
            return np.zeros((count,) + shape + shape, dtype=dtype)
        units = np.eye(size, dtype=dtype).reshape((size,) + shape)
        out = self._batched("hvp", np.repeat(X, size, axis=0), args, count * size,
                            [np.tile(units, (count,) + (1,) * len(shape))])
        columns = out[0].reshape((count, size) + shape)
        return np.moveaxis(columns, 1, -1).reshape((count,) + shape + shape)

    def _split(self, rows: np.ndarray) -> list[np.ndarray]:
        """A batch over every element of x, split into the points of each leaf."""
        out, start = [], 0
        for shape, _ in self._x_specs:
            size = int(np.prod(shape, dtype=int))
            out.append(rows[start:start + size])
            start += size
        return out

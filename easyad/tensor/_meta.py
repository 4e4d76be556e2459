"""The meta backend: tensors that have a shape and a dtype but no values.

``eval_shape`` runs a function on such tensors: every operation still asks ``_shapes`` for
its output shape (so a mismatch raises the same ShapeError a real evaluation raises), but
no buffer is allocated and no kernel runs. While ``eval_shape`` runs (its frame,
``_interpreters.interpreting(META)``), every tensor made from data (constants, module
parameters) is made on this backend too, and operations of the meta backend take tensors
of any device by their shapes.

``ShapeDtype`` (a shape and a dtype, public as ``ad.ShapeDtype``) is what ``eval_shape``
returns for each output and accepts in place of an input.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import _core
from easyad.tensor._backend import Backend
from easyad.tensor._composed import ComposedKernels
from easyad.tensor._interpreters import Interpreter


class MetaArray:
    """A placeholder buffer: only a shape and a dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class _MetaDevice:
    name = kind = "meta"
    description = "shapes only (eval_shape)"

    def __str__(self) -> str:
        return "meta"


class Shapes(Interpreter):
    """eval_shape's interpreter: every operation runs on shapes alone (``MetaBackend``)."""

    name = "eval_shape"
    has_values = False
    numbers_stay_tensors = True     # a loss is a 0-d tensor: a float would need its value
    takes_any_device = True         # a tensor of any device counts by its shape
    fuses = False                   # fused steps read values: composed of their parts
    checkpoints = False             # nothing is kept to save: f runs as it is

    def adopt(self, backend: Backend, tensor: Any) -> MetaArray:
        # nothing is computed: a tensor of any device is its shape
        return backend.full(tensor._shape, 0.0, tensor._dtype)

    def mixed_message(self, tensor: Any, backend: Backend) -> str:
        return (f"eval_shape: a tensor on {backend.device} made outside the traced function "
                f"comes first in an operation with traced tensors; make it inside the "
                f"function or pass it in")

    def number(self, cls: type, label: str, backend: Backend, value: Any, tape: Any,
               inputs: tuple[int, ...], vjp: Any, graph: Any) -> Any:
        # nothing is recorded: eval_shape's result is shapes only
        return _core.wrap(cls, backend, value, (), np.dtype(np.float64))

    def primitive(self, prim: Any, args: tuple[Any, ...], ops: list[Any], dtype: Any,
                  cls: type, kwargs: dict[str, Any], backend: Backend) -> Any:
        return prim._meta(args, ops, dtype, cls, kwargs)


SHAPES = Shapes()


class MetaBackend(ComposedKernels):
    """The Backend Protocol on shapes alone (fused kernels composed of the primitives)."""

    kind = "meta"
    interpreter = SHAPES
    lazy_numbers = False
    device = _MetaDevice()
    live_buffers = 0

    def _no_values(self, *args: Any) -> Any:
        raise TypeError("eval_shape traces shapes only: this tensor has no values")

    to_numpy = host_array = _no_values

    def asarray(self, array: Any, dtype: Any) -> MetaArray:
        return MetaArray(np.shape(array), dtype)

    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> MetaArray:
        return MetaArray(shape, dtype)

    def reshape(self, buf: MetaArray, shape: tuple[int, ...]) -> MetaArray:
        return MetaArray(shape, buf.dtype)

    def map(self, label: str, exprs: tuple[str, ...], operands: Any, shape: tuple[int, ...],
            dtypes: tuple[Any, ...]) -> list[MetaArray]:
        return [MetaArray(shape, dt) for dt in dtypes]

    def prepared_map(self, label: str, exprs: tuple[str, ...], names: tuple[str, ...]
                     ) -> Any:
        def run(args: tuple[Any, ...], shape: tuple[int, ...],
                dtypes: tuple[Any, ...]) -> list[MetaArray]:
            return [MetaArray(shape, dt) for dt in dtypes]
        return run

    def reduce(self, op: str, buf: MetaArray, axes: tuple[int, ...]) -> MetaArray:
        return MetaArray(tuple(n for d, n in enumerate(buf.shape) if d not in axes), buf.dtype)

    def matmul(self, a: MetaArray, b: MetaArray, transpose_a: bool = False,
               transpose_b: bool = False) -> MetaArray:
        m = a.shape[2] if transpose_a else a.shape[1]
        n = b.shape[1] if transpose_b else b.shape[2]
        return MetaArray((max(a.shape[0], b.shape[0]), m, n), a.dtype)

    def op(self, op: Any, params: Any, bufs: list[MetaArray], shape: tuple[int, ...],
           dtype: Any) -> MetaArray:
        """An op of the op table: its shape rule has given the shape (nothing runs)."""
        return MetaArray(shape, dtype)

    def strided(self, buf: MetaArray, offset: int, shape: tuple[int, ...],
                strides: tuple[int, ...]) -> MetaArray:
        return MetaArray(shape, buf.dtype)

    def assemble(self, shape: tuple[int, ...], dtype: Any, parts: Any) -> MetaArray:
        return MetaArray(shape, dtype)

    def take(self, buf: MetaArray, index: np.ndarray) -> MetaArray:
        return MetaArray(index.shape, buf.dtype)

    def scatter_add(self, shape: tuple[int, ...], dtype: Any, index: Any, g: Any,
                    unique: bool = False) -> MetaArray:
        return MetaArray(shape, dtype)


META = MetaBackend()


class ShapeDtype:
    """A shape and a dtype without values: what ``ad.eval_shape`` returns for each output,
    and what it accepts in place of an input array.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> spec = ad.ShapeDtype((16, 784), np.float32)
    >>> spec.shape, spec.dtype, spec.ndim, spec.size
    ((16, 784), dtype('float32'), 2, 12544)
    >>> ad.eval_shape(lambda x: 2.0 * x, spec)
    ShapeDtype(shape=(16, 784), dtype=float32)
    """

    __slots__ = ("shape", "dtype")
    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape: Any, dtype: Any = np.float64) -> None:
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        object.__setattr__(self, "dtype", np.dtype(dtype))
        if any(n < 0 for n in self.shape):
            raise ValueError(f"a shape has no negative lengths: {self.shape}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ShapeDtype is immutable")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, ShapeDtype):
            return NotImplemented
        return self.shape == other.shape and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype.str))

    def __repr__(self) -> str:
        return f"ShapeDtype(shape={self.shape}, dtype={self.dtype})"

    def __reduce__(self) -> Any:
        return (ShapeDtype, (self.shape, self.dtype))

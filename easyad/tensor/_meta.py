"""The meta backend: tensors that have a shape and a dtype but no values.

``eval_shape`` runs a function on such tensors: every operation still asks ``_shapes`` for
its output shape (so a mismatch raises the same ShapeError a real evaluation raises), but
no buffer is allocated and no kernel runs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.tensor._composed import ComposedKernels


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


class MetaBackend(ComposedKernels):
    """The Backend Protocol on shapes alone (fused kernels composed of the primitives)."""

    kind = "meta"
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

    def reduce(self, op: str, buf: MetaArray, axes: tuple[int, ...]) -> MetaArray:
        return MetaArray(tuple(n for d, n in enumerate(buf.shape) if d not in axes), buf.dtype)

    def matmul(self, a: MetaArray, b: MetaArray, transpose_a: bool = False,
               transpose_b: bool = False) -> MetaArray:
        m = a.shape[2] if transpose_a else a.shape[1]
        n = b.shape[1] if transpose_b else b.shape[2]
        return MetaArray((max(a.shape[0], b.shape[0]), m, n), a.dtype)

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

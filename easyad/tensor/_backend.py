"""The Backend Protocol: everything the tensor layer asks of a device's storage and kernels.

Three backends conform: ``NumpyBackend`` (``_numpy.py``, host arrays), ``OpenCLBackend``
(``_opencl.py``, device buffers) and ``MetaBackend`` (``_meta.py``, shapes only, for
``eval_shape``), and so does the recorder's ``ProgramBackend`` (``_program.py``), which wraps
one of the first two; ``tests/test_layers.py`` checks each, at run time and with mypy. The
tensor operations (``_base``, ``_elementwise``, ``_structural``, ``_fused``) call nothing
else on a backend, so a new device is one class with these members.

Contract shared by every method:

- A *buffer* is the backend's own array type (ndarray, ``pyopencl.array.Array``,
  ``MetaArray``) with ``.shape`` and ``.dtype``; float64 or float32, bool where said. It is
  C-contiguous, and a method that returns one returns a buffer the caller owns: a new one
  (never one of its operands), except ``reshape``, which may return a view sharing the
  memory. Operations never write into their operands; the tensor layer never writes into
  a buffer after it made it, so views are safe.
- Shapes are tuples of ints; axes are non-negative and already checked by ``_shapes``
  (a backend may assume valid arguments: ShapeErrors are raised before it is called).
- Operands of ``map`` may be buffers or Python floats (scalars broadcast); buffers of
  different shapes broadcast to ``shape`` by numpy's rules.
- Index arrays (``take``, ``scatter_add``, ``cross_entropy``'s target) are numpy int64
  arrays on the host, within range.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from easyad.tensor._interpreters import Interpreter


@runtime_checkable
class Backend(Protocol):
    """A device's storage and kernels (see the module docstring for the contract)."""

    @property
    def kind(self) -> str:
        """"numpy", "opencl", "meta" or "program": for messages and reports only; the
        tensor layer never branches on it (it asks ``interpreter``)."""

    @property
    def interpreter(self) -> Interpreter:
        """What running an operation on these buffers means (``_interpreters``): evaluate
        it (numpy, OpenCL), trace shapes (meta) or record it (a program); the tensor layer
        asks it, by method, whatever differs between them."""

    @property
    def device(self) -> Any:
        """The ``ad.Device`` these buffers live on."""

    @property
    def lazy_numbers(self) -> bool:
        """Whether a single-number result (a loss) stays in the device's memory until it is
        first used: True where reading a buffer waits for the device (OpenCL), so a
        training step never waits unless its loss is asked for."""

    @property
    def live_buffers(self) -> int:
        """How many buffers this backend made are still alive (the memory tests read it)."""

    # -- buffers --
    def asarray(self, array: Any, dtype: Any) -> Any:
        """A new buffer holding a copy of the host ``array`` in ``dtype``."""

    def to_numpy(self, buf: Any) -> np.ndarray:
        """A new host ndarray with ``buf``'s values (raises TypeError on meta)."""

    def host_array(self, buf: Any) -> np.ndarray:
        """``buf``'s values on the host for reading only: ``buf`` itself where it already
        is a host array (numpy), else a copy as ``to_numpy`` makes."""

    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> Any:
        """A new buffer of ``shape`` filled with ``value``."""

    def reshape(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """``buf`` with the same elements in C order and a new ``shape`` of the same size;
        may share memory with ``buf``."""

    # -- kernels --
    def map(self, label: str, exprs: tuple[str, ...], operands: Mapping[str, Any],
            shape: tuple[int, ...], dtypes: tuple[Any, ...]) -> list[Any]:
        """One elementwise kernel: for each expression of the rule language (``_expr``;
        names = the keys of ``operands``), a new buffer of ``shape`` and its dtype.
        ``label`` names the kernel in errors and profiles. IEEE semantics: NaN and inf
        flow through, nothing raises."""

    def prepared_map(self, label: str, exprs: tuple[str, ...], names: tuple[str, ...]
                     ) -> Any:
        """``map`` prepared once: a callable ``run(args, shape, dtypes)`` that returns
        ``map(label, exprs, dict(zip(names, args)), shape, dtypes)``. The elementwise
        operations keep one per rule and backend, so an operation skips the lookup of its
        expressions (a backend may simply close over ``map``)."""

    def reduce(self, op: str, buf: Any, axes: tuple[int, ...]) -> Any:
        """``op`` ("sum", "max" or "min") over ``axes`` of ``buf``; those axes dropped."""

    def matmul(self, a: Any, b: Any, transpose_a: bool = False,
               transpose_b: bool = False) -> Any:
        """Batched product (B|1, M, K) @ (B|1, K, N) -> (B, M, N); a batch of 1
        broadcasts. ``transpose_a``: ``a`` is given as (B|1, K, M); ``transpose_b``: ``b``
        as (B|1, N, K). Both operands have the same float dtype, the result too."""

    def strided(self, buf: Any, offset: int, shape: tuple[int, ...],
                strides: tuple[int, ...]) -> Any:
        """A contiguous copy of the view of ``buf`` at ``offset`` with ``shape`` and
        ``strides`` (in elements, 0 to broadcast)."""

    def assemble(self, shape: tuple[int, ...], dtype: Any,
                 parts: Sequence[tuple[int, tuple[int, ...], tuple[int, ...], Any]]) -> Any:
        """Zeros of ``shape`` with each part ``(offset, part_shape, strides, buffer)``
        written into its view (views do not overlap)."""

    def take(self, buf: Any, index: np.ndarray) -> Any:
        """Elements of the flattened ``buf`` at ``index``, in ``index``'s shape."""

    def scatter_add(self, shape: tuple[int, ...], dtype: Any, index: np.ndarray, g: Any,
                    unique: bool = False) -> Any:
        """Zeros of ``shape`` with ``g`` (index's shape, or broadcast to it) added at the
        flat positions ``index``; repeated indices add up (``unique``: the caller knows
        there are none)."""

    def op(self, op: Any, params: Any, bufs: list[Any], shape: tuple[int, ...],
           dtype: Any) -> Any:
        """An op of the op table (``easyad.ops.Op``) with its canonical ``params`` on
        ``bufs``: a new buffer of ``shape`` and ``dtype`` (the op's shape rule gave them).
        ``op.lower(self, ...)`` picks the op's lowering for this backend's kind, else its
        composite of the primitives above, else its numpy lowering on host copies."""

    # -- fused kernels (tensor/_fused.py; _composed.ComposedKernels composes them) --
    def linear(self, x: Any, w: Any, b: Any) -> Any:
        """``x @ w.T + b`` for x (N, K), w (O, K) of one dtype, and b a buffer of shape
        (O,) or (), a float, or None: a new (N, O) buffer."""

    def linear_vjp(self, g: Any, x: Any, w: Any, needs: tuple[bool, bool, bool]
                   ) -> tuple[Any, Any, Any]:
        """The adjoints of ``linear`` for g (N, O): (g w (N, K), gᵀ x (O, K), Σₙ g (O,)),
        each None where ``needs`` is False (and x or w may be None where not needed)."""

    def cross_entropy(self, z: Any, target: np.ndarray, divisor: float) -> tuple[Any, Any]:
        """For logits ``z`` (N, C) and classes ``target`` (N,): a 0-d buffer with
        ``sum_n (logsumexp(z[n]) - z[n, target[n]]) / divisor`` (stable: shifted by each
        row's finite maximum), and an opaque state for ``cross_entropy_vjp``."""

    def cross_entropy_vjp(self, saved: Any, target: np.ndarray, scale: float) -> Any:
        """``(softmax(z) - onehot(target)) * scale`` of z's shape, from the saved state."""

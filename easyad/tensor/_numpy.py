"""The numpy backend: tensors as numpy arrays on the host, always available.

Elementwise operations compile the rule table's expression strings (and the tensor layer's
own expressions in the same language) against ``NAMESPACE``, what each function name of the
language means for numpy arrays, helpers (``sign``, ``heaviside``, ``mul0``, ``div0``,
``choose``) included (``_expressions.numpy_namespace``). The OpenCL backend
(``_opencl.py``) renders the
very same strings into kernels; the two must agree, and the tests check that they do.
Buffers are C-contiguous ndarrays; IEEE semantics throughout (NaN/inf, no exceptions).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from easyad import _core, _expr
from easyad._expressions import compile_expression as _compile
from easyad._expressions import numpy_namespace
from easyad.tensor import _blas
from easyad.tensor._buffers import LiveBuffers
from easyad.tensor._interpreters import EVALUATE


# ---- the expression namespace (easyad/_expressions.py owns it) ----

NAMESPACE: Mapping[str, Any] = numpy_namespace()


# for operands known to be float arrays or Python floats (the core's dispatch): mul0 and
# div0 are the core's ufuncs themselves, without the wrappers that also take object arrays
FLOAT_NAMESPACE: Mapping[str, Any] = {**NAMESPACE, "mul0": _core._mul0_ufunc,
                                      "div0": _core._div0_ufunc}


@functools.lru_cache(maxsize=None)
def compile_expression(text: str, names: tuple[str, ...]) -> Any:
    """An expression of the shared language as a Python function of ``names``, over numpy
    (a hand-written one of the same values where ``HAND_WRITTEN`` has the expression)."""
    generic = _compile(text, NAMESPACE, names)
    hand = HAND_WRITTEN.get((text, names))
    return generic if hand is None else functools.partial(hand, generic)


# ---- hand-written kernels: the same values as the expression, with less work ----
# numpy evaluates an expression term by term (no common subexpressions, a temporary per
# operation); these few, hot in nn, compute exactly the same floats another way. Each
# takes the generic function first, for operands it was not written for.

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# tensor/_fused.py's sigmoid, exp(-|x|) on each side of 0 (numpy would take three
# exponentials, exp(-x) and exp(x) twice, and a select)
SIGMOID = "choose(x >= 0.0, 1.0 / (1.0 + exp(-x)), exp(x) / (1.0 + exp(x)))"
SIGMOID_VJP = "g * (s * (1.0 - s))"


def _sigmoid(generic: Any, x: Any) -> Any:
    """exp(min(x, 0)) / (1 + exp(-|x|)): where x >= 0, 1 / (1 + exp(-x)), elsewhere
    exp(x) / (1 + exp(x)): the expression's very floats, signed zeros included, with no
    mask (NaN stays NaN; its sign bit may differ). Two vector exponentials and no
    ``where`` ran 6-8x faster than the expression's select, and than one exponential
    with a masked division (64x1024 float32: 0.17 ms against 1.3)."""
    # (a 0-d array's ufunc results are numpy scalars, which out= cannot take)
    if type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim == 0:
        return generic(x)
    d = np.abs(x)
    np.negative(d, out=d)
    np.exp(d, out=d)
    d += 1.0                                       # (a Python float keeps float32)
    out = np.minimum(x, 0.0)
    np.exp(out, out=out)
    out /= d
    return out


def _sigmoid_vjp(generic: Any, g: Any, s: Any) -> Any:
    """g (s (1 - s)) in one temporary, in the expression's order of operations."""
    if (type(g) is not np.ndarray or type(s) is not np.ndarray or g.shape != s.shape
            or g.dtype != s.dtype or s.dtype not in _FLOATS or s.ndim == 0):
        return generic(g, s)
    t = np.subtract(1.0, s)
    np.multiply(s, t, out=t)
    np.multiply(g, t, out=t)
    return t


# the rule table's tanh vjp as the core's elementwise dispatch asks for it: cosh once
TANH_VJP = "mul0(g, 1.0 / (cosh(x) * cosh(x)))"


def _tanh_vjp(generic: Any, x: Any, g: Any) -> Any:
    """mul0(g, 1 / (c c)) with c = cosh(x) computed once, not twice (the same floats)."""
    if (type(x) is not np.ndarray or type(g) is not np.ndarray or g.shape != x.shape
            or g.dtype != x.dtype or x.dtype not in _FLOATS or x.ndim == 0):
        return generic(x, g)
    c = np.cosh(x)
    np.multiply(c, c, out=c)
    np.divide(1.0, c, out=c)
    return _core._mul0_ufunc(g, c)


HAND_WRITTEN: dict[tuple[str, tuple[str, ...]], Any] = {
    (SIGMOID, ("x",)): _sigmoid, (SIGMOID_VJP, ("g", "s")): _sigmoid_vjp,
    (TANH_VJP, ("x", "g")): _tanh_vjp}


@functools.lru_cache(maxsize=None)
def _compile_for_floats(text: str, names: tuple[str, ...]) -> Any:
    generic = _compile(text, FLOAT_NAMESPACE, names)
    hand = HAND_WRITTEN.get((text, names))
    return generic if hand is None else functools.partial(hand, generic)


# (expressions, operand names) -> their compiled functions: one dict lookup per map
_KERNELS: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Any, ...]] = {}

# numpy's floating-point error state, set to "ignore" around a kernel: np.errstate costs
# ~1.8 us per use (it builds its state object each time), setting numpy's own context
# variable to a state made once costs ~0.1 us. Falls back to errstate where numpy has no
# such variable.
_ERRSTATE: Any = None
_IGNORE: Any = None
try:   # numpy's private names: anything unexpected about them means np.errstate instead
    from numpy._core import _ufunc_config
    _ERRSTATE = vars(_ufunc_config)["_extobj_contextvar"]
    _IGNORE = vars(_ufunc_config)["_make_extobj"](all="ignore")
    _ERRSTATE.reset(_ERRSTATE.set(_IGNORE))            # proves the variable takes it
except Exception:   # pragma: no cover (numpy < 2, or its internals changed)
    _ERRSTATE = None
if _ERRSTATE is not None:    # the core's dispatch calls ``functions`` under this state
    _core._register_numpy_errstate(_ERRSTATE, _IGNORE)


def _run_quietly(functions: tuple[Any, ...], args: tuple[Any, ...]) -> list[Any]:
    if _ERRSTATE is None:   # pragma: no cover
        with np.errstate(all="ignore"):
            return [f(*args) for f in functions]
    token = _ERRSTATE.set(_IGNORE)
    try:
        return [f(*args) for f in functions]
    finally:
        _ERRSTATE.reset(token)


_REDUCERS = {"sum": np.add.reduce, "max": np.maximum.reduce, "min": np.minimum.reduce}


def _view(buf: np.ndarray, offset: int, shape: tuple[int, ...],
          strides: tuple[int, ...]) -> np.ndarray:
    """The view (offset, shape, strides in elements) of the C-contiguous ``buf``: made by
    the ndarray constructor over ``buf``'s memory (a fraction of ``as_strided``'s cost,
    which builds an intermediate object); as_strided where the constructor refuses."""
    size = buf.itemsize
    byte_strides = tuple(s * size for s in strides)
    try:
        view: np.ndarray = np.ndarray(shape, buf.dtype, buffer=buf, offset=offset * size,
                                      strides=byte_strides)
        return view
    except (TypeError, ValueError):   # pragma: no cover (e.g. a read-only buffer)
        return np.lib.stride_tricks.as_strided(buf.reshape(-1)[offset:], shape,
                                               byte_strides)


_OPERATORS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def _direct_call(expression: str, names: tuple[str, ...]) -> Any:
    """The callable ``expression`` is, where it applies one function or operator to
    ``names`` in order (what ``compile_expression``'s function would call); else None."""
    node = _expr.parse(expression)
    if isinstance(node, _expr.Call):
        function, args = FLOAT_NAMESPACE.get(node.name), node.args
    elif isinstance(node, _expr.Bin):
        function, args = _OPERATORS.get(node.op), (node.left, node.right)
    elif isinstance(node, _expr.Neg):
        function, args = np.negative, (node.operand,)
    else:
        return None
    return function if args == tuple(_expr.Var(n) for n in names) else None


# ---- the backend ----

class NumpyBackend(LiveBuffers):
    """Tensor storage and kernels on the host, with numpy."""

    kind = "numpy"
    interpreter = EVALUATE   # operations compute their values now
    lazy_numbers = False     # reading a host array costs nothing: numbers are read at once

    def __init__(self, device: Any) -> None:
        self.device = device

    # -- buffers (counted by LiveBuffers._track) --
    def asarray(self, array: Any, dtype: np.dtype) -> np.ndarray:
        return self._track(np.array(array, dtype=dtype, order="C", copy=True))

    def to_numpy(self, buf: np.ndarray) -> np.ndarray:
        return np.array(buf, copy=True)

    def host_array(self, buf: np.ndarray) -> np.ndarray:
        return buf      # already on the host: no copy (the caller only reads it)

    def full(self, shape: tuple[int, ...], value: float, dtype: np.dtype) -> np.ndarray:
        return self._track(np.full(shape, value, dtype=dtype))

    def reshape(self, buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return buf.reshape(shape)

    # -- elementwise --
    def map(self, label: str, exprs: tuple[str, ...], operands: Mapping[str, Any],
            shape: tuple[int, ...], dtypes: tuple[np.dtype, ...]) -> list[np.ndarray]:
        names = tuple(operands)
        args = tuple(operands.values())
        key = (exprs, names)
        functions = _KERNELS.get(key)
        if functions is None:
            functions = _KERNELS[key] = tuple(compile_expression(t, names) for t in exprs)
        results = _run_quietly(functions, args)
        return [self._fresh(r, shape, dtype, args) for r, dtype in zip(results, dtypes)]

    def functions(self, expression: str, names: tuple[str, ...]) -> Any:
        """The expression as a plain function of ``names`` over numpy arrays: the core's
        elementwise dispatch calls it directly (under numpy's "ignore" error state) and
        makes its result a buffer as ``_fresh`` would. Where the expression is one call of
        the operands in order (``sin(x)``, ``x * y``), the ufunc itself: no Python frame
        around it."""
        return _direct_call(expression, names) or _compile_for_floats(expression, names)

    def prepared_map(self, label: str, exprs: tuple[str, ...], names: tuple[str, ...]
                     ) -> Any:
        functions = tuple(compile_expression(t, names) for t in exprs)
        fresh = self._fresh
        if len(functions) == 1 and _ERRSTATE is not None:   # the common case, unrolled
            function = functions[0]

            def run_one(args: tuple[Any, ...], shape: tuple[int, ...],
                        dtypes: tuple[np.dtype, ...]) -> list[np.ndarray]:
                token = _ERRSTATE.set(_IGNORE)
                try:
                    result = function(*args)
                finally:
                    _ERRSTATE.reset(token)
                return [fresh(result, shape, dtypes[0], args)]
            return run_one

        def run(args: tuple[Any, ...], shape: tuple[int, ...],
                dtypes: tuple[np.dtype, ...]) -> list[np.ndarray]:
            results = _run_quietly(functions, args)
            return [fresh(r, shape, dtype, args) for r, dtype in zip(results, dtypes)]
        return run

    def _fresh(self, result: Any, shape: tuple[int, ...], dtype: np.dtype,
               args: tuple[Any, ...]) -> np.ndarray:
        # a new C-contiguous array of exactly shape and dtype, never one of the operands
        if (type(result) is np.ndarray and result.base is None and result.shape == shape
                and result.dtype == dtype and result.flags.c_contiguous):
            for a in args:
                if result is a:
                    break
            else:
                return self._track(result)
        out = np.empty(shape, dtype=dtype)
        out[...] = result
        return self._track(out)

    # -- reductions and linear algebra --
    def reduce(self, op: str, buf: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        # the ufuncs' reduce: what np.sum/np.max/np.min call, without their wrappers
        reduced = _run_quietly((_REDUCERS[op],), (buf, axes))[0]
        return self._track(np.ascontiguousarray(reduced))

    def matmul(self, a: np.ndarray, b: np.ndarray, transpose_a: bool = False,
               transpose_b: bool = False) -> np.ndarray:
        """(B|1, M, K) @ (B|1, K, N) -> (B, M, N); ``transpose_a``: a is (B|1, K, M),
        ``transpose_b``: b is (B|1, N, K) (views: BLAS takes the transpose as a flag)."""
        return self._track(np.ascontiguousarray(_blas.matmul(
            a.swapaxes(-1, -2) if transpose_a else a, b.swapaxes(-1, -2) if transpose_b else b)))

    # -- fused kernels (tensor/_fused.py) --
    def linear(self, x: np.ndarray, w: np.ndarray, b: Any) -> np.ndarray:
        """``x @ w.T + b`` (the transpose is a BLAS flag; the bias added in place)."""
        out = _blas.matmul(x, w.T)
        if b is not None:
            out += b
        return self._track(out)

    def linear_vjp(self, g: np.ndarray, x: Any, w: Any, needs: tuple[bool, bool, bool]
                   ) -> tuple[Any, Any, Any]:
        gx = self._track(_blas.matmul(g, w)) if needs[0] else None
        gw = self._track(_blas.matmul(g.T, x)) if needs[1] else None
        gb = self._track(g.sum(axis=0)) if needs[2] else None
        return gx, gw, gb

    def cross_entropy(self, z: np.ndarray, target: np.ndarray, divisor: float
                      ) -> tuple[np.ndarray, Any]:
        """(0-d: ``sum_n (logsumexp(z[n]) - z[n, target[n]]) / divisor``, saved state)."""
        n = z.shape[0]
        with np.errstate(all="ignore"):
            m = z.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(z - m)
            s = e.sum(axis=1, keepdims=True)
            rows = np.arange(n)
            losses = (np.log(s) + m)[:, 0] - z[rows, target]
            total = np.float64(losses.sum()) / divisor
        return self._track(np.asarray(total)), (e, s, rows)

    def cross_entropy_vjp(self, saved: Any, target: np.ndarray, scale: float) -> np.ndarray:
        """``(softmax(z) - onehot(target)) * scale``, of z's shape."""
        e, s, rows = saved
        p = e / s
        p[rows, target] -= 1.0
        p *= scale
        return self._track(p)

    # -- data movement --
    def strided(self, buf: np.ndarray, offset: int, shape: tuple[int, ...],
                strides: tuple[int, ...]) -> np.ndarray:
        """A contiguous copy of the view (offset, shape, strides in elements) of ``buf``."""
        if buf.size == 0 or math.prod(shape) == 0:
            return self._track(np.empty(shape, dtype=buf.dtype))
        return self._track(np.array(_view(buf, offset, shape, strides), order="C"))

    def assemble(self, shape: tuple[int, ...], dtype: np.dtype,
                 parts: Sequence[tuple[int, tuple[int, ...], tuple[int, ...], Any]]
                 ) -> np.ndarray:
        """Zeros of ``shape`` with each part written into its view (offset, shape, strides)."""
        out = np.zeros(shape, dtype=dtype)
        for offset, part_shape, strides, src in parts:
            if math.prod(part_shape) == 0:
                continue
            _view(out, offset, part_shape, strides)[...] = src.reshape(part_shape)
        return self._track(out)

    def adopt(self, array: np.ndarray) -> np.ndarray:
        """A new C-contiguous array no one else holds, as this backend's buffer (no copy)."""
        return self._track(array)

    def op(self, op: Any, params: Any, bufs: list[np.ndarray], shape: tuple[int, ...],
           dtype: Any) -> np.ndarray:
        """An op of the op table (``easyad.ops``): its numpy lowering."""
        out: np.ndarray = op.lower(self, params, bufs, shape, dtype)
        return out

    def take(self, buf: np.ndarray, index: np.ndarray) -> np.ndarray:
        return self._track(np.ascontiguousarray(buf.reshape(-1)[index]))

    def scatter_add(self, shape: tuple[int, ...], dtype: np.dtype, index: np.ndarray,
                    g: np.ndarray, unique: bool = False) -> np.ndarray:
        out = np.zeros(math.prod(shape), dtype=dtype)
        np.add.at(out, index.reshape(-1), g.reshape(-1))
        return self._track(out.reshape(shape))

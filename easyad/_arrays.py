"""Arrays entering and leaving easyad's entry points, checked in one place.

Every entry point that takes arrays (``Function`` and ``TensorFunction`` methods, the
functional transforms, ``out=`` arguments, bound buffers, the indices of
``ad.Function(lst, inputs, outputs)``) goes through these helpers, so a kind of array
is either accepted everywhere or refused everywhere with the same message:

- inputs: any array of bools, ints or floats that numpy converts to float64 exactly
  enough (byte order, memory order, read-only, unaligned: converted or copied here); the
  C fast paths only ever see native, aligned, C-contiguous float64 (``_core``'s gates
  check the same and send anything else here);
- complex, datetime64, timedelta64, strings, bytes, structured and object arrays: a
  TypeError naming the dtype (numpy would drop the imaginary part with only a warning,
  or read dates as their integer ticks);
- ``out=``: a writable ndarray of the result's shape whose dtype float64 casts into
  safely (float64 of either byte order, longdouble); anything else raises before
  anything is computed, and the result is written only once it is complete.

Leaf module: numpy only, imported by replay, _recorded, _evaluation and the tensors.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np
from numpy.typing import NDArray

FLOAT64 = np.dtype(np.float64)

# dtype kinds refused, with what they are, for the message
_REFUSED = {"c": "complex numbers", "M": "dates (datetime64)",
            "m": "time spans (timedelta64)", "O": "Python objects", "U": "strings",
            "S": "bytes", "V": "raw or structured records"}


def dtype_problem(dtype: np.dtype, what: str) -> TypeError | None:
    """The TypeError for an array of ``dtype`` given as ``what``, None if it holds reals."""
    kind = dtype.kind
    if kind in "biuf":
        return None
    if kind == "c":
        return TypeError(f"{what} must be real numbers, got complex (dtype {dtype}): "
                         f"easyad differentiates real functions; pass {what}.real if that "
                         f"is meant")
    if kind == "O":
        return TypeError(f"{what} must be an array of real numbers, got dtype object "
                         f"(Python objects: Records, Tensors or mixed types?); replay and "
                         f"the transforms take numbers")
    return TypeError(f"{what} must hold real numbers (floats, ints or bools), got dtype "
                     f"{dtype} ({_REFUSED.get(kind, 'not numbers')}); convert it to floats "
                     f"first")


def check_real(a: NDArray[Any], what: str) -> None:
    """Raise the TypeError of ``dtype_problem`` for an array that does not hold reals."""
    problem = dtype_problem(a.dtype, what)
    if problem is not None:
        raise problem


def refuse_complex_scalar(v: Any, what: str = "an operand") -> None:
    """Raise TypeError for a complex number (Python's or numpy's): float() of a numpy
    complex scalar drops the imaginary part with only a ComplexWarning."""
    if isinstance(v, (complex, np.complexfloating)):
        raise TypeError(f"{what} is complex ({v!r}): easyad differentiates real functions "
                        f"and has no complex numbers yet; pass the real part if that is "
                        f"meant")


def real_array(x: Any, what: str, dtype: Any = FLOAT64) -> NDArray[Any]:
    """``x`` as a native-byte-order, aligned, C-contiguous array of ``dtype`` (float64
    unless told): ``x`` itself when it already is one (even read-only: callers only read
    it), else a converted copy. Refuses what does not hold reals (``dtype_problem``)."""
    a = x if type(x) is np.ndarray else np.asarray(x)
    check_real(a, what)
    dtype = np.dtype(dtype)
    if a.dtype == dtype and a.flags.c_contiguous and a.flags.aligned:
        return a        # np.dtype equality includes byte order: a native array
    return np.require(np.asarray(a, dtype=dtype), dtype, ("C", "A"))


def result_dtype(leaves: list[Any]) -> np.dtype:
    """The floating dtype derivatives come back in for a point with these leaves: numpy's
    result type of its floating leaves (arrays, numpy scalars and tensors: float16/32
    stay, float64 wins over them), float64 where it has none (ints, bools, Python
    numbers: weak, they never decide)."""
    floats = [d for d in (getattr(a, "dtype", None) for a in leaves)
              if isinstance(d, np.dtype) and d.kind == "f"]
    if not floats:
        return FLOAT64
    found = np.result_type(*floats)
    return found if found.itemsize <= 8 else FLOAT64   # longdouble: computed in float64


def as_result_dtype(result: Any, dtype: np.dtype) -> Any:
    """``result`` (arrays, floats, structures of them) with its float64 arrays in
    ``dtype``; recorded values (a transform inside another) and floats are left as they
    are."""
    if dtype == FLOAT64:
        return result
    if type(result) is np.ndarray:
        return result.astype(dtype) if result.dtype == FLOAT64 else result
    if isinstance(result, dict):
        return {k: as_result_dtype(v, dtype) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(as_result_dtype(v, dtype) for v in result)
    backend = getattr(result, "_backend", None)
    if backend is not None and not backend.interpreter.has_values:
        return result.astype(dtype)     # eval_shape of a transform: its result's dtype
    return result


def out_array(out: Any, shape: tuple[int, ...], what: str = "out") -> bool:
    """Check an ``out=`` array for a float64 result of ``shape``; return whether C may
    write into it directly (native, aligned, C-contiguous float64), else the caller
    computes the result and writes it converted (``write_out``)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(out).__name__}")
    native = out.dtype == FLOAT64     # (np.can_cast costs microseconds: only for others)
    if not native and not np.can_cast(FLOAT64, out.dtype, "safe"):
        raise TypeError(f"{what} must be a float64 array (got dtype {out.dtype}): the "
                        f"results are float64 and would be truncated or rounded in "
                        f"{out.dtype}; pass np.empty({shape}) or drop {what}=")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{what} must have the result's shape {tuple(shape)}, got "
                         f"{out.shape}")
    if not out.flags.writeable:
        raise ValueError(f"{what} is read-only; pass a writable array")
    return native and out.flags.c_contiguous and out.flags.aligned


def write_out(out: NDArray[Any], result: Any) -> NDArray[Any]:
    """Write a complete result into a checked ``out`` (converting byte order); return it."""
    np.copyto(out, result, casting="safe")
    return out


def bound_array(a: Any, size: int, what: str, writable: bool) -> NDArray[np.float64]:
    """Check an array bound once for C to read or write in place (``bind_gradient``,
    ``bind_hessian``): nothing can be converted, so anything but a native, aligned,
    C-contiguous float64 vector of ``size`` (writable for results) raises: TypeError for
    what is not an ndarray of reals, ValueError for another dtype, shape or layout."""
    need = (f"a C-contiguous float64 array of shape ({size},) in native byte order"
            f"{', writable' if writable else ''}")
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be {need}, got {type(a).__name__}")
    problem = dtype_problem(a.dtype, what)
    if problem is not None:
        raise problem
    if a.dtype != FLOAT64:      # (ValueError, as binding has always raised for these)
        order = " (big-endian)" if a.dtype.kind == "f" and a.dtype.byteorder == ">" else ""
        raise ValueError(f"{what} must be {need}, got dtype {a.dtype}{order}: it is read "
                        f"or written in place, so it cannot be converted; make it with "
                        f"np.ascontiguousarray({what}, dtype=float64) and bind that")
    if a.shape != (size,):
        raise ValueError(f"{what} must be {need}, got shape {a.shape}")
    if not (a.flags.c_contiguous and a.flags.aligned):
        raise ValueError(f"{what} must be {need}, got a strided or unaligned view; bind "
                         f"np.ascontiguousarray({what})")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} must be {need}, got a read-only array")
    return a


def indices(values: Any, what: str) -> list[int]:
    """Entry indices (``ad.Function``'s inputs and outputs) as Python ints: integers
    only (a float or bool index is a mistake numpy would truncate or read as 0/1)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise TypeError(f"{what} must be integer entry indices, got an array of "
                            f"{values.dtype}")
        return [int(v) for v in values.reshape(-1)]
    out = []
    for k, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what}[{k}] must be an integer entry index (Record.index), "
                            f"got {type(v).__name__} {v!r}")
        out.append(operator.index(v))
    return out


__all__ = ["dtype_problem", "check_real", "refuse_complex_scalar", "real_array",
           "result_dtype", "as_result_dtype", "out_array", "write_out", "bound_array",
           "indices"]

# cython: language_level=3, binding=True, embedsignature=True
"""The compiled core of easyad: Trace (forward mode), Record and WengertList (reverse mode)
and the generic functions, all rendered from the rule table in easyad/_rules.py.

This hub holds the shared coercion and error helpers and the services registry; the parts
are included in order (hand-written ones in _engine/, the rest generated from the table):
checks (Python's float error policy) -> ops (generated; C in _generated/_ops.h) ->
conventions (what a tape entry means) -> nodes, tensors, structural, ufuncs, gemm, winograd
(tensor steps and their C paths) -> tape_storage, tape, sweep, rebuild, derivatives
(WengertList's arrays, the list, the backward sweep, pickles, Derivatives) ->
trace, record, nested (generated; nested: Traces of Traces or of Records) -> branches
(comparisons, guards, selects) -> validate (the gate for tapes from outside) -> generic
(generated) -> programs, sparsity (the sparse derivatives' sequential loops) -> replay
(program, schedule, layout, sweeps, replayer, native: the call into compiled code).
"""
cimport cython
from libc.math cimport floor, isnan, isinf, isfinite, NAN
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy, memset, memcmp
from libc.stdint cimport uint8_t, int32_t, uint32_t, int64_t, uint64_t
from cpython.object cimport PyObject, PyTypeObject, newfunc

import numbers
import zlib

import numpy as np
cimport numpy as cnp

cnp.import_array()

from easyad.errors import PowDomainError, StaleRecordError, TapeFormatError, TapeMismatchError


# ---- operand coercion: one place decides what counts as a plain real number ----

cdef int _coerce_real(object other, double* out, object cls) except -1:
    """1 and *out set if other is a plain real number; 0 if its type is unknown here.

    Raises TypeError when forward and reverse mode meet (cls is the caller's class).
    """
    if isinstance(other, float):       # float and numpy.float64
        out[0] = <double>other
        return 1
    if isinstance(other, int):         # int, bool, and too-large ints raise OverflowError
        out[0] = <double>other
        return 1
    if type(other) is Trace or type(other) is Record:
        if cls is not None:
            _raise_mixed_modes(cls, other)
        return 0
    if isinstance(other, (np.floating, np.integer, np.bool_)) or (
            isinstance(other, numbers.Real) and not isinstance(other, np.ndarray)):
        out[0] = float(other)
        return 1
    return 0


cdef inline int _compare_operand(object other, double* out, object cls) except -1:
    if type(other) is cls:
        # the C field: the number property of a Record checks strict recording
        if cls is Record:
            _ready(<Record>other)
            out[0] = (<Record>other)._number
        else:
            out[0] = (<Trace>other).number
        return 1
    return _coerce_real(other, out, cls)


cdef double _real_argument(object x, str what) except? -1.0:
    cdef double value
    if _coerce_real(x, &value, None):
        return value
    raise TypeError(f"{what} must be a real number (float, int or numpy scalar), "
                    f"got {type(x).__name__}")


# ---- errors: clear, specific, naming the fix ----

cdef int _raise_mixed_modes(object cls, object other) except -1:
    raise TypeError(
        f"cannot combine a {cls.__name__} with a {type(other).__name__}: forward mode "
        f"(Trace) and reverse mode (Record) do not mix; use one mode for the whole computation")


cdef int _raise_stale(Record r) except -1:
    raise StaleRecordError(
        f"Record at index {r.index} was made on {r.tape!r} before it was cleared; "
        f"records do not survive lst.clear(), so make the inputs again")


cdef int _raise_tape_mismatch(object first, object second, str what="operation") except -1:
    raise TapeMismatchError(
        f"{what} mixes records of two different lists, {first!r} and {second!r}; "
        f"record a whole computation on one WengertList")


cdef int _raise_operands(str name, object x, object y) except -1:
    raise TypeError(f"{name}() takes numbers, Traces, Records, numpy arrays or tensors, "
                    f"got {type(x).__name__} and {type(y).__name__}")


def _unary_fallback(function, str name, str numpy_name, x):
    if isinstance(x, np.ndarray):
        # an object array's ufunc calls a method of each element, which a float element
        # (a constant among Records) lacks: the elementwise function handles every kind
        ufunc = getattr(np, numpy_name, None) if numpy_name and x.dtype.kind != "O" else None
        if ufunc is not None:
            return ufunc(x)
        result = np.frompyfunc(function, 1, 1)(x)
        return result.astype(x.dtype) if x.dtype.kind == "f" else result
    method = getattr(type(x), name, None)
    if method is not None:
        return method(x)
    hint = "; for elementwise use pass np.asarray(...)" if isinstance(x, (list, tuple)) else ""
    raise TypeError(f"{name}() takes a number, Trace, Record, numpy array or tensor, "
                    f"got {type(x).__name__}{hint}")


def _binary_fallback(function, str name, str numpy_name, x, y):
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        objects = (isinstance(x, np.ndarray) and x.dtype.kind == "O") or \
            (isinstance(y, np.ndarray) and y.dtype.kind == "O")
        ufunc = getattr(np, numpy_name, None) if numpy_name and not objects else None
        if ufunc is not None:
            return ufunc(x, y)
        result = np.frompyfunc(function, 2, 1)(x, y)
        if objects:
            return result
        dtype = np.result_type(x, y)    # float arrays stay float (float32 too), as unary
        return result.astype(dtype if dtype.kind == "f" else np.float64)
    method = getattr(type(x), name, None)
    if method is not None:
        result = method(x, y)
        if result is not NotImplemented:
            return result
    return _reflected_or_raise(name, x, y)


def _reflected_or_raise(str name, x, y):
    # a tensor's own method: lets a tensor serve ad.maximum(0.0, t) and ad.atan2(t, record)
    if type(x) is not Trace and type(x) is not Record and not isinstance(x, np.ndarray):
        method = getattr(type(x), name, None)
        if method is not None:
            result = method(x, y)
            if result is not NotImplemented:
                return result
    if type(y) is not Trace and type(y) is not Record:
        method = getattr(type(y), "_r" + name, None)
        if method is not None:
            result = method(y, x)
            if result is not NotImplemented:
                return result
    _raise_operands(name, x, y)


# ---- anomaly detection (ad.detect_anomaly): one flag, read by every generated operation ----

cdef bint _anomaly_mode = False


def _set_anomaly_mode(bint on):
    """Switch NaN/inf detection on or off (easyad.anomaly.detect_anomaly does this)."""
    global _anomaly_mode
    previous = _anomaly_mode
    _anomaly_mode = on
    return previous


def _anomaly_enabled():
    return _anomaly_mode


# ---- services of higher layers ----
# The core never imports a layer above it: anomaly reporting, DOT pictures and the user
# primitive class register themselves here when their modules are imported (easyad's
# __init__ imports them all), and the core calls them through _service.
cdef dict _services = {}


def _register_service(str name, object implementation):
    """Called by a higher layer at import: ``name`` is what the core will ask for."""
    _services[name] = implementation


cdef object _service(str name):
    try:
        return _services[name]
    except KeyError:
        raise RuntimeError(f"easyad's {name} is not registered: import easyad (not "
                           f"easyad._core alone)") from None


cdef int _report_anomaly(str name, str mode, double z, double dz) except -1:
    _service("anomaly.report")(name, mode, z, dz)
    return 0


cdef int _anomaly_on_tape(WengertList tape, str name, double z, double p0,
                          double p1) except -1:
    # Remembers where each entry was recorded, to name the line a backward sweep blames.
    # Only a non-finite value raises here: a non-finite partial (sqrt at 0) is no anomaly
    # unless an adjoint flows through it, which the sweep checks (sqrt(x - x) * 0 + x has
    # the finite gradient 1).
    if not isfinite(z):
        _service("anomaly.report")(name, "reverse mode (Record)", z, z)
    tape._lines[tape._length] = _service("anomaly.user_line")()
    return 0


# ---- strict recording (ad.record(..., strict=True)): user code may not read values ----
# The switch is a flag on the WengertList being recorded, not a global: two threads
# recording at once (one strict, one not) cannot turn each other's checks on or off.

def _set_strict(WengertList tape not None, bint on):
    """Make every read of the values of Records on ``tape`` from user code (.number,
    repr/str, pickling) raise while ``on``; returns the previous setting (ad.record
    restores it)."""
    previous = tape._strict
    tape._strict = on
    return previous


cdef int _refuse_conversion(str what) except -1:
    raise TypeError(
        f"{what} of a Record would read its value with no guard: a replay (ad.record) at "
        f"another point would reuse it silently. Compare Records to branch (x > 0, "
        f"ad.where(x > 0, a, b)), or read x.number outside recording")


cdef int _strict_read(str how) except -1:
    import os, sys
    # Cython code makes no frame: frame 0 is the Python code that read the value. easyad's
    # own Python layers (primitives, outputs of f, error messages) may read it.
    frame = sys._getframe(0)
    filename = os.path.abspath(frame.f_code.co_filename)
    if filename.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep):
        return 0
    raise RuntimeError(
        f"{frame.f_code.co_filename}:{frame.f_lineno} reads {how} of a recorded variable "
        f"inside ad.record(..., strict=True): a branch on the value records no guard, so "
        f"replay at another point would follow this branch silently. Compare Records "
        f"instead (x > 0 records a guard that replay checks) or use ad.where(cond, a, b)")


include "_engine/checks.pxi"
include "_generated/_ops.pxi"
include "_engine/conventions.pxi"
include "_engine/nodes.pxi"
include "_engine/tensors.pxi"
include "_engine/structural.pxi"
include "_engine/ufuncs.pxi"
include "_engine/gemm.pxi"
include "_engine/lstm.pxi"
include "_engine/winograd.pxi"
include "_engine/tape_storage.pxi"
include "_engine/tape.pxi"
include "_engine/sweep.pxi"
include "_engine/rebuild.pxi"
include "_engine/derivatives.pxi"
include "_generated/_trace.pxi"
include "_generated/_record.pxi"
include "_generated/_nested.pxi"
include "_engine/branches.pxi"
include "_engine/validate.pxi"
include "_generated/_generic.pxi"
include "_engine/programs.pxi"
include "_engine/sparsity.pxi"
include "_engine/second_order.pxi"
include "_engine/replay/program.pxi"
include "_engine/replay/schedule.pxi"
include "_engine/replay/layout.pxi"
include "_engine/replay/sweeps.pxi"
include "_engine/replay/replayer.pxi"
include "_engine/replay/native.pxi"


def where(condition, a, b):
    """Select ``a`` where ``condition`` holds, else ``b`` (elementwise for arrays).

    Only the selected value carries a derivative: the other branch contributes exactly
    nothing, even where its own derivative is inf or NaN (so the gradient of
    ``where(x > 0, sqrt(x), 0.0)`` at 0 is 0). With a comparison of Records as the
    condition it is recorded as a select, which a replayed Function evaluates again at
    every point; a plain bool condition is fixed when recorded.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(0.0)
    >>> z = ad.where(x > 0, ad.sqrt(x), 0.0)     # sqrt'(0) is inf, but not selected
    >>> z.derivatives()[x]
    0.0
    """
    if type(a) is NestedTrace or type(b) is NestedTrace:
        # Traces of Traces or Records: select level by level (a Comparison selects the
        # Record parts on their tape)
        return _nested_where(condition, a, b)
    if type(condition) is Comparison and (<Comparison>condition).tape is not None:
        # a comparison of Records: a select on the tape, re-evaluated on replay
        return _record_select(<Comparison>condition, a, b)
    if type(condition) is not bool:
        for operand in (condition, a, b):  # a tensor among them selects elementwise itself
            hook = getattr(type(operand), "_where", None)
            if hook is not None:
                return hook(condition, a, b)
    if isinstance(condition, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(condition, a, b)
    chosen, other = (a, b) if condition else (b, a)
    cdef double value
    # keep the mode of the computation: where(x > 0, x, 0.0) is a Trace/Record either way
    if type(other) is Trace and type(chosen) is not Trace and _coerce_real(chosen, &value, None):
        return _new_trace(value, 0.0)
    if type(other) is Record and type(chosen) is not Record and _coerce_real(chosen, &value, None):
        return _new_constant_record(value)
    return chosen

"""Record once, replay many: ``ad.record(f, x0)`` turns a function into a ``Function``.

The Function holds the WengertList recorded at ``x0`` with its inputs and outputs marked.
This module holds ``record``, ``load`` and the class with its first-order methods and
pickling (so pickles name ``easyad.replay._rebuild_function``, as they always did); the
rest of the class is assembled from the mixins of ``easyad/recorded/`` (rows, Hessians,
compiling, devices, the file format). Evaluating it at new points runs the tape as a
program in C (``_core._Replayer``): values, gradients, Jacobians, Hessian-vector products
and Hessians, for one point or a batch of rows split over threads, with the GIL released.
Sits above the compiled core; the functional helpers (``ad.hessian``, ``ad.hvp``) build on
it.

Comparisons made while recording are guards: a row whose branch would differ is detected,
and ``on_branch_change`` says what happens (raise, re-record f there, or mask the row).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _arrays, _core, _levels, _tapeview, distributed
from easyad._core import Record, Trace, WengertList
from easyad.distributed import is_dask_array
from easyad.errors import BranchChangedError, TapeFormatError
from easyad.recorded import files
from easyad.recorded.compiling import Compiling
from easyad.recorded.devices import Devices
from easyad.recorded.files import _file_digest  # noqa: F401  (tests read the checksum)
from easyad.recorded.hessians import Hessians
from easyad.recorded.rows import _BRANCH_MODES, _GRADIENT, _SECOND, _VALUE, Rows
from easyad.recorded.sparse_jacobians import SparseJacobians


def _as_input(x0: ArrayLike, what: str = "x0") -> NDArray[np.float64]:
    x = _arrays.real_array(x0, what)
    if x.ndim != 1:
        raise ValueError(f"{what} must be 1-D (one point), got shape {x.shape}")
    return x


def _one_flat_array(x0: Any) -> bool:
    """Whether x0 is one 1-D array of numbers (scalar code's input), not a structure."""
    if isinstance(x0, dict) or hasattr(x0, "_backend"):
        return False
    try:
        a = np.asarray(x0)
    except ValueError:       # ragged: a structure
        return False
    return a.ndim == 1 and a.dtype != object


def _refuse_tensors(y: Any, lst: WengertList) -> None:
    """A tensor on the recording's list (a derivative transform called in f: ad.grad,
    ad.jacobian... of an array, recorded as tensor operations) cannot be replayed by a
    scalar recording: refused, naming the recordings that can."""
    for v in (y if isinstance(y, (list, tuple)) else [y]):
        if hasattr(v, "_backend") and getattr(v, "tape", None) is lst:
            raise TypeError(
                "f returned a tensor recorded on the list (a derivative transform such as "
                "ad.grad or ad.jacobian of an array records its sweep as tensor "
                "operations), which a scalar recording cannot replay: record it as tensor "
                "code, ad.record(f, x0, tensor=True), or record the function itself and "
                "differentiate the recording (F.gradient, F.jacobian, F.hessian)")


def _output_records(lst: WengertList, y: Any) -> tuple[list[Record], bool]:
    """The output Records of f and whether f returned a scalar."""
    _refuse_tensors(y, lst)
    scalar = not isinstance(y, (list, tuple, np.ndarray))
    items = [y] if scalar else list(np.asarray(y, dtype=object).ravel())
    records = []
    for k, item in enumerate(items):
        if isinstance(item, Record) and item.tape is lst:
            records.append(item)
        elif isinstance(item, Trace):
            raise TypeError("f returned a Trace: record() runs f on Records (reverse mode)")
        elif isinstance(item, Record) and item.tape is not None:
            raise ValueError(f"output {k} was recorded on another WengertList")
        else:
            _arrays.refuse_complex_scalar(item, f"output {k} of f")
            try:
                value = float(item.number if isinstance(item, Record) else item)
            except (TypeError, ValueError):
                raise TypeError(f"f must return numbers or Records, got "
                                f"{type(item).__name__} (output {k})") from None
            # a constant output: a variable that is not an input replays to its value
            records.append(lst.variable(value))
    if not records:
        raise ValueError("f returned no outputs")
    return records, scalar


def record(f: Callable[..., Any], x0: Any, *args: Any, on_branch_change: str = "raise",
           strict: bool = False, tensor: bool | None = None, device: Any = None,
           fuse: bool = True) -> Any:
    """Record ``f`` once at ``x0``; return a ``Function`` that replays it at new points.

    ``f`` takes a 1-D array (of Records while recording) and returns a number or a sequence
    of numbers. ``on_branch_change`` ("raise", "retape" or "mask") says what replay does at
    a point where a comparison ``f`` branched on would come out differently. A branch on
    a plain float (``x[0].number > 0``) records no guard, and replay silently follows the
    recorded branch: with ``strict=True``, reading ``.number`` of a recorded variable in
    ``f`` (or its ``repr``/``str``, or pickling it) raises RuntimeError naming the line, so
    such branches are found; every other read (``bool``, ``Comparison.outcome``,
    ``int(x > 0)``...) records a guard. Strict mode belongs to this recording alone:
    recordings in other threads are not affected. Tensor code needs no strict mode: every
    value it reads on the host (``t.value``, ``float(t)``, ``bool(t)``...) is a guard.

    **Tensor code** (``tensor=True``; chosen by itself when ``x0`` is not one 1-D array,
    when arguments follow ``x0``, when ``device`` is given, or when ``f`` uses tensor
    operations such as ``ad.nn``): ``f`` runs once on Tensors and its kernels, and those of
    its backward sweep, are recorded as a program; the result is a ``TensorFunction``
    (``F(x, *args)``, ``F.gradient``, ``F.value_and_gradient``, ``F.hvp``) that replays
    the program with no Python per elementwise operation (fused generated C on the numpy
    device, ``fuse=False`` to run the kernels one by one; the device's kernels on OpenCL).
    ``x0`` may be any structure of arrays (a dict of parameters); float arrays in ``args``
    are inputs too (not differentiated), other arguments are fixed by the recording. See
    docs/replay.md.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> F = ad.record(lambda x: x[0] ** 2 * x[1] + ad.sin(x[1]), [1.0, 2.0])
    >>> F([3.0, 0.0])
    0.0
    >>> F.gradient([3.0, 0.0])
    array([ 0., 10.])
    >>> F.gradient(np.array([[1.0, 0.0], [2.0, 0.0]]))   # a batch of rows
    array([[0., 2.],
           [0., 5.]])
    """
    if on_branch_change not in _BRANCH_MODES:
        raise ValueError(f"on_branch_change must be one of {_BRANCH_MODES}, "
                         f"got {on_branch_change!r}")
    chosen = tensor
    if tensor is None:
        tensor = bool(args) or device is not None or not _one_flat_array(x0)
    from easyad import _recorded
    from easyad.tensor._base import ObjectArrayOperand
    if tensor:
        return _recorded.record_tensor(f, x0, *args, on_branch_change=on_branch_change,
                                       device=device, fuse=fuse)
    x = _as_input(x0)
    lst = WengertList()
    xs = np.empty(x.shape[0], dtype=object)
    for i, v in enumerate(x):
        xs[i] = lst.variable(float(v))
    # strict is a flag on this recording's own list (not process-wide), set for the
    # duration of f: other threads' recordings keep their own setting
    _core._set_strict(lst, bool(strict))
    try:
        # a transform inside f records on lst (so it replays), above any forward level
        # open around this call (whose Traces f may close over: then f fails, as it should)
        with _levels.opened(_levels.LEVEL.get()[0], lst):
            y = f(xs)
    except ObjectArrayOperand:      # tensor operations: record f as a tensor program
        if chosen is False:
            raise
        return _recorded.record_tensor(f, x0, on_branch_change=on_branch_change,
                                       device=device, fuse=fuse)
    finally:
        _core._set_strict(lst, False)
    outputs, scalar = _output_records(lst, y)
    return Function(lst, [r.index for r in xs], [r.index for r in outputs], scalar=scalar,
                    f=f, on_branch_change=on_branch_change)


class Function(Compiling, Hessians, SparseJacobians, Devices, Rows):
    """A recorded function: evaluate it, its gradient, Jacobian and Hessian at new points.

    Made by ``ad.record(f, x0)`` (or ``ad.load(path)``). Every method takes one point
    ``x`` of shape (n,) or a batch of shape (B, n), and returns results for each row.

    Examples
    --------
    >>> import easyad as ad
    >>> F = ad.record(lambda x: [x[0] * x[1], x[0] + x[1]], [1.0, 2.0])
    >>> F.n_inputs, F.n_outputs
    (2, 2)
    >>> F.jacobian([3.0, 5.0])
    array([[5., 3.],
           [1., 1.]])
    """

    def __init__(self, tape: WengertList, inputs: Sequence[int], outputs: Sequence[int], *,
                 scalar: bool = True, f: Callable[..., Any] | None = None,
                 on_branch_change: str = "raise") -> None:
        if on_branch_change not in _BRANCH_MODES:
            raise ValueError(f"on_branch_change must be one of {_BRANCH_MODES}, "
                             f"got {on_branch_change!r}")
        inputs = _arrays.indices(inputs, "inputs")
        outputs = _arrays.indices(outputs, "outputs")
        if len(set(inputs)) != len(inputs):
            twice = next(i for i in inputs if inputs.count(i) > 1)
            raise ValueError(f"inputs names entry {twice} twice: each input of a Function is "
                             f"its own variable (one per element of x)")
        self._replayer = _core._Replayer(tape, inputs, outputs)
        # The Function owns its tape: hessian(), save() and to_dot() read it, so it is
        # frozen (clear() raises) rather than left to go stale under the Function.
        tape._freeze()
        self.tape = tape
        self.inputs = tuple(int(i) for i in inputs)
        self.outputs = tuple(int(i) for i in outputs)
        self.scalar = bool(scalar) and len(self.outputs) == 1
        self.f = f
        self.on_branch_change = on_branch_change
        self._native: Any = None    # the compiled program (Function.compile), or None
        self._hessian_calls = 0     # one-point Hessians so far (see hessian)
        self._compile_args: tuple[bool, bool] | None = None   # compile()'s, for pickles

    # compile, bind_gradient, compiled: recorded/compiling.py; hessian, hessian_pattern,
    # bind_hessian, hvp: recorded/hessians.py; the rows' machinery (_run): recorded/rows.py;
    # gradients on OpenCL: recorded/devices.py

    # ---- shape of the function ----
    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    def __len__(self) -> int:
        """Entries the replay runs (the whole recorded tape)."""
        return int(self._replayer.length)

    def __repr__(self) -> str:
        return (f"<Function of {self.n_inputs} inputs and {self.n_outputs} outputs, "
                f"{len(self)} entries>")

    # ---- evaluation ----
    def __call__(self, x: ArrayLike, *, on_branch_change: str | None = None) -> Any:
        """Values at x: a float (scalar f) or (m,), per row for a batch (a lazy dask array
        for a dask array x: ``easyad.distributed``)."""
        # an ndarray first: the one-point fast path pays for no other test (a dask array
        # is never an ndarray)
        if type(x) is np.ndarray:
            if on_branch_change is None and self.on_branch_change != "mask":
                native = self._native        # one point: one C call
                point = native.point(x, False) if native is not None else None
                if point is None:
                    point = self._replayer.point(x, False)
                if point is not None:
                    return float(point[0][0]) if self.scalar else point[0]
        elif is_dask_array(x):
            return distributed.batch(self, "__call__", x, None, on_branch_change)
        X, batch = self._rows(x)
        out, _, _, mask = self._run(_VALUE, X, on_branch_change, "__call__", ())
        return self._masked(self._shape_values(out, batch), mask, batch)

    # with on_branch_change="mask" each method returns (result, mask): hence -> Any
    def gradient(self, x: ArrayLike, *, on_branch_change: str | None = None,
                 device: Any = None, out: NDArray[np.float64] | None = None) -> Any:
        """The gradient (n,) of a scalar function at x; (B, n) for a batch.

        ``device="opencl"`` (or ``"opencl:N"``, a Device) evaluates every row in one
        OpenCL kernel generated from the optimised program (``compile(optimise=True)``'s;
        one work-item per point); branch changes are detected there too. Without it, the
        rows run in C on the CPU's cores. x may also be a float64 ``pyopencl.array.Array``
        (B, n), in either memory order (Fortran order, the transpose of an (n, B) array,
        reads coalesced): the kernel then runs on that array's queue and the gradient
        stays on the device, a ``pyopencl.array.Array`` (B, n) in Fortran order (its
        ``.T`` is the variable-major (n, B) array); only a 4-byte flag is read back
        (with ``on_branch_change="mask"`` the mask comes back as a numpy array).
        ``out``: a writable array of the result's shape to write it into (returned); for
        one point into native float64 this skips allocating (see also ``bind_gradient``);
        another dtype float64 casts into safely is written converted, others raise
        TypeError before anything runs (docs/conventions.md)."""
        # an ndarray first: the one-point fast path pays for no other test (a dask array
        # is never an ndarray)
        if type(x) is np.ndarray:
            if on_branch_change is None and self.on_branch_change != "mask":
                native = self._native
                if out is None:
                    if device is None and self.scalar:      # one point: one C call
                        point = native.point(x, True) if native is not None else None
                        if point is None:
                            point = self._replayer.point(x, True, False)
                        if point is not None:
                            return point[1]
                # C writes straight into out only where its gate finds x and out both
                # native float64 vectors of n (out writable): any other out is checked
                # below, then written converted once the result is complete
                elif type(out) is np.ndarray and (
                        native.gradient_into(x, out) if native is not None
                        else self._replayer.gradient_into(x, out)):
                    return out
        elif is_dask_array(x):
            if out is not None or device is not None:
                raise ValueError("out= and device= are for numpy batches, not a dask array "
                                 "(whose chunks run where dask's scheduler puts them)")
            return distributed.batch(self, "gradient", x, None, on_branch_change)
        if out is not None:
            _arrays.out_array(out, self._result_shape(x, (self.n_inputs,)))
            result = self.gradient(x, on_branch_change=on_branch_change, device=device)
            if isinstance(result, tuple):   # mask mode: (gradient, mask)
                return _arrays.write_out(out, result[0]), result[1]
            return _arrays.write_out(out, result)
        self._need_scalar("gradient")
        from easyad.compiler.tape.render_cl import is_device_array
        if is_device_array(x):
            return self._opencl_resident(x, device, on_branch_change)
        X, batch = self._rows(x)
        if device is not None and str(getattr(device, "kind", device)).startswith("opencl"):
            _, g, mask = self._opencl(X, device, on_branch_change)
            return self._masked(g if batch else g[0], mask, batch)
        _, jac, _, mask = self._run(_GRADIENT, X, on_branch_change, "gradient", ())
        g = jac[:, 0, :]
        return self._masked(g if batch else g[0], mask, batch)

    def value_and_gradient(self, x: ArrayLike, *, on_branch_change: str | None = None) -> Any:
        """``(F(x), F.gradient(x))`` from one forward and one reverse sweep."""
        if type(x) is np.ndarray:   # first: see gradient
            if on_branch_change is None and self.scalar and self.on_branch_change != "mask":
                native = self._native        # one point: one C call
                point = native.point(x, True) if native is not None else None
                if point is None:
                    point = self._replayer.point(x, True)
                if point is not None:
                    return float(point[0][0]), point[1]
        elif is_dask_array(x):
            return distributed.batch(self, "value_and_gradient", x, None, on_branch_change)
        self._need_scalar("value_and_gradient")
        X, batch = self._rows(x)
        out, jac, _, mask = self._run(_GRADIENT, X, on_branch_change, "value_and_gradient", ())
        g = jac[:, 0, :]
        result = (self._shape_values(out, batch), (g if batch else g[0]))
        return self._masked(result, mask, batch)

    def jacobian(self, x: ArrayLike, *, on_branch_change: str | None = None,
                 sparse: bool = False, format: str | None = None) -> Any:
        """The Jacobian (m, n) at x (one reverse sweep per output); (B, m, n) for a batch.

        ``sparse=True``: only the structurally non-zero entries (``jacobian_pattern()``),
        compressed by ``jacobian_colouring()`` and computed by the Jacobian's own
        program (or one sweep per colour): ``format`` "csr" (default), "csc", "coo"
        (scipy.sparse), "triplets" ((rows, cols, values)) or "values" ((nnz,) in the
        pattern's order); a list of matrices for a batch ((B, nnz) for "values").
        docs/sparse.md."""
        if sparse:
            return self._sparse_jacobian(x, on_branch_change, format)
        if format is not None:
            raise ValueError("format= is for sparse results: pass sparse=True too")
        X, batch = self._rows(x)
        _, jac, _, mask = self._run(_GRADIENT, X, on_branch_change, "jacobian", ())
        return self._masked(jac if batch else jac[0], mask, batch)

    # ---- persistence and pictures ----
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the Function to ``path``: a versioned .npz of plain arrays (no pickle
        inside) with a checksum; ``ad.load`` reads it back, validating every field."""
        files.save(self, path)

    def to_dot(self) -> str:
        """A Graphviz DOT picture of the tape with the recorded values and the adjoints of
        a backward sweep from the first output at the recording point."""
        from easyad.dot import to_dot
        d = self.tape._record_at(self.outputs[0]).derivatives()
        return to_dot(self.tape, derivatives=d, inputs=self.inputs, outputs=self.outputs)

    def __reduce__(self) -> tuple[Any, ...]:
        # f (for "retape") stays behind: functions often do not pickle. The tape carries
        # its own checksum; this one covers the rest.
        # A compiled Function travels as its tape and how it was compiled (not the shared
        # object): the receiving process compiles into its own private cache (or warns
        # once and runs the VM where it has no compiler).
        rest = (self.inputs, self.outputs, self.scalar, self.on_branch_change)
        state = (self.tape, *rest, _core._tape_digest((), rest))
        return (_rebuild_function, state if self._compile_args is None
                else (*state, self._compile_args))

    # ---- what needs record() or Function itself (the mixins sit below this module) ----
    def _retape(self, rows: NDArray[np.intp], X: NDArray[np.float64], method: str,
                extra: tuple[Any, ...], out: Any, jac: Any, second: Any) -> None:
        if self.f is None:
            raise BranchChangedError(
                "replay takes another branch at some rows and this Function has no f to "
                "record again (it was loaded or unpickled); use on_branch_change='mask'")
        for r in rows:
            G = record(self.f, X[r], on_branch_change="raise")
            o, j, s, _ = G._run(_SECOND if second is not None
                                else (_GRADIENT if jac is not None else _VALUE),
                             X[r:r + 1], "raise", method,
                             (extra[0][r:r + 1] if extra and extra[0].shape[0] > 1 else extra[0],)
                             if extra else ())
            out[r] = o[0]
            if jac is not None:
                jac[r] = j[0]
            if second is not None:
                second[r] = s[0]

    def _record_again(self, x: Any) -> None:
        """Record f anew at ``x`` and sweep it (anomaly mode names the failing line)."""
        assert self.f is not None
        F = record(self.f, x)
        F.tape._record_at(F.outputs[0]).derivatives()

    def _operands_at(self, x: NDArray[np.float64], entry: int) -> list[float]:
        """The values of an entry's two operands at the point x (for an error message: each
        one recorded operand replayed as the output of its own Function)."""
        read = _tapeview.entry(self.tape, entry)
        values = []
        for k in (0, 1):
            j = read.operand(k)
            if j < 0:
                values.append(read.constant(k))
                continue
            try:
                values.append(float(Function(self.tape, self.inputs, [j])(x)))
            except (ValueError, ArithmeticError):
                values.append(math.nan)
        return values


_DAMAGED = ("The data is damaged, or is not a saved easyad Function or a tape pickled by "
            "easyad")


def _rebuild_function(*state: Any) -> Function:
    """A Function from the data of __reduce__: (tape, inputs, outputs, scalar,
    on_branch_change[, checksum[, (optimise, hessian)]]), every field checked
    (TapeFormatError). Pickles of easyad before the checksum have 5 fields: only the
    checksum is skipped. The 7th, when there, says the Function was compiled: it is
    compiled again here, into this process's cache."""
    source = "pickled Function"
    if not 5 <= len(state) <= 7:
        raise TapeFormatError(f"{source}: 5 to 7 fields expected, got {len(state)}. "
                              f"{_DAMAGED}")
    compile_args = state[6] if len(state) > 6 else None
    if compile_args is not None and (type(compile_args) is not tuple or len(compile_args) != 2
                                     or any(type(a) is not bool for a in compile_args)):
        raise TapeFormatError(f"{source}: the compile options are {compile_args!r}, not "
                              f"(optimise, hessian) as two bools. {_DAMAGED}")
    tape, inputs, outputs, scalar, on_branch_change = state[:5]
    checksum = state[5] if len(state) > 5 else None
    if type(tape) is not WengertList:
        raise TapeFormatError(f"{source}: the tape is a {type(tape).__name__}, not a "
                              f"WengertList. {_DAMAGED}")
    function = _trusted_function(tape, inputs, outputs, scalar, on_branch_change, source)
    if checksum is not None and (type(checksum) is not int or checksum != _core._tape_digest(
            (), (inputs, outputs, scalar, on_branch_change))):
        raise TapeFormatError(f"{source}: the checksum {checksum!r} does not match the "
                              f"data. {_DAMAGED}")
    if compile_args is not None:
        function.compile(optimise=compile_args[0], hessian=compile_args[1])
    return function


def _trusted_function(tape: WengertList, inputs: Any, outputs: Any, scalar: Any,
                      on_branch_change: Any, source: str) -> Function:
    ins, outs = _core._validate_ends(tape, inputs, outputs, source)
    if type(scalar) not in (bool, np.bool_):
        raise TapeFormatError(f"{source}: scalar is {scalar!r}, not a bool. {_DAMAGED}")
    if type(on_branch_change) is not str or on_branch_change not in _BRANCH_MODES:
        raise TapeFormatError(f"{source}: on_branch_change is {on_branch_change!r}, not one "
                              f"of {_BRANCH_MODES}. {_DAMAGED}")
    return Function(tape, ins, outs, scalar=bool(scalar), on_branch_change=on_branch_change)


def load(path: str | os.PathLike[str]) -> Function:
    """Read a Function written by ``Function.save``: the safe way to read one from
    elsewhere. No pickle is involved (no code in the file runs); every field is checked,
    each entry in C (opcodes, operand indices, inputs, outputs), and the checksum must
    match. A file that fails raises ``ad.TapeFormatError`` saying what is wrong.

    Examples
    --------
    >>> import os, tempfile, easyad as ad
    >>> path = os.path.join(tempfile.mkdtemp(), "square.npz")
    >>> ad.record(lambda x: x[0] ** 2, [1.0]).save(path)
    >>> ad.load(path).gradient([3.0])
    array([6.])
    """
    return files.read(path, _trusted_function)


__all__ = ["Function", "record", "load"]

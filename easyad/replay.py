"""Record once, replay many: ``ad.record(f, x0)`` turns a function into a ``Function``.

The Function holds the WengertList recorded at ``x0`` with its inputs and outputs marked.
Evaluating it at new points runs the tape as a program in C (``_core._Replayer``): values,
gradients, Jacobians, Hessian-vector products and Hessians, for one point or a batch of
rows split over threads, with the GIL released. Sits above the compiled core; the
functional helpers (``ad.hessian``, ``ad.hvp``) build on it.

Comparisons made while recording are guards: a row whose branch would differ is detected,
and ``on_branch_change`` says what happens (raise, re-record f there, or mask the row).
"""
from __future__ import annotations

import math
import os
import threading
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _arrays, _core, _levels, _pool, _tapeview
from easyad._core import Record, Trace, WengertList
from easyad.anomaly import check_replay
from easyad.errors import BranchChangedError, PowDomainError, TapeFormatError

_VALUE, _GRADIENT, _SECOND = 0, 1, 2
_BRANCH_MODES = ("raise", "retape", "mask")
_FORMAT = "easyad.Function"
_FORMAT_VERSION = 2          # 2: with a checksum; 1 (no checksum) is still read
_READ_VERSIONS = (1, 2)
_ENTRY_FIELDS = (("values", "<f8"), ("partial0", "<f8"), ("partial1", "<f8"),
                 ("arg0", "<i4"), ("arg1", "<i4"), ("ops", "|u1"))
# rows x entries below which one thread does the whole batch (threads cost ~50 us to start)
_PARALLEL_WORK = 200_000
_HESSIAN_BLOCK = 16  # directions per forward-over-reverse sweep
_COMPILED_DENSE_HESSIAN = 64  # compile(hessian=True) without a sparse colouring: up to
                              # this many inputs (one sweep of n directions), else the VM

_CORES = _pool.CORES
_threads = _pool.threads


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


def _output_records(lst: WengertList, y: Any) -> tuple[list[Record], bool]:
    """The output Records of f and whether f returned a scalar."""
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


class Function:
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

    def compile(self, *, optimise: bool = False, hessian: bool = False) -> Function:
        """Compile this Function to native code; return it (now compiled).

        The recorded program, as the VM lays it out, is rendered to C as a straight-line
        program (values, then the adjoints in the VM's order, the rule table's math from
        ``_helpers.h``; affine runs as loops the compiler vectorises) and compiled with the
        C compiler found at run time (``$CC``, else the one Python was built with). The
        shared object is cached on disk (``$EASYAD_CACHE_DIR/compiled``, else
        ``~/.cache/easyad/compiled``: a private folder; a file is loaded only when its
        sha256 matches the one written beside it), keyed by a hash of the C source, its
        headers, the compiler and its flags, so a second process loads it without
        compiling.

        Values, gradients and ``value_and_gradient``, for one point or a batch (rows split
        over threads, without the GIL), then run the compiled code; with ``hessian=True``
        the one-point ``hessian`` and ``hvp`` too (the VM's forward-over-reverse sweep
        rendered to C in the same shared object, the Hessian's seed directions, from its
        sparsity colouring, compiled in; a longer compile). Jacobians of several outputs
        and batches of Hessians stay in the VM. Results are the VM's, bit for bit: a
        point where a guarded comparison comes out differently, or an entry fails (``log``
        of a negative number...), is handed to the VM, which raises, re-records or masks as
        ``on_branch_change`` says. Without a working compiler (or cache) this warns once
        (``ad.CompilerWarning``) and the VM goes on; a tape with user primitives
        (``ad.primitive``) is not compiled (silently: the VM runs it). ``F.compiled`` says
        whether compiled code is in use.

        With ``optimise=True`` the program is first optimised (constants folded, common
        subexpressions shared, exact identities such as ``x * 1``, dead entries dropped):
        values stay the same bit for bit, but gradients may differ from the VM's in the
        last bits, since adjoints are then summed in another order (a shared entry adds
        its consumers' adjoints before multiplying by its partials).

        Examples
        --------
        >>> import numpy as np, warnings, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1] + ad.sin(x[1]), [1.0, 2.0])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", ad.CompilerWarning)  # no compiler: the VM
        ...     F = F.compile()
        >>> F.gradient(np.array([3.0, 0.0]))
        array([ 0., 10.])
        """
        if self._native is None or (hessian and self.scalar
                                    and not self._native.second_order):
            from easyad.compiler import tape as tape_compiler
            seeds = None
            hvp = False
            if hessian and self.scalar:
                plan = self._hessian_plan()
                n = self.n_inputs
                if self._second() is not None:
                    # Hessians by the second-order program (compiled below); the sweeps
                    # compiled for the HVP alone (their Hessian is left to the VM)
                    hvp = True
                    self._native_map = (np.zeros(0, dtype=np.int64),) * 2
                elif plan is not None:
                    seeds, self._native_map = plan[3], (plan[4], plan[5])
                elif n <= _COMPILED_DENSE_HESSIAN:
                    seeds = np.eye(n)
                    every = np.arange(n * n, dtype=np.int64)
                    rows, cols = np.divmod(every, n)   # the upper triangle, mirrored
                    self._native_map = (every, np.minimum(rows, cols) * n
                                        + np.maximum(rows, cols))
            made = tape_compiler.native(self.tape, self.inputs, self.outputs,
                                        optimised=optimise, seeds=seeds, hvp=hvp)
            if made is not None or self._native is None:
                self._native = made
        if hessian and self.scalar and self._native is not None:
            self._hessian_calls += 1     # hessian() uses the program from the first call on
            second = self._second()      # the Hessian's own program, compiled too
            if second is not None and second[1] is None:
                from easyad.compiler import tape as tape_compiler
                tape, ins, outs = second[3]
                second[1] = tape_compiler.native(tape, tuple(ins), tuple(outs),
                                                 gradient=False)
        return self

    def bind_gradient(self, x: NDArray[np.float64], g: NDArray[np.float64],
                      value: NDArray[np.float64] | None = None) -> Callable[[], None]:
        """A call with no arguments that writes the gradient at the current contents of x
        into g (and the value into value[0]): arrays bound once, like CasADi's
        ``Function.buffer()``. For a compiled Function the call goes straight to the
        compiled code (no checks, no allocation, no Python in between); a point where a
        branch changes or an entry fails, anomaly mode, or a Function not compiled, goes
        through ``value_and_gradient`` (raising or re-recording as ``on_branch_change``
        says; "mask" writes NaN). x, g: C-contiguous, aligned, native float64 (n,), value
        (1,), none sharing memory (anything else raises here: bound arrays are not
        converted); keep them alive and write x in place (``x[:] = ...``) between calls.

        Examples
        --------
        >>> import numpy as np, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1], [1.0, 2.0])
        >>> x, g = np.array([3.0, 1.0]), np.empty(2)
        >>> call = F.bind_gradient(x, g)
        >>> call(); g
        array([6., 9.])
        >>> x[:] = [1.0, 1.0]; call(); g
        array([2., 1.])
        """
        self._need_scalar("bind_gradient")
        _arrays.bound_array(x, self.n_inputs, "x", writable=False)
        _arrays.bound_array(g, self.n_inputs, "g", writable=True)
        if value is not None:
            _arrays.bound_array(value, 1, "value", writable=True)

        def fallback() -> None:
            result = self.value_and_gradient(x)
            if self.on_branch_change == "mask":
                result = result[0]
            if value is not None:
                value[0] = result[0]
            g[:] = result[1]

        return _core._BoundGradient(self._native, x, g, value, fallback, self._replayer)

    @property
    def compiled(self) -> bool:
        """Whether values and gradients run compiled code (see ``compile``)."""
        return self._native is not None

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
        """Values at x: a float (scalar f) or (m,), per row for a batch."""
        if on_branch_change is None and self.on_branch_change != "mask" \
                and type(x) is np.ndarray:  # one point: one C call
            point = self._native.point(x, False) if self._native is not None else None
            if point is None:
                point = self._replayer.point(x, False)
            if point is not None:
                return float(point[0][0]) if self.scalar else point[0]
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
        if out is not None:
            # C writes straight into out only where its gate finds x and out both native
            # float64 vectors of n (out writable): any other out is checked, then written
            # converted once the result is complete
            if on_branch_change is None and self.on_branch_change != "mask" \
                    and type(x) is np.ndarray and type(out) is np.ndarray \
                    and (self._native.gradient_into(x, out) if self._native is not None
                         else self._replayer.gradient_into(x, out)):
                return out
            _arrays.out_array(out, self._result_shape(x, (self.n_inputs,)))
            result = self.gradient(x, on_branch_change=on_branch_change, device=device)
            if isinstance(result, tuple):   # mask mode: (gradient, mask)
                return _arrays.write_out(out, result[0]), result[1]
            return _arrays.write_out(out, result)
        if device is None and on_branch_change is None and self.on_branch_change != "mask" \
                and self.scalar and type(x) is np.ndarray:  # one point: one C call
            point = self._native.point(x, True) if self._native is not None else None
            if point is None:
                point = self._replayer.point(x, True, False)
            if point is not None:
                return point[1]
        self._need_scalar("gradient")
        from easyad.tensor._replay_cl import is_device_array
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
        if on_branch_change is None and self.on_branch_change != "mask" \
                and self.scalar and type(x) is np.ndarray:  # one point: one C call
            point = self._native.point(x, True) if self._native is not None else None
            if point is None:
                point = self._replayer.point(x, True)
            if point is not None:
                return float(point[0][0]), point[1]
        self._need_scalar("value_and_gradient")
        X, batch = self._rows(x)
        out, jac, _, mask = self._run(_GRADIENT, X, on_branch_change, "value_and_gradient", ())
        g = jac[:, 0, :]
        result = (self._shape_values(out, batch), (g if batch else g[0]))
        return self._masked(result, mask, batch)

    def jacobian(self, x: ArrayLike, *, on_branch_change: str | None = None) -> Any:
        """The Jacobian (m, n) at x (one reverse sweep per output); (B, m, n) for a batch."""
        X, batch = self._rows(x)
        _, jac, _, mask = self._run(_GRADIENT, X, on_branch_change, "jacobian", ())
        return self._masked(jac if batch else jac[0], mask, batch)

    def hessian(self, x: ArrayLike, *, on_branch_change: str | None = None,
                sparse: bool = False, out: NDArray[np.float64] | None = None) -> Any:
        """The Hessian (n, n) of a scalar function at x; (B, n, n) for a batch.

        ``sparse=True``: only the structurally non-zero entries, (nnz,) ((B, nnz) for a
        batch), in the order of ``hessian_pattern()`` (rows, then columns: for a
        symmetric matrix the order of CasADi's column-major nonzeros too). ``out``: an
        array of the result's shape to write it into (returned; with ``sparse=True`` at one
        point, no allocation at all).

        One point is computed, from the second one-point call on (or after
        ``bind_hessian`` or ``compile(hessian=True)``), by the Hessian's own program
        (``second_order_program`` in easyad/compiler/tape/second_order.py:
        forward-over-reverse done once, symbolically, simplified, over the nonzeros only;
        compiled by ``compile(hessian=True)``); the first call, batches, a point where
        that program flags something or gives a non-finite entry, and functions it cannot
        express (selects, abs, maximum, minimum, user primitives), by forward-over-reverse
        sweeps (blocks of directions per sweep). The two do the same operations in the same
        order: every route gives the same numbers (NaN and infinities too; the sign of a
        zero aside), and the same symmetric matrix (``H[c, r]`` is ``H[r, c]``, r <= c)."""
        self._need_scalar("hessian")
        if on_branch_change is None and self.on_branch_change != "mask" \
                and type(x) is np.ndarray:      # one point: the second-order program
            # built from the second one-point call on (a one-off Hessian, ad.hessian,
            # costs less by the sweeps than building the program)
            second = self._second() if self._hessian_calls else None
            self._hessian_calls += 1
            if second is not None:
                program, native, target, _, source = second
                # C writes into out only where its gate finds it a native float64 vector
                # of nnz, writable; any other out is checked below, then written converted
                into = out if sparse and type(out) is np.ndarray else None
                where = None if sparse else target
                H1 = native.second_point(x, source, where, into) if native is not None \
                    else None
                if H1 is None:
                    H1 = program.second_point(x, source, where, into)
                if H1 is not None:
                    if out is not None and H1 is not out:
                        _arrays.out_array(out, self._hessian_shape(sparse))
                        return _arrays.write_out(out, H1)
                    return H1
        if out is not None:         # checked before the sweeps run
            _arrays.out_array(out, self._result_shape(x, self._hessian_shape(sparse)))
        result = self._hessian_dense(x, on_branch_change)
        if sparse:
            rows, cols = self.hessian_pattern()
            if isinstance(result, tuple):
                result = (result[0][..., rows, cols], result[1])
            else:
                result = result[..., rows, cols]
        if out is not None:
            if isinstance(result, tuple):
                return _arrays.write_out(out, result[0]), result[1]
            return _arrays.write_out(out, result)
        return result

    def _hessian_shape(self, sparse: bool) -> tuple[int, ...]:
        """The shape of one point's Hessian: (nnz,) sparse, else (n, n)."""
        n = self.n_inputs
        return (len(self._pattern()[0]),) if sparse else (n, n)

    def hessian_pattern(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """(rows, cols) of the Hessian's structurally non-zero entries, row by row (every
        entry where the sparsity is not found): the order of ``hessian(x, sparse=True)``."""
        rows, cols, _ = self._pattern()
        return rows.copy(), cols.copy()

    def _pattern(self) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
        """(rows, cols, colour of each column), found once."""
        if not hasattr(self, "_pattern_cache"):
            from easyad import _sparsity
            n = self.n_inputs
            pattern = _sparsity.hessian_pattern(self.tape._arrays(), self.inputs,
                                                self.outputs[0])
            if pattern is None:      # dense: every entry, one colour per column
                rows, cols = np.divmod(np.arange(n * n, dtype=np.intp), n)
                colour = np.arange(n, dtype=np.intp)
            else:
                rows, cols = pattern
                colour = _sparsity.colour_columns(n, rows, cols)
            self._pattern_cache = (rows, cols, colour)
        return self._pattern_cache

    def bind_hessian(self, x: NDArray[np.float64], h: NDArray[np.float64]
                     ) -> Callable[[], None]:
        """A call with no arguments that writes the Hessian's nonzeros at the current
        contents of x into h (the order of ``hessian_pattern()``, as
        ``hessian(x, sparse=True)``): arrays bound once, like CasADi's
        ``Function.buffer()``. The call runs the Hessian's own program (compiled by
        ``compile(hessian=True)``, else in the VM) straight from C; a point it flags (a
        changed branch, a failed entry), a nonzero that is not finite there, anomaly mode,
        or a function that program cannot express, goes through ``hessian`` (which raises,
        re-records or masks as ``on_branch_change`` says; "mask" writes NaN). x: C-contiguous,
        aligned, native float64 (n,), h (nnz,) writable, not sharing memory (anything else
        raises here); write x in place between calls.

        Examples
        --------
        >>> import numpy as np, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1], [1.0, 2.0])
        >>> x, h = np.array([3.0, 1.0]), np.empty(4)
        >>> F.hessian_pattern()
        (array([0, 0, 1, 1]), array([0, 1, 0, 1]))
        >>> call = F.bind_hessian(x, h)
        >>> call(); h
        array([2., 6., 6., 0.])
        """
        self._need_scalar("bind_hessian")
        _arrays.bound_array(x, self.n_inputs, "x", writable=False)
        _arrays.bound_array(h, len(self._pattern()[0]), "h", writable=True)

        def fallback() -> None:
            result = self.hessian(x, sparse=True)
            h[:] = result[0] if isinstance(result, tuple) else result

        second = self._second()
        self._hessian_calls += 1         # hessian() now uses the program too
        if second is None:
            return fallback
        return _core._BoundSecond(second[1], second[0], x, h, second[4], fallback)

    def _second(self) -> list[Any] | None:
        """[VM of the second-order program, its compiled code or None, flat indices of the
        nonzeros (int64), (tape, inputs, outputs), the output of each nonzero (int64)],
        built once; None where there is none."""
        if not hasattr(self, "_second_cache"):
            from easyad.compiler import tape as tape_compiler
            made = None
            if not self.tape._customs_count():
                rows, cols, colour = self._pattern()
                order = self._replayer._layout()["original"]   # the sweeps' order
                program = tape_compiler.second_order_program(
                    self.tape, self.inputs, self.outputs[0], rows, cols, colour, order)
                if program is not None:
                    # the program computes the upper triangle: H[r, c] is output k of the
                    # k-th (r <= c) pair, H[c, r] the same
                    upper = rows <= cols
                    number = np.full(self.n_inputs * self.n_inputs, -1, dtype=np.int64)
                    number[(rows * self.n_inputs + cols)[upper]] = np.arange(int(upper.sum()))
                    source = number[np.minimum(rows, cols) * self.n_inputs
                                    + np.maximum(rows, cols)]
                    made = [_core._Replayer(*program), None,
                            (rows * self.n_inputs + cols).astype(np.int64), program,
                            np.ascontiguousarray(source, dtype=np.int64)]
            self._second_cache = made
        return self._second_cache

    def _hessian_dense(self, x: ArrayLike, on_branch_change: str | None) -> Any:
        """The Hessian by the sweeps (see hessian)."""
        plan = self._hessian_plan()
        native = self._native
        if native is not None and native.second_order and on_branch_change is None \
                and self.on_branch_change != "mask" and type(x) is np.ndarray:
            H1 = native.hessian_point(x, *self._native_map)   # compiled (hessian=True)
            if H1 is not None:
                return H1
        if plan is not None and on_branch_change is None and self.on_branch_change != "mask" \
                and type(x) is np.ndarray:  # one point: one C call
            H1 = self._replayer.hessian_point(x, plan[3], plan[4], plan[5])
            if H1 is not None:
                return H1
        X, batch = self._rows(x)
        n = self.n_inputs
        if plan is None:  # dense: every direction, in blocks
            H = np.empty((X.shape[0], n, n))
            mask = None
            for start in range(0, n, _HESSIAN_BLOCK):
                stop = min(n, start + _HESSIAN_BLOCK)
                seeds = np.zeros((1, n, stop - start))
                seeds[0, np.arange(start, stop), np.arange(stop - start)] = 1.0
                _, _, H[:, :, start:stop], mask = self._run(_SECOND, X, on_branch_change,
                                                             "hessian", (seeds,))
            below = np.tril_indices(n, -1)    # the upper triangle, mirrored (see _plan)
            H[:, below[0], below[1]] = H[:, below[1], below[0]]
            return self._masked(H if batch else H[0], mask, batch)
        # sparse: one sweep direction per colour of columns, then direct recovery
        seeds, target, source = plan[:3]
        _, _, compressed, mask = self._run(_SECOND, X, on_branch_change, "hessian", (seeds,))
        B = X.shape[0]
        H = np.zeros((B, n, n))
        H.reshape(B, n * n)[:, target] = compressed.reshape(B, -1)[:, source]
        if mask is not None:
            H[mask] = np.nan
        return self._masked(H if batch else H[0], mask, batch)

    def _hessian_plan(self) -> tuple[Any, ...] | None:
        """The Hessian's sparsity and column colouring, found once (None: go dense)."""
        if not hasattr(self, "_plan"):
            from easyad import _sparsity
            n = self.n_inputs
            pattern = _sparsity.hessian_pattern(self.tape._arrays(), self.inputs,
                                                self.outputs[0])
            plan = None
            if pattern is not None:
                rows, cols = pattern
                colour = _sparsity.colour_columns(n, rows, cols)
                colours = int(colour.max()) + 1 if n else 0
                if colours < n:
                    seeds = np.zeros((1, n, colours))
                    seeds[0, np.arange(n), colour] = 1.0
                    # H[r, c] is entry (r, colour[c]) of the compressed H @ seeds, taken
                    # from the upper triangle (r <= c) for both (r, c) and (c, r): the
                    # two sweeps round (and overflow) differently, the Hessian is
                    # symmetric, and the second-order program computes that triangle
                    # too, with the same operations. The last three: the same, as the
                    # one-point C path takes them
                    low, high = np.minimum(rows, cols), np.maximum(rows, cols)
                    target, source = rows * n + cols, low * colours + colour[high]
                    plan = (seeds, target, source, np.ascontiguousarray(seeds[0]),
                            target.astype(np.int64), source.astype(np.int64))
            self._plan = plan
        return self._plan

    def hvp(self, x: ArrayLike, v: ArrayLike, *, on_branch_change: str | None = None) -> Any:
        """The Hessian-vector product H(x) v without forming H (one sweep); v is (n,) or
        one direction per row (B, n)."""
        native = self._native
        if native is not None and native.second_order and type(x) is np.ndarray \
                and type(v) is np.ndarray and on_branch_change is None \
                and self.on_branch_change != "mask":   # one point, compiled: one C call
            product = native.hvp_point(x, v)
            if product is not None:
                return product
        self._need_scalar("hvp")
        X, batch = self._rows(x)
        V = _arrays.real_array(v, "v")
        if V.shape not in ((self.n_inputs,), (X.shape[0], self.n_inputs)):
            raise ValueError(f"v must have shape ({self.n_inputs},) or "
                             f"({X.shape[0]}, {self.n_inputs}), got {V.shape}")
        seeds = np.ascontiguousarray(V.reshape(-1, self.n_inputs, 1))
        _, _, second, mask = self._run(_SECOND, X, on_branch_change, "hvp", (seeds,))
        out = second[:, :, 0]
        return self._masked(out if batch else out[0], mask, batch)

    # ---- persistence and pictures ----
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the Function to ``path``: a versioned .npz of plain arrays (no pickle
        inside) with a checksum; ``ad.load`` reads it back, validating every field."""
        if self.tape._customs_count():
            raise TypeError("a Function with user-defined primitives cannot be saved to "
                            ".npz; pickle it instead (primitives pickle by reference)")
        arrays = self.tape._arrays()
        names = self.tape._names_dict()
        content: dict[str, Any] = dict(
            format=np.array(_FORMAT), version=np.array(_FORMAT_VERSION, dtype=np.int64),
            inputs=np.array(self.inputs, dtype=np.int64),
            outputs=np.array(self.outputs, dtype=np.int64),
            scalar=np.array(self.scalar), on_branch_change=np.array(self.on_branch_change),
            name_indices=np.array(list(names), dtype=np.int64),
            name_values=np.array(list(names.values()), dtype=str), **arrays)
        content["checksum"] = np.array(_file_digest(content), dtype=np.int64)
        np.savez(path, **content)

    def to_dot(self) -> str:
        """A Graphviz DOT picture of the tape with the recorded values and the adjoints of
        a backward sweep from the first output at the recording point."""
        from easyad.dot import to_dot
        d = self.tape._record_at(self.outputs[0]).derivatives()
        return to_dot(self.tape, derivatives=d, inputs=self.inputs, outputs=self.outputs)

    def __reduce__(self) -> tuple[Any, ...]:
        # f (for "retape") stays behind: functions often do not pickle. The tape carries
        # its own checksum; this one covers the rest.
        rest = (self.inputs, self.outputs, self.scalar, self.on_branch_change)
        return (_rebuild_function, (self.tape, *rest, _core._tape_digest((), rest)))

    # ---- internals ----
    def _cl_kernel(self, device: Any) -> Any:
        """The OpenCL replay kernel for device (rendered and built once per device and
        kept), from the optimised program (``easyad.compiler.tape.optimise``; the tape
        itself where that declines: user primitives, tensor nodes)."""
        from easyad.compiler import tape as tape_compiler
        from easyad.tensor._replay_cl import ReplayKernel
        kernels = self.__dict__.setdefault("_cl_kernels", {})
        key = str(device)
        if key not in kernels:
            made = tape_compiler.optimise(self.tape, self.inputs, self.outputs)
            tape, ins, outs = made if made is not None else (self.tape, self.inputs,
                                                             self.outputs)
            kernels[key] = ReplayKernel(tape._arrays(), ins, outs[0], device)
        return kernels[key]

    def _branch_mode(self, mode: str | None) -> str:
        mode = self.on_branch_change if mode is None else mode
        if mode not in _BRANCH_MODES:
            raise ValueError(f"on_branch_change must be one of {_BRANCH_MODES}, got {mode!r}")
        return mode

    def _opencl(self, X: NDArray[np.float64], device: Any, mode: str | None
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_] | None]:
        """Values and gradients of every row by the generated OpenCL kernel, with the same
        branch handling as the C replay."""
        mode = self._branch_mode(mode)
        values, grads, changed = self._cl_kernel(device)(X)
        mask = changed if mode == "mask" else None
        if changed.any():
            rows = np.flatnonzero(changed)
            self._changed_rows(X, rows, mode)
            if mode == "retape":
                values[rows], grads[rows] = self.value_and_gradient(
                    X[rows], on_branch_change="retape")
            else:
                values[rows] = np.nan
                grads[rows] = np.nan
        return values, grads, mask

    def _opencl_resident(self, X: Any, device: Any, mode: str | None) -> Any:
        """``gradient`` of a device array X: the results stay on the device (see
        ``gradient``); only rows whose branch changed travel, and only for "raise" (one
        row, to name the guard) and "retape" (re-recorded on the host, written back)."""
        mode = self._branch_mode(mode)
        if device is not None and not str(getattr(device, "kind", device)).startswith(
                "opencl"):
            raise ValueError(f"a pyopencl array is replayed on OpenCL, not on {device!r}")
        kernel = self._cl_kernel("opencl" if device is None else device)
        _, grads, changed, any_changed = kernel.run(X, nan_on_change=mode == "mask")
        G = grads.T if X.ndim == 2 else grads.reshape(grads.shape[0])
        if mode == "mask":
            mask = changed.get().astype(bool)
            return (G, mask) if X.ndim == 2 else (G, bool(mask[0]))
        if any_changed:
            rows = np.flatnonzero(changed.get())
            host = X.get() if X.flags.forc else X.copy().get()
            host = host.reshape(-1, self.n_inputs)
            self._changed_rows(host, rows, mode)
            fixed = grads.get()
            fixed[:, rows] = self.gradient(host[rows], on_branch_change="retape").T
            grads.set(fixed)
        return G

    def _changed_rows(self, X: NDArray[np.float64], rows: NDArray[np.intp], mode: str) -> None:
        # the rows of X whose branch changed on OpenCL: "raise" names the guard by the VM
        if mode == "raise":
            self._run(_VALUE, X[rows[:1]], "raise", "gradient", ())
            raise BranchChangedError(f"replaying at row {int(rows[0])} takes another "
                                     f"branch than recorded")

    def _need_scalar(self, what: str) -> None:
        if not self.scalar:
            raise ValueError(f"{what} needs a scalar function; this one has "
                             f"{self.n_outputs} outputs: use jacobian()")

    def _rows(self, x: ArrayLike) -> tuple[NDArray[np.float64], bool]:
        X = _arrays.real_array(x, "x")
        n = self.n_inputs
        if X.ndim == 1 and X.shape[0] == n:
            return X[None, :], False
        if X.ndim == 2 and X.shape[1] == n:
            return X, True
        raise ValueError(f"x must have shape ({n},) or (B, {n}) for this Function of {n} "
                         f"inputs, got {X.shape}")

    def _result_shape(self, x: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of a result of ``shape`` per point at x: one point, or a batch
        (for checking ``out=`` before anything is computed)."""
        given = x.shape if hasattr(x, "shape") else np.shape(x)   # (a device array too)
        return (int(given[0]),) + shape if len(given) == 2 else shape

    @staticmethod
    def _masked(result: Any, mask: NDArray[np.bool_] | None, batch: bool) -> Any:
        # on_branch_change="mask": (result, which rows changed branch; their results are NaN)
        if mask is None:
            return result
        return result, (mask if batch else bool(mask[0]))

    def _shape_values(self, out: NDArray[np.float64], batch: bool) -> Any:
        if self.scalar:
            return out[:, 0] if batch else float(out[0, 0])
        return out if batch else out[0]

    def _run(self, what: int, X: NDArray[np.float64], mode: str | None, method: str,
             extra: tuple[Any, ...]) -> tuple[Any, Any, Any, NDArray[np.bool_] | None]:
        mode = self.on_branch_change if mode is None else mode
        if mode not in _BRANCH_MODES:
            raise ValueError(f"on_branch_change must be one of {_BRANCH_MODES}, got {mode!r}")
        B, n, m = X.shape[0], self.n_inputs, self.n_outputs
        if self._native is not None and (what == _VALUE or (what == _GRADIENT and m == 1)):
            # gradients alone (gradient, jacobian): no values, so the sums only they read
            # are skipped
            done = self._run_native(what == _GRADIENT, X, method != "value_and_gradient")
            if done is not None:
                return (*done, (np.zeros(B, dtype=bool) if mode == "mask" else None))
        out = np.empty((B, m))
        jac = np.empty((B, m if what == _GRADIENT else 1, n)) if what != _VALUE else None
        second = seeds = None
        if what == _SECOND:
            seeds = np.ascontiguousarray(extra[0])
            second = np.empty((B, n, seeds.shape[2]))
        # the sweeps fill these for every row (status_entry only where status is set)
        changed = np.empty(B, dtype=np.uint8)
        guard = np.empty(B, dtype=np.int32)
        status = np.empty(B, dtype=np.int32)
        status_entry = np.empty(B, dtype=np.int32)
        args = (what, X, out, jac, second, seeds, changed, guard, status, status_entry)
        work = B * max(1, len(self)) * (1 + (seeds.shape[2] if seeds is not None else 0))
        workers = min(_CORES, B)
        if workers > 1 and work >= _PARALLEL_WORK:
            # rows claimed in chunks from a shared counter, and this thread works too: a
            # helper that is slow to wake (an idle vCPU) or slowed by the machine takes
            # fewer rows, rather than the batch waiting for its fixed share
            claim = np.zeros(1, dtype=np.int64)
            chunk = max(1, min(64, B // (workers * 16)))   # small: the last chunk is the tail
            run: Callable[..., tuple[int, int]] = self._replayer.run
            futures = [_threads().submit(run, *args, 0, B, claim, chunk)
                       for _ in range(workers - 1)]
            firsts = [run(*args, 0, B, claim, chunk)]
            firsts += [future.result() for future in futures]
            bad = min((e for e, _ in firsts if e >= 0), default=-1)
            first_changed = min((c for _, c in firsts if c >= 0), default=-1)
        else:
            bad, first_changed = self._replayer.run(*args, 0, B)
        if bad >= 0:
            self._raise_status(X, bad, int(status[bad]), int(status_entry[bad]))
        if _core._anomaly_enabled():
            check_replay(X, [out, jac, second],
                         None if self.f is None else self._record_again)
        mask = changed.astype(bool) if mode == "mask" else None
        if first_changed >= 0:
            rows = np.flatnonzero(changed)
            if mode == "raise":
                raise BranchChangedError(self._branch_message(X, int(rows[0]), int(guard[rows[0]])))
            if mode == "retape":
                self._retape(rows, X, method, extra, out, jac, second)
            else:
                for array in (out, jac, second):
                    if array is not None:
                        array[rows] = np.nan
        return out, jac, second, mask

    def _run_native(self, gradient: bool, X: NDArray[np.float64], alone: bool = False
                    ) -> tuple[Any, Any, None] | None:
        """Values (and gradients) of every row by the compiled code, rows split over the
        threads in chunks; None when a row is flagged (a changed branch, a failed entry) or
        in anomaly mode: then the VM does the whole call, as it would have."""
        if _core._anomaly_enabled():
            return None
        B, n, m = X.shape[0], self.n_inputs, self.n_outputs
        out = None if gradient and alone else np.empty((B, m))   # alone: no values
        jac = np.empty((B, 1, n)) if gradient else None
        G = jac.reshape(B, n) if jac is not None else None
        flags = np.empty(B, dtype=np.uint8)
        rows = self._native.rows
        workers = min(_CORES, B)
        if workers > 1 and B * max(1, len(self)) >= _PARALLEL_WORK:
            # chunks claimed from a shared counter; this thread works too (see _run)
            chunk = max(1, min(1024, B // (workers * 8)))
            starts = iter(range(0, B, chunk))
            lock = threading.Lock()

            def work() -> int:
                bad = 0
                while True:
                    with lock:
                        r0 = next(starts, -1)
                    if r0 < 0:
                        return bad
                    got = rows(gradient, X, out, G, flags, r0, min(B, r0 + chunk))
                    if got < 0:
                        raise MemoryError("cannot allocate the compiled replay's work space")
                    bad += got

            futures = [_threads().submit(work) for _ in range(workers - 1)]
            bad = work() + sum(future.result() for future in futures)
        else:
            bad = rows(gradient, X, out, G, flags, 0, B)
        if bad < 0:
            raise MemoryError("cannot allocate the compiled replay's work space")
        return None if bad else (out, jac, None)

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

    def _describe(self, index: int) -> str:
        name = self.tape._names_dict().get(index)
        if name is not None:
            return repr(name)
        if index in self.inputs:
            return f"x[{self.inputs.index(index)}]"
        return f"entry {index} ({_tapeview.entry(self.tape, index).name})"

    def _branch_message(self, X: NDArray[np.float64], row: int, entry: int) -> str:
        guard = _tapeview.entry(self.tape, entry)
        symbol = guard.symbol
        sides = []
        for k in (0, 1):
            j = guard.operand(k)
            sides.append(self._describe(j) if j >= 0 else repr(guard.constant(k)))
        was = bool(guard.value)
        return (f"replaying at row {row} (x = {X[row].tolist()}) takes another branch than "
                f"recorded: the comparison {sides[0]} {symbol} {sides[1]} (entry {entry}) was "
                f"{was} when recorded and is {not was} there. Derivatives of the recorded "
                f"branch would be wrong. Pass on_branch_change='retape' to record f again at "
                f"such points, or 'mask' to get NaN rows and a mask; or write the branch "
                f"with ad.where(cond, a, b), which replay follows.")

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

    def _raise_status(self, X: NDArray[np.float64], row: int, code: int, entry: int) -> None:
        where = f"in {self._describe(entry)} replaying row {row} (x = {X[row].tolist()})"
        if code == 1:
            raise ValueError(f"math domain error {where}")
        if code == 2:
            raise OverflowError(f"math range error {where}")
        if code == 3:
            raise ZeroDivisionError(f"division by zero {where}")
        if code == 4:
            raise ValueError(f"negative number raised to a fractional power {where}")
        if code == 7:    # EASYAD_ZERO_POWER: the same error as the recording raised
            base, exponent = self._operands_at(X[row], entry)
            raise PowDomainError(base, exponent, where=f" {where}")
        if code == 5:
            primitive = self.tape._custom(entry)
            raise ValueError(f"the user primitive {primitive.name!r} has no second "
                             f"derivative (d2f), which Hessians need; pass d2f= to "
                             f"ad.define or ad.primitive")
        errors = _core._custom_errors
        error = errors[-1] if errors else None
        errors.clear()
        raise RuntimeError(f"a user primitive raised {where}") from error


_DAMAGED = ("The data is damaged, or is not a saved easyad Function or a tape pickled by "
            "easyad")


def _rebuild_function(*state: Any) -> Function:
    """A Function from the data of __reduce__: (tape, inputs, outputs, scalar,
    on_branch_change[, checksum]), every field checked (TapeFormatError). Pickles of
    easyad before the checksum have 5 fields: only the checksum is skipped."""
    source = "pickled Function"
    if not 5 <= len(state) <= 6:
        raise TapeFormatError(f"{source}: 5 or 6 fields expected, got {len(state)}. "
                              f"{_DAMAGED}")
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


def _file_digest(content: dict[str, Any]) -> int:
    """The checksum of a saved Function: its entry arrays and the rest of its fields."""
    parts = [content[key].tobytes() for key, _ in _ENTRY_FIELDS]
    rest = (content["inputs"].tolist(), content["outputs"].tolist(),
            bool(content["scalar"]), str(content["on_branch_change"]),
            content["name_indices"].tolist(), content["name_values"].tolist())
    result: int = _core._tape_digest(parts, rest)
    return result


# what a saved Function holds: name -> (numpy dtype kind(s), number of dimensions)
_FIELDS = {
    "format": ("U", 0), "version": ("iu", 0), "inputs": ("i", 1), "outputs": ("i", 1),
    "scalar": ("b", 0), "on_branch_change": ("U", 0), "name_indices": ("i", 1),
    "name_values": ("U", 1), **{key: ("", 1) for key, _ in _ENTRY_FIELDS},
}
_MAX_HEADER = 10_000
# A deflated member may expand at most this many times (Function.save stores its arrays
# uncompressed; np.savez_compressed of a real tape stays far below): a larger claim is
# damage or a zip bomb, refused before anything is decompressed.
_MAX_EXPANSION = 64


def _read_npy(archive: zipfile.ZipFile, key: str, problem: Callable[[str], Exception],
              size: int, budget: list[int]) -> NDArray[Any]:
    """One array of the archive, parsed without pickle and without trusting its header.
    Every size is checked before memory is taken for it: the member's declared size
    against the file's (``budget``: bytes all members may still expand to), then the
    shape the .npy header states against the member's size; only then is the payload
    read (zipfile checks its CRC-32 at the end)."""
    try:
        info = archive.getinfo(key + ".npy")
    except KeyError:
        raise problem(f"the field {key!r} is missing") from None
    stored = info.compress_type == zipfile.ZIP_STORED
    if info.compress_size > size or info.file_size > budget[0] or (
            stored and info.file_size != info.compress_size) or (
            not stored and info.file_size > _MAX_EXPANSION * info.compress_size + 4096):
        raise problem(f"the field {key!r} claims {info.file_size} bytes in "
                      f"{info.compress_size} (the file has {size}); more than a saved "
                      f"Function holds")
    budget[0] -= info.file_size
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                member, max_header_size=_MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                member, max_header_size=_MAX_HEADER)
        else:
            raise problem(f"the field {key!r} is in .npy format {version}")
        if dtype.hasobject:
            raise problem(f"the field {key!r} holds Python objects (dtype {dtype})")
        count = math.prod(shape)
        payload = info.file_size - member.tell()    # (the header's end, decompressed)
        if count * dtype.itemsize != payload:
            raise problem(f"the field {key!r} states shape {shape} of {dtype}, "
                          f"{count * dtype.itemsize} bytes, but holds {payload}")
        data = member.read(payload + 1)     # one more: a member longer than declared
        if len(data) != payload:
            raise problem(f"the field {key!r} holds {len(data)} bytes, not {payload}")
        member.read()                       # to the end: zipfile checks the CRC-32 there
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran else "C")


def _read_members(archive: zipfile.ZipFile, problem: Callable[[str], TapeFormatError],
                  size: int) -> dict[str, NDArray[Any]]:
    """The fields of a saved Function, each read by ``_read_npy`` within one budget: all
    members together may expand to at most ``_MAX_EXPANSION`` times the file."""
    budget = [_MAX_EXPANSION * size + 65536]
    try:
        with archive:
            names = archive.namelist()
            if "format.npy" not in names:
                raise problem("it has no 'format' field")
            data = {key: _read_npy(archive, key, problem, size, budget) for key in _FIELDS}
            if "checksum.npy" in names:
                data["checksum"] = _read_npy(archive, "checksum", problem, size, budget)
    except TapeFormatError:
        raise
    except Exception as error:  # zipfile, zlib and numpy's header parser: all are damage
        raise problem(f"it cannot be read as .npz ({type(error).__name__}: {error})") from error
    return data


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
    source = f"{os.fspath(path)!r}"

    def problem(text: str) -> TapeFormatError:
        return TapeFormatError(f"{source}: {text}. The file is damaged, or is not a saved "
                               f"easyad Function (Function.save writes one)")

    # the file is read member by member (never whole), each checked before it is read
    with open(path, "rb") as handle:    # a missing file is FileNotFoundError, as usual
        size = os.fstat(handle.fileno()).st_size
        try:
            archive = zipfile.ZipFile(handle)
        except Exception as error:
            raise problem(f"it cannot be read as .npz ({type(error).__name__}: "
                          f"{error})") from error
        data = _read_members(archive, problem, size)

    version = data["version"]
    if version.ndim or version.dtype.kind not in "iu":
        raise problem(f"its version is {version.tolist()!r} ({version.dtype}), not an "
                      f"integer: this easyad reads versions "
                      f"{' and '.join(map(str, _READ_VERSIONS))}")
    for key, (kinds, ndim) in _FIELDS.items():
        array = data[key]
        if array.ndim != ndim or (kinds and array.dtype.kind not in kinds):
            raise problem(f"the field {key!r} is {array.dtype} of shape {array.shape}")
    if str(data["format"]) != _FORMAT:
        raise problem(f"its format is {str(data['format'])!r}, not {_FORMAT!r}")
    version_number = int(data["version"])
    if version_number not in _READ_VERSIONS:
        newer = " (saved by a newer easyad: upgrade)" if version_number > _FORMAT_VERSION else ""
        raise problem(f"its version is {version_number}; this easyad reads "
                      f"{' and '.join(map(str, _READ_VERSIONS))}{newer}")
    for key, dtype in _ENTRY_FIELDS:
        if data[key].dtype != np.dtype(dtype):
            raise problem(f"the field {key!r} is {data[key].dtype}, not {np.dtype(dtype)}")
        if len(data[key]) != len(data["ops"]):
            raise problem(f"the field {key!r} has {len(data[key])} entries, 'ops' "
                          f"{len(data['ops'])}")
    if len(data["name_indices"]) != len(data["name_values"]):
        raise problem("the names and their indices differ in number")
    n = len(data["ops"])
    names = dict(zip(data["name_indices"].tolist(), data["name_values"].tolist()))
    if len(names) != len(data["name_indices"]):
        raise problem("one entry is named twice")
    tape = _core._rebuild_wengert_list(
        n, tuple(data[key].tobytes() for key, _ in _ENTRY_FIELDS), names, None, None, None,
        source=source)
    function = _trusted_function(tape, data["inputs"].tolist(), data["outputs"].tolist(),
                                 data["scalar"].item(), str(data["on_branch_change"]), source)
    if version_number >= 2:
        checksum = data.get("checksum")
        if checksum is None or checksum.shape != () or checksum.dtype.kind not in "iu":
            raise problem("the checksum is missing or not an integer")
        expected = _file_digest(data)
        if int(checksum) != expected:
            raise problem(f"the checksum {int(checksum)} does not match the data "
                          f"(expected {expected})")
    return function


__all__ = ["Function", "record", "load"]

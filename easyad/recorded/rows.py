"""How a scalar ``Function`` runs rows: the C VM (``_core._Replayer``) or the compiled
code, rows split over threads, and what happens at a row whose branch changes or whose
entry fails. Every evaluating method of ``Function`` (values, gradients, Jacobians,
Hessians) goes through ``Rows._run``; the methods themselves sit in ``easyad.replay`` and
``recorded.hessians``. A mixin of ``Function`` (``easyad/replay.py``), kept apart because it
is the one machinery they all share.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _arrays, _core, _pool, _tapeview
from easyad._core import WengertList
from easyad.anomaly import check_replay
from easyad.errors import BranchChangedError, PowDomainError

_VALUE, _GRADIENT, _SECOND = 0, 1, 2
_BRANCH_MODES = ("raise", "retape", "mask")
# rows x entries below which one thread does the whole batch (threads cost ~50 us to start)
_PARALLEL_WORK = 200_000

_CORES = _pool.CORES
_threads = _pool.threads


class Rows:
    """The row machinery of ``Function`` (see the module docstring)."""

    # set by Function.__init__
    tape: WengertList
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    scalar: bool
    f: Callable[..., Any] | None
    on_branch_change: str
    _replayer: Any
    _native: Any

    def _branch_mode(self, mode: str | None) -> str:
        mode = self.on_branch_change if mode is None else mode
        if mode not in _BRANCH_MODES:
            raise ValueError(f"on_branch_change must be one of {_BRANCH_MODES}, got {mode!r}")
        return mode

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

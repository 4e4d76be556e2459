"""``ad.detect_anomaly()``: stop at the first operation whose value or derivative is NaN/inf.

Off by default and free when off: every generated operation of the compiled core reads one
C flag. When on, a Trace operation that produces a non-finite value or derivative, or a
Record operation that produces a non-finite value, raises ``ad.AnomalyError`` naming the
operation and the line of user code that ran it. A Record's non-finite partial derivative
(sqrt at 0) is no anomaly by itself: only a backward sweep that produces a non-finite
adjoint (scalar or tensor) raises, naming the operation (and line) it flowed through, so
``sqrt(x - x) * 0 + x``, whose gradient is 1, passes. A replayed Function whose results are
not finite is re-recorded at that point to find the operation.
"""
from __future__ import annotations

import contextlib
import math
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from easyad import _core
from easyad._tapeview import TapeView
from easyad.errors import AnomalyError

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def user_line() -> str:
    """'file:line' of the innermost frame outside easyad (the user's code)."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE):
            return f"{frame.filename}:{frame.lineno}"
    return "<easyad>"


def report(name: str, mode: str, value: float, derivative: float) -> None:
    what = "value" if not math.isfinite(value) else "derivative"
    number = value if what == "value" else derivative
    raise AnomalyError(f"{name} produced a {what} of {number} in {mode}, at {user_line()} "
                       f"(ad.detect_anomaly is on)")


def check_backward(tape: Any, derivatives: Any, output: int) -> None:
    """Raise if the sweep gave a non-finite adjoint: name the operation it came through."""
    adjoints = derivatives._adjoint_array()
    bad = np.flatnonzero(~np.isfinite(adjoints))
    if bad.size == 0:
        return
    view = TapeView(tape)
    j = int(bad.max())  # the first to go bad, walking back from the output
    consumers = [i for i in range(j + 1, output + 1)
                 if j in (view.operand(i, 0), view.operand(i, 1))
                 and math.isfinite(adjoints[i])]
    culprit = consumers[0] if consumers else j
    op = view.name(culprit)
    line = tape._lines.get(culprit, "an unknown line (recorded before detect_anomaly)")
    raise AnomalyError(f"the backward sweep produced an adjoint of {adjoints[j]} for entry "
                       f"{j}, through {op} (entry {culprit}) recorded at {line}: its partial "
                       f"derivative is not finite there (ad.detect_anomaly is on)")


def check_node(tape: Any, index: int, node: Any, contributions: Any) -> None:
    """Raise if a tensor operation's vjp passed on a non-finite adjoint (backward sweep)."""
    for k, c in enumerate(contributions):
        if c is None:
            continue
        array = np.asarray(c.get() if hasattr(c, "get") and not isinstance(c, np.ndarray)
                           else c, dtype=float)
        if np.isfinite(array).all():
            continue
        bad = array.reshape(-1)[~np.isfinite(array.reshape(-1))][0]
        line = tape._lines.get(index, "an unknown line (recorded before detect_anomaly)")
        raise AnomalyError(f"the backward sweep produced an adjoint of {bad} for input {k} "
                           f"of {node.label} (entry {index}) recorded at {line}: its "
                           f"derivative is not finite there (ad.detect_anomaly is on)")


def check_replay(X: Any, results: list[Any],
                 record_again: Callable[[Any], None] | None = None) -> None:
    """Raise if replayed results are not finite. ``record_again(x)`` (given by replay, which
    sits above this module) records f anew at the first bad row, under detect_anomaly, so
    the error names the operation and the line."""
    for array in results:
        if array is None:
            continue
        finite = np.isfinite(array).reshape(array.shape[0], -1).all(axis=1)
        if finite.all():
            continue
        row = int(np.flatnonzero(~finite)[0])
        if record_again is not None:
            with detect_anomaly():
                record_again(X[row])
        raise AnomalyError(f"replay produced a non-finite result at row {row} (x = "
                           f"{X[row].tolist()}) (ad.detect_anomaly is on)")


@contextlib.contextmanager
def detect_anomaly() -> Iterator[None]:
    """Within the block, raise ``ad.AnomalyError`` at the first NaN or inf value or
    derivative (forward, backward or replay), naming the operation and the user's line.
    Process-wide; off again when the block ends.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(0.0)
    >>> with ad.detect_anomaly():
    ...     y = ad.sqrt(x) * 0.0 + x     # sqrt'(0) is inf, but nothing flows through it
    ...     y.derivatives()[x]
    1.0
    >>> with ad.detect_anomaly():
    ...     ad.sqrt(x).derivatives()
    Traceback (most recent call last):
    ...
    easyad.errors.AnomalyError: the backward sweep produced an adjoint of inf for entry 0, ...
    """
    previous = _core._set_anomaly_mode(True)
    try:
        yield
    finally:
        _core._set_anomaly_mode(previous)


# the compiled core reports through these (it imports no layer above it)
for _name, _implementation in (("user_line", user_line), ("report", report),
                               ("check_backward", check_backward), ("check_node", check_node)):
    _core._register_service(f"anomaly.{_name}", _implementation)

__all__ = ["detect_anomaly", "AnomalyError"]

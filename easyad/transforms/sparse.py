"""Sparse Jacobians and Hessians in the functional API: ``ad.jacobian(f, sparse=True)``
and ``ad.hessian(f, sparse=True)`` record f once and answer from the recording's sparse
results. The machinery sits below, where the recorded functions can reach it:

- ``_sparsity``: exact patterns from the tape (index sets propagated over the recorded
  program), partitions of columns and rows (greedy distance-2 colourings, largest
  first), star colourings of Hessians;
- ``compiler/tape/sparse_jacobian.py``: the Jacobian's nonzeros as a program of their
  own (forward mode over the column colours, done once, symbolically), replayed by the
  VM or compiled;
- ``recorded/sparse_jacobians.py``: ``Function.jacobian(x, sparse=True)``,
  ``jacobian_pattern``, ``jacobian_colouring``, ``bind_jacobian``, the compressed
  sweeps and the result formats; ``recorded/tensor_sparse.py``: the same for
  ``TensorFunction``.

The guide: docs/sparse.md.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad._evaluation import _arguments, _as_array, _name
from easyad.tensor._base import ObjectArrayOperand

__all__ = ["sparse_derivative"]


def sparse_derivative(f: Callable[..., Any], what: str, sparse: bool, argnums: Any, has_aux: bool,
            format: str | None) -> Callable[..., Any]:
    """jacobian/hessian(f, sparse=True): f recorded at the first call's point (again at
    every call that passes extra arguments: they are constants of a recording) and the
    recording's sparse result at each point."""
    from easyad.replay import record
    if not sparse:
        raise ValueError(f"format= is for sparse results: pass {what}(f, sparse=True, "
                         f"format={format!r})")
    if argnums != 0 or has_aux:
        raise ValueError(f"{what}(f, sparse=True) differentiates f's one array argument: "
                         f"argnums and has_aux are not supported with it")
    recorded: dict[tuple[int, ...], Any] = {}

    @functools.wraps(f)
    def evaluate(x0: Any, *extra: Any, args: Any = None) -> Any:
        arguments = _arguments(extra, args)
        x = _as_array(x0, "x0")
        shape = x.shape
        F = recorded.get(shape) if not arguments else None
        if F is None:
            def flat(z: Any) -> Any:
                out = f(z[0] if shape == () else z.reshape(shape), *arguments)
                return np.asarray(out, dtype=object).reshape(-1) \
                    if what == "jacobian" and np.ndim(out) != 1 else out
            try:
                F = record(flat, x.reshape(-1), tensor=False, on_branch_change="retape")
            except ObjectArrayOperand as e:
                raise TypeError(f"{what}(f, sparse=True) records f with scalar code (an "
                                f"array of Records); {_name(f)} uses tensor operations: "
                                f"record it with ad.record and call F.{what}(x, "
                                f"sparse=True)") from e
            if not arguments:
                recorded[shape] = F
        if what == "hessian":
            return F.hessian(x.reshape(-1), sparse=True, format=format or "csr")
        return F.jacobian(x.reshape(-1), sparse=True, format=format)

    evaluate.__doc__ = f"The sparse {what} of {_name(f)} (easyad.{what}, sparse=True)."
    return evaluate

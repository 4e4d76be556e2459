"""Gradient clipping for training loops (``ad.nn.utils``), with torch's rules.

In PyTorch the gradients live on the parameters (``p.grad``) and ``clip_grad_norm_``
scales them in place. In easyad a step's gradients are the result of its backward sweep
(``loss.derivatives()``), which belongs to that sweep and may share arrays between
entries, so nothing here writes into it: the clipping functions take the parameters and
what ``opt.step`` takes (Derivatives, the loss Record, a mapping ``{parameter: array}`` or
a sequence in parameter order) and return the clipped gradients as a ``Gradients``
mapping, which ``opt.step`` takes in turn. The loop stays two lines::

    grads = nn.utils.clip_grad_norm_(model, loss.derivatives(), max_norm=1.0)
    opt.step(grads)                        # grads.total_norm: the norm before clipping

Only the gradients of ``parameters`` are clipped (and count in the norm); when the
gradients came from a sweep, the optimizer still reads the others from it, so parameters
outside the clipped set are updated with their own gradients, as in PyTorch. The
gradients are read on the host: a model on an OpenCL device takes them off it for the
step (its update then runs in numpy).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from easyad._core import Derivatives, Record
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter

__all__ = ["Gradients", "clip_grad_norm_", "clip_grad_value_"]


class Gradients(dict):  # type: ignore[type-arg]
    """A step's gradients by parameter (``{Parameter: numpy array}``), what the clipping
    functions return and ``opt.step`` takes. ``total_norm`` is the norm that
    ``clip_grad_norm_`` measured (before clipping; None from ``clip_grad_value_``);
    ``derivatives`` the sweep the gradients came from, if any: an optimizer reads the
    parameters that are not keys here from it."""

    total_norm: float | None = None
    derivatives: Derivatives | None = None


def _parameters(parameters: Any) -> list[Parameter]:
    if isinstance(parameters, Module):
        return parameters.parameters()
    if isinstance(parameters, Parameter):
        return [parameters]
    if hasattr(parameters, "param_groups"):          # an optimizer
        return [p for g in parameters.param_groups for p in g["params"]]
    if not isinstance(parameters, Iterable):
        raise TypeError(f"parameters: a Module, an optimizer, a Parameter or an iterable of "
                        f"them, not {type(parameters).__name__}")
    found = list(parameters)
    for p in found:
        if not isinstance(p, Parameter):
            raise TypeError(f"parameters: nn.Parameters, not {type(p).__name__} (give the "
                            f"gradients as the second argument)")
    return found


def _gradients(params: list[Parameter], grads: Any, caller: str) -> Gradients:
    """The gradients of ``params`` in ``grads`` as new host arrays (parameters without
    one are left out, as PyTorch skips ``grad`` None), plus any other entries of a
    mapping as they are."""
    out = Gradients()
    if isinstance(grads, Record):
        grads = grads.derivatives()
    if isinstance(grads, Derivatives):
        out.derivatives = grads
        for p in params:
            g = p.gradient(grads) if p.requires_grad else None
            if g is not None:
                out[p] = g
        return out
    if isinstance(grads, Mapping):
        for key, g in grads.items():
            if not isinstance(key, Parameter):
                raise TypeError(f"{caller}: a mapping of gradients is keyed by nn.Parameter, "
                                f"not {type(key).__name__}")
            out[key] = g
        out.derivatives = getattr(grads, "derivatives", None)
        wanted = {id(p) for p in params}
        for p in list(out):
            if id(p) in wanted and out[p] is not None:
                out[p] = np.array(out[p], dtype=p.dtype)
        return out
    if isinstance(grads, (int, float, np.number)):
        raise TypeError(f"{caller}(parameters, gradients, ...) takes the gradients as its "
                        f"second argument (loss.derivatives()): easyad's parameters hold no "
                        f".grad; got the number {grads!r}")
    if isinstance(grads, Iterable) and not isinstance(grads, (str, bytes)):
        items = list(grads)
        if len(items) != len(params):
            raise ValueError(f"{caller}: {len(items)} gradients for {len(params)} parameters "
                             f"(a sequence of gradients is in parameter order)")
        for p, g in zip(params, items):
            if g is not None:
                out[p] = np.array(g, dtype=p.dtype)
        return out
    raise TypeError(f"{caller}: gradients are Derivatives, a loss Record, a mapping "
                    f"{{parameter: array}} or a sequence in parameter order, not "
                    f"{type(grads).__name__}")


def _check_shapes(params: list[Parameter], grads: Gradients, caller: str) -> list[Parameter]:
    """The parameters that have a gradient, each gradient checked against its shape."""
    held = []
    for p in params:
        g = grads.get(p)
        if g is None:
            continue
        if g.shape != p.shape:
            raise ValueError(f"{caller}: a gradient of shape {g.shape} for a parameter of "
                             f"shape {p.shape}")
        held.append(p)
    return held


def clip_grad_norm_(parameters: Any, gradients: Any, max_norm: float, norm_type: Any = 2.0,
                    error_if_nonfinite: bool = False) -> Gradients:
    """The gradients of ``parameters`` scaled so that their total norm is at most
    ``max_norm``, by torch's ``clip_grad_norm_`` rule: the total norm is the
    ``norm_type``-norm of the per-parameter norms (``inf``: the largest absolute value),
    and every gradient is multiplied by ``min(1, max_norm / (total + 1e-6))``.

    ``parameters``: a Module, an optimizer, or Parameters; ``gradients``: what
    ``opt.step`` takes. Returns a ``Gradients`` mapping for ``opt.step`` with
    ``total_norm`` (torch's return value, before clipping). The gradients given are not
    written to. A non-finite total norm raises with ``error_if_nonfinite``; without it the
    gradients are scaled by it anyway (nan), as torch does, with a RuntimeWarning.

    >>> import numpy as np, easyad as ad
    >>> p = ad.nn.Parameter(np.zeros(2))
    >>> grads = ad.nn.utils.clip_grad_norm_([p], {p: np.array([3.0, 4.0])}, max_norm=1.0)
    >>> grads.total_norm, np.round(grads[p], 6).tolist()
    (5.0, [0.6, 0.8])
    """
    params = _parameters(parameters)
    order = float(norm_type)
    if math.isnan(order):
        raise ValueError("clip_grad_norm_: norm_type is nan")
    if not max_norm >= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, not {max_norm}")
    grads = _gradients(params, gradients, "clip_grad_norm_")
    held = _check_shapes(params, grads, "clip_grad_norm_")
    if not held:
        grads.total_norm = 0.0
        return grads
    norms = np.stack([np.linalg.norm(grads[p].ravel(), ord=order) for p in held])
    total = np.linalg.norm(norms, ord=order)
    grads.total_norm = float(total)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {float(total)}, so they cannot be clipped; find "
                           f"where they overflow (ad.detect_anomaly()), or pass "
                           f"error_if_nonfinite=False to scale by it anyway")
    if not np.isfinite(total):
        warnings.warn(f"clip_grad_norm_: the total norm of the gradients is {float(total)}; "
                      f"scaled by it, as torch does, they become nan or zero (pass "
                      f"error_if_nonfinite=True to raise instead)", RuntimeWarning,
                      stacklevel=2)
    coef = np.minimum(max_norm / (total + 1e-6), 1.0)
    with np.errstate(invalid="ignore"):          # inf * 0: said once, above
        for p in held:
            grads[p] *= coef
    return grads


def clip_grad_value_(parameters: Any, gradients: Any, clip_value: float) -> Gradients:
    """The gradients of ``parameters`` with every entry clamped to
    ``[-clip_value, clip_value]`` (torch's ``clip_grad_value_``), as a ``Gradients``
    mapping for ``opt.step``; the gradients given are not written to.

    >>> import numpy as np, easyad as ad
    >>> p = ad.nn.Parameter(np.zeros(3))
    >>> ad.nn.utils.clip_grad_value_([p], [np.array([-2.0, 0.5, 9.0])], 1.0)[p].tolist()
    [-1.0, 0.5, 1.0]
    """
    params = _parameters(parameters)
    value = float(clip_value)
    if not value >= 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, not {clip_value}")
    grads = _gradients(params, gradients, "clip_grad_value_")
    for p in _check_shapes(params, grads, "clip_grad_value_"):
        np.clip(grads[p], -value, value, out=grads[p])
    return grads

"""The functions behind the modules: activations, ``linear``, ``dropout`` and the losses.

Every function takes tensors (recorded on their WengertList, so the loss is a scalar
Record whose ``derivatives()`` reach the parameters), and most also take plain numpy
arrays. They follow PyTorch's ``torch.nn.functional`` in names, arguments, defaults and
values; the tests compare them with PyTorch in float64.

Numerics: ``sigmoid`` and ``binary_cross_entropy_with_logits`` pick, elementwise, the form
that cannot overflow (a ``where`` of two branches, so the derivative is right at 0 too);
``cross_entropy`` goes through ``log_softmax`` (shifted by the maximum); and
``binary_cross_entropy`` clamps its logarithms at -100, as PyTorch does. On tensors
``linear``, ``sigmoid`` and ``cross_entropy`` with class indices run as one fused tape
entry each (the tensor layer's ``easyad.tensor.linear``...); ``linear`` and
``cross_entropy`` of other operands (TraceTensors, Records) are compositions of tensor ops.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import _core
from easyad import random as _random
from easyad import tensor as _tensor
from easyad.errors import ShapeError
from easyad.tensor import Tensor, recorded_host_value
from easyad.nn._conv_functional import (adaptive_avg_pool2d, avg_pool2d, conv1d, conv2d,
                                        conv_transpose2d, max_pool2d)
from easyad.nn._norm_functional import (batch_norm, embedding, group_norm, layer_norm,
                                        scaled_dot_product_attention)

__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "conv1d", "conv2d", "conv_transpose2d",
           "max_pool2d", "batch_norm", "embedding", "group_norm", "layer_norm",
           "scaled_dot_product_attention",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
           "dropout", "gelu", "l1_loss", "linear", "log_softmax", "mse_loss", "nll_loss",
           "relu", "sigmoid", "softmax", "tanh"]

_REDUCTIONS = ("mean", "sum", "none")


# ---- activations ----

def relu(x: Any) -> Any:
    """``max(x, 0)`` elementwise; its derivative at 0 is 0 (as PyTorch's)."""
    return _core.where(x > 0, x, 0.0)


def tanh(x: Any) -> Any:
    """``tanh(x)`` elementwise (``ad.tanh``: its derivative from the rule table)."""
    return _core.tanh(x)


def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))`` elementwise, without overflow for any x.

    >>> import numpy as np, easyad as ad
    >>> ad.nn.functional.sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    array([0. , 0.5, 1. ])
    """
    if isinstance(x, Tensor):
        return _tensor.sigmoid(x)       # one tape entry, the stable form on each side of 0
    if isinstance(x, (np.ndarray, list, tuple, float, int)) and \
            np.asarray(x).dtype.kind in "fiub":
        return _sigmoid_values(np.asarray(x, dtype=float))
    return _core.expit(x)       # TraceTensors, vmap's batches, Records: the rule table's


def _sigmoid_values(x: np.ndarray) -> np.ndarray:
    """The logistic function of an array, from exp(-|x|), which never overflows."""
    e = np.exp(-np.abs(x))
    out: np.ndarray = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype,
                                                                              copy=False)
    return out


def _fusable(*values: Any) -> bool:
    """Whether the fused tensor operation takes these operands: at least one Tensor, the
    rest Tensors, numpy arrays, numbers or None."""
    found = False
    for v in values:
        if isinstance(v, Tensor):
            found = True
        elif v is not None and not isinstance(v, (np.ndarray, float, int)):
            return False
    return found


def gelu(x: Any, approximate: str = "none") -> Any:
    """The Gaussian error linear unit ``x Φ(x) = x (1 + erf(x / √2)) / 2`` (exact, PyTorch's
    default); ``approximate="tanh"`` gives PyTorch's tanh approximation."""
    if approximate == "none":
        return 0.5 * x * (1.0 + _core.erf(x * (1.0 / math.sqrt(2.0))))
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + _core.tanh(inner))
    raise ValueError(f"approximate is 'none' or 'tanh', not {approximate!r}")


def softmax(x: Any, dim: int = -1) -> Any:
    """``exp(x) / sum(exp(x))`` along ``dim``, computed stably."""
    return _tensor.softmax(x, axis=dim)


def log_softmax(x: Any, dim: int = -1) -> Any:
    """``x - logsumexp(x)`` along ``dim``, computed stably."""
    return _tensor.log_softmax(x, axis=dim)


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """``x @ weight.T + bias``, ``weight`` of shape (out, in) as in PyTorch."""
    if _fusable(x, weight, bias):
        return _tensor.linear(x, weight, bias)
    # only data becomes a constant: a TraceTensor (forward mode in the parameters) or a
    # batched weight (vmap) stays what it is
    if isinstance(weight, (np.ndarray, list, tuple)):
        weight = Tensor.constant(np.asarray(weight), device=_device_of(x))
    y = x @ weight.T
    return y if bias is None else y + bias


def dropout(x: Any, p: float = 0.5, training: bool = True, generator: Any = None) -> Any:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``
    (identity when not ``training``). The mask is ``generator.random(x.shape) < 1 - p``,
    drawn from ``generator`` (a numpy Generator; None: ``ad.random``'s)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, not {p}")
    if not training or p == 0.0:
        return x
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    dtype = x.dtype if isinstance(x, (Tensor, np.ndarray)) else np.float64
    shape = np.shape(x)

    def mask() -> np.ndarray:
        keep = _random.resolve(generator).random(shape) < 1.0 - p
        return (keep * scale).astype(dtype)
    # in a recorded program a new mask is drawn at every replay, as eager execution does
    drawn = recorded_host_value(mask, dtype) if isinstance(x, Tensor) else None
    return x * (drawn if drawn is not None else mask())


# ---- losses ----

def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, (Tensor, np.ndarray)) else np.shape(x)


def _reduce(loss: Any, reduction: str) -> Any:
    if reduction == "mean":
        return _tensor.mean(loss)
    if reduction == "sum":
        return _tensor.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"reduction is one of {_REDUCTIONS}, not {reduction!r}")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction is one of {_REDUCTIONS}, not {reduction!r}")


def _same_shape(name: str, input: Any, target: Any) -> None:
    if _shape(input) != _shape(target):
        raise ShapeError(f"{name}: input of shape {np.shape(input)} and target of shape "
                            f"{np.shape(target)} differ")


def _device_of(x: Any) -> Any:
    return x.device if isinstance(x, Tensor) else None


def mse_loss(input: Any, target: Any, reduction: str = "mean") -> Any:
    """Mean (or ``"sum"``, or ``"none"``) of ``(input - target) ** 2``.

    >>> import numpy as np, easyad as ad
    >>> float(ad.nn.functional.mse_loss(np.array([1.0, 2.0]), np.array([0.0, 0.0])))
    2.5
    """
    _check_reduction(reduction)
    _same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction)


def l1_loss(input: Any, target: Any, reduction: str = "mean") -> Any:
    """Mean (or ``"sum"``, or ``"none"``) of ``|input - target|``."""
    _check_reduction(reduction)
    _same_shape("l1_loss", input, target)
    return _reduce(_core.abs(input - target), reduction)


def _class_targets(name: str, input: Any, target: Any) -> np.ndarray:
    shape = _shape(input)
    if len(shape) not in (1, 2):
        raise ShapeError(f"{name}: input is (N, C) or (C,), not of shape {shape}")
    t = np.asarray(target.value if isinstance(target, Tensor) else target)
    if t.dtype.kind not in "iub":
        raise TypeError(f"{name}: class targets are integers, not {t.dtype}")
    if t.shape != shape[:-1]:
        raise ShapeError(f"{name}: input of shape {shape} needs targets of shape "
                            f"{shape[:-1]}, not {t.shape}")
    classes = shape[-1]
    if t.size and (t.min() < 0 or t.max() >= classes):
        raise IndexError(f"{name}: a target is outside 0..{classes - 1}")
    return t.astype(np.int64)


def _one_hot(t: np.ndarray, classes: int, dtype: Any) -> np.ndarray:
    out = np.zeros(t.shape + (classes,), dtype=dtype)
    np.put_along_axis(out, t[..., None], 1.0, axis=-1)
    return out


def nll_loss(input: Any, target: Any, reduction: str = "mean") -> Any:
    """The negative log likelihood ``-input[n, target[n]]`` of log-probabilities ``input``
    (N, C) and integer class ``target`` (N,), averaged (or ``"sum"``, ``"none"``)."""
    _check_reduction(reduction)
    t = _class_targets("nll_loss", input, target)
    dtype = input.dtype if isinstance(input, (Tensor, np.ndarray)) else np.float64
    picked = -_tensor.sum(input * _one_hot(t, np.shape(input)[-1], dtype), axis=-1)
    return _reduce(picked, reduction)


def cross_entropy(input: Any, target: Any, reduction: str = "mean") -> Any:
    """Cross entropy of logits ``input`` (N, C) or (C,) against ``target``: integer class
    indices (N,) (or a 0-d index), or class probabilities of ``input``'s shape. Computed
    as ``-log_softmax(input)`` picked (or weighted) by the target, so large logits do not
    overflow; averaged over N (or ``"sum"``, or ``"none"``: one loss per row).

    >>> import numpy as np, easyad as ad
    >>> logits = np.array([[2.0, 0.0], [0.0, 2.0]])
    >>> round(float(ad.nn.functional.cross_entropy(logits, np.array([0, 1]))), 6)
    0.126928
    """
    _check_reduction(reduction)
    # a float target (array or tensor) holds class probabilities; its dtype says so, so a
    # tensor without values (eval_shape) is never read
    kind = target.dtype.kind if isinstance(target, Tensor) else np.asarray(target).dtype.kind
    if kind == "f" or isinstance(target, Tensor) and target.tape is not None:
        _same_shape("cross_entropy", input, target)      # class probabilities
        return _reduce(-_tensor.sum(log_softmax(input, -1) * target, axis=-1), reduction)
    t = _class_targets("cross_entropy", input, target)
    if reduction != "none" and len(_shape(input)) == 2 and isinstance(input, Tensor):
        return _tensor.cross_entropy(input, t, reduction)
    return nll_loss(log_softmax(input, -1), t, reduction)


def binary_cross_entropy(input: Any, target: Any, reduction: str = "mean") -> Any:
    """``-(t log p + (1 - t) log(1 - p))`` of probabilities ``input`` and targets in
    [0, 1]; each logarithm is clamped at -100, as in PyTorch, so p = 0 or 1 stays finite."""
    _check_reduction(reduction)
    _same_shape("binary_cross_entropy", input, target)
    with np.errstate(divide="ignore"):
        log_p = _core.maximum(_core.log(input), -100.0)
        log_q = _core.maximum(_core.log(1.0 - input), -100.0)
    return _reduce(-(target * log_p + (1.0 - target) * log_q), reduction)


def binary_cross_entropy_with_logits(input: Any, target: Any, reduction: str = "mean",
                                     pos_weight: Any = None) -> Any:
    """``binary_cross_entropy(sigmoid(input), target)`` computed from the logits without
    overflow: ``x - x t + log1p(exp(-x))`` for x >= 0 and ``-x t + log1p(exp(x))`` below.
    ``pos_weight`` weighs the positive term, as in PyTorch."""
    _check_reduction(reduction)
    _same_shape("binary_cross_entropy_with_logits", input, target)
    x, t = input, target
    with np.errstate(over="ignore"):
        softplus_neg = _core.where(x >= 0, _core.log1p(_core.exp(-x)),
                                   _core.log1p(_core.exp(x)) - x)
    # log(1 + exp(-x)) on both branches; loss = (1 - t) x + w t softplus(-x) + (1 - t)
    # softplus(-x) with w = 1 reduces to x - x t + softplus(-x)
    if pos_weight is None:
        loss = x - x * t + softplus_neg
    else:
        loss = (1.0 - t) * x + (1.0 + (pos_weight - 1.0) * t) * softplus_neg
    return _reduce(loss, reduction)

"""Normalisation, embedding and attention with torch's signatures (``nn.functional``'s
layer_norm, group_norm, batch_norm, embedding, scaled_dot_product_attention).

Each is a composition of tensor operations (mean, reshape, sqrt, matmul, softmax, integer
indexing), so every mode (reverse, forward, create_graph, record and replay, vmap)
differentiates it with no rule of its own. Variances are the biased ones (divided by n),
as torch normalises; batch_norm's running variance takes the unbiased one, as torch's.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import _core
from easyad._levels import BatchedBase
from easyad import random as _random
from easyad import tensor as _tensor
from easyad.errors import ShapeError
from easyad.ops._attention import fused as _fused_attention
from easyad.tensor import Tensor, recorded_effect, recorded_host_value


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _normalise(x: Any, axes: tuple[int, ...], eps: float) -> Any:
    """``(x - mean) / sqrt(var + eps)`` over ``axes``, the variance biased."""
    mean = _tensor.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = _tensor.mean(centred * centred, axis=axes, keepdims=True)
    return centred / _core.sqrt(var + eps)


def _affine(y: Any, weight: Any, bias: Any, shape: tuple[int, ...]) -> Any:
    if weight is not None:
        y = y * (weight.reshape(shape) if hasattr(weight, "reshape") else
                 np.reshape(weight, shape))
    if bias is not None:
        y = y + (bias.reshape(shape) if hasattr(bias, "reshape") else np.reshape(bias, shape))
    return y


def _check_param(name: str, what: str, p: Any, expected: tuple[int, ...]) -> None:
    if p is not None and _shape(p) != expected:
        raise ShapeError(f"{name}: {what} of shape {_shape(p)} must be {expected}: one per "
                         f"normalised {'element' if name == 'layer_norm' else 'channel'}")


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Any:
    """torch's ``layer_norm``: normalise over the trailing axes ``normalized_shape``, then
    scale by ``weight`` and shift by ``bias`` (both of that shape, or None).

    >>> import numpy as np, easyad as ad
    >>> y = ad.nn.functional.layer_norm(np.array([[1.0, 3.0]]), (2,))
    >>> np.round(y, 4)
    array([[-1.,  1.]])
    """
    norm = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(int(n) for n in normalized_shape)
    shape = _shape(input)
    k = len(norm)
    if k == 0 or len(shape) < k or shape[len(shape) - k:] != norm:
        raise ShapeError(f"layer_norm: the input of shape {shape} must end in "
                         f"normalized_shape {norm}; pass its trailing axes")
    _check_param("layer_norm", "weight", weight, norm)
    _check_param("layer_norm", "bias", bias, norm)
    y = _normalise(input, tuple(range(len(shape) - k, len(shape))), eps)
    return _affine(y, weight, bias, norm)


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Any:
    """torch's ``group_norm``: the channels of ``input`` ``(N, C, *)`` split into
    ``num_groups`` groups, each normalised over its channels and positions; then the
    per-channel ``weight`` and ``bias`` (C,)."""
    shape = _shape(input)
    if len(shape) < 2:
        raise ShapeError(f"group_norm: the input of shape {shape} needs axes (N, C, *); "
                         f"add a batch axis")
    c = shape[1]
    if num_groups < 1 or c % num_groups:
        raise ShapeError(f"group_norm: {c} channels do not split into num_groups="
                         f"{num_groups}; pick a divisor of {c}")
    _check_param("group_norm", "weight", weight, (c,))
    _check_param("group_norm", "bias", bias, (c,))
    grouped = input.reshape((shape[0], num_groups, -1))
    y = _normalise(grouped, (2,), eps).reshape(shape)
    return _affine(y, weight, bias, (c,) + (1,) * (len(shape) - 2))


def _values(x: Any) -> np.ndarray | None:
    """The host values of x, or None when it has none yet (a recorded or shape-only
    tensor): statistics read from it would be those of the recording's sample only."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return np.asarray(x)
    try:
        value = x.value     # a Tensor or TraceTensor; vmap's batched values have none
    except Exception:       # a tensor without values (eval_shape) has none to read
        return None
    return value if isinstance(value, np.ndarray) else None


def batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Any:
    """torch's ``batch_norm`` of ``input`` ``(N, C)`` or ``(N, C, *)``.

    Training: normalise with the batch's mean and biased variance per channel, and update
    the numpy arrays ``running_mean`` and ``running_var`` in place (unless None) with
    ``(1 - momentum) running + momentum batch``, the variance unbiased (n / (n - 1)).
    Inside ``ad.record`` the update is an effect of the recording: every replay at one
    point updates them with that replay's batch (docs/nn.md, "BatchNorm and recording").
    Evaluation: normalise with the running statistics. Then ``weight`` and ``bias`` (C,).
    """
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                       eps, None)


def _batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
                training: bool, momentum: float | None, eps: float,
                tracked: np.ndarray | None) -> Any:
    """``batch_norm``; ``tracked`` (a module's num_batches_tracked, or None) counts the
    updates, and momentum None is then its cumulative average (1 / count), both read when
    the update happens (at each replay of a recording, not once at the recording)."""
    shape = _shape(input)
    if len(shape) < 2:
        raise ShapeError(f"batch_norm: the input of shape {shape} needs axes (N, C, *); "
                         f"add a batch axis")
    c = shape[1]
    _check_param("batch_norm", "weight", weight, (c,))
    _check_param("batch_norm", "bias", bias, (c,))
    for what, r in (("running_mean", running_mean), ("running_var", running_var)):
        _check_param("batch_norm", what, r, (c,))
    axes = (0,) + tuple(range(2, len(shape)))
    per_channel = (c,) + (1,) * (len(shape) - 2)
    if training:
        n = math.prod(shape) // c
        if n <= 1:
            raise ValueError(f"batch_norm: training needs more than one value per channel, "
                             f"got an input of shape {shape} (use eval() or a larger batch)")
        if running_mean is not None or running_var is not None or tracked is not None:
            _running(input, axes, n, _Update(running_mean, running_var, momentum, tracked))
        y = _normalise(input, axes, eps)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: evaluation needs running_mean and running_var "
                             "(or training=True to use the batch's statistics)")
        dtype = input.dtype if hasattr(input, "dtype") else np.float64
        mean = np.asarray(running_mean, dtype=dtype).reshape(per_channel)
        scale = 1.0 / np.sqrt(np.asarray(running_var, dtype=dtype) + eps)
        y = (input - mean) * scale.astype(dtype).reshape(per_channel)
    return _affine(y, weight, bias, per_channel)


class _Update:
    """One training step's update of the running statistics, given the batch's mean and
    unbiased variance per channel (float64): eager calls it at once, a recording after
    each replay (``Program.effect``)."""

    def __init__(self, running_mean: Any, running_var: Any, momentum: float | None,
                 tracked: np.ndarray | None) -> None:
        if momentum is None and tracked is None:
            raise ValueError("batch_norm: momentum=None (the cumulative average) needs the "
                             "module's num_batches_tracked; pass a number to the functional "
                             "form")
        self.mean, self.var, self.momentum, self.tracked = \
            running_mean, running_var, momentum, tracked

    def __call__(self, mean: np.ndarray, var: np.ndarray) -> None:
        m = self.momentum
        if self.tracked is not None:
            self.tracked += 1
            if m is None:                 # torch's cumulative average: read now
                m = 1.0 / float(self.tracked)
        mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        var = np.asarray(var, dtype=np.float64).reshape(-1)
        if self.mean is not None:
            self.mean *= 1.0 - m
            self.mean += m * mean
        if self.var is not None:
            self.var *= 1.0 - m
            self.var += m * var


def _running(input: Any, axes: tuple[int, ...], n: int, update: _Update) -> None:
    def statistics() -> list[Any]:
        # the batch statistics as recorded operations (no derivative): an effect of the
        # program, applied after every replay with that replay's batch
        t = Tensor.constant(input) if isinstance(input, np.ndarray) else input
        x = t.stop_gradient().astype(np.float64)
        mean = _tensor.mean(x, axis=axes, keepdims=True)
        centred = x - mean
        return [mean.reshape((-1,)), _tensor.mean(centred * centred, axis=axes)
                * (n / (n - 1))]
    if not isinstance(input, BatchedBase) and recorded_effect(update, statistics):
        return
    x = _values(input)
    if x is None:
        raise ValueError("batch_norm: the running statistics cannot be updated under vmap "
                         "(which example's batch statistics?): torch.func.vmap refuses "
                         "this too; call the model eagerly or inside ad.record, use eval() "
                         "or track_running_stats=False (running_mean=running_var=None)")
    x = x.astype(np.float64)
    update(x.mean(axis=axes), x.var(axis=axes) * (n / (n - 1)))


def embedding(input: Any, weight: Any, padding_idx: int | None = None) -> Any:
    """torch's ``embedding``: the rows ``weight[input]`` of the table ``weight``
    (num_embeddings, dim) for integer indices ``input`` of any shape; an index repeated
    accumulates its rows' derivatives. The row ``padding_idx`` gets no derivative."""
    if isinstance(input, BatchedBase):
        return _embedding_batched(input, weight, padding_idx)
    idx = np.asarray(input.value if isinstance(input, Tensor) else input)
    if idx.dtype == object:
        raise TypeError("embedding: the indices are data, not a traced or recorded value "
                        "(got an array of objects): indices have no derivative; "
                        "differentiate in the weight")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices are integers, not {idx.dtype} (indices have "
                        f"no derivative: differentiate in the weight)")
    wshape = _shape(weight)
    if len(wshape) != 2:
        raise ShapeError(f"embedding: the weight of shape {wshape} must be "
                         f"(num_embeddings, embedding_dim)")
    rows = wshape[0]
    if idx.size and (idx.min() < -rows or idx.max() >= rows):
        raise IndexError(f"embedding: an index is outside 0..{rows - 1}")
    idx = idx % max(rows, 1)
    out = weight[idx]
    if padding_idx is None:
        return out
    pad = padding_idx % rows
    if not (idx == pad).any():
        return out
    frozen = weight.stop_gradient()[idx] if hasattr(weight, "stop_gradient") else out
    return _core.where((idx == pad)[..., None], frozen, out)


def _embedding_batched(input: Any, weight: Any, padding_idx: int | None) -> Any:
    """embedding under ad.vmap: a batch of index arrays gathers by vmap's batched
    indexing (the table batched too when it is per example)."""
    if input.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices are integers, not {input.dtype} (indices "
                        f"have no derivative: differentiate in the weight)")
    out = weight[input]                      # (a negative index counts from the end)
    if padding_idx is None:
        return out
    rows = _shape(weight)[0]
    frozen = weight.stop_gradient()[input] if hasattr(weight, "stop_gradient") else out
    for pad in {padding_idx % rows, padding_idx % rows - rows}:     # either spelling
        out = _core.where((input == pad)[..., None], frozen, out)
    return out


def _causal(length: int, source: int) -> np.ndarray:
    return np.tril(np.ones((length, source), dtype=bool))


def _attention_bias(attn_mask: Any, is_causal: bool, length: int, source: int,
                   dtype: Any) -> np.ndarray | Any | None:
    """The additive bias of ``scaled_dot_product_attention``'s ``attn_mask`` (bool: True
    takes part, else -inf; float: added) and ``is_causal`` (row i sees columns <= i)."""
    if is_causal:
        if attn_mask is not None:
            raise ValueError("scaled_dot_product_attention: give attn_mask or "
                             "is_causal=True, not both")
        attn_mask = _causal(length, source)
    if attn_mask is None:
        return None
    if isinstance(attn_mask, Tensor) and attn_mask.tape is not None:
        return attn_mask                              # a differentiated float bias
    m = np.asarray(attn_mask.value if isinstance(attn_mask, Tensor) else attn_mask)
    if m.dtype == bool:
        return np.where(m, 0.0, -np.inf).astype(dtype)
    return m.astype(dtype)


def _dtype(x: Any) -> Any:
    dtype = getattr(x, "dtype", None)
    return dtype if dtype is not None and np.dtype(dtype).kind == "f" else np.float64


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, generator: Any = None) -> Any:
    """torch's ``scaled_dot_product_attention``: ``softmax(q kᵀ scale + bias) v`` with
    q (..., L, E), k (..., S, E), v (..., S, Ev) and ``scale`` 1/sqrt(E) by default.
    ``attn_mask`` broadcasts to (..., L, S): bool (True: attend) or float (added);
    ``is_causal`` lets position i attend to 0..i. A row that may attend to nothing gives
    nan (a softmax over no term; torch returns 0 there). ``dropout_p`` drops attention
    weights (from ``generator``)."""
    qs, ks, vs = _shape(query), _shape(key), _shape(value)
    if len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
        raise ShapeError(f"scaled_dot_product_attention: query {qs}, key {ks} and value "
                         f"{vs} need at least 2 axes (..., length, features)")
    if qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise ShapeError(f"scaled_dot_product_attention: query {qs} and key {ks} must "
                         f"share the last axis, key and value {vs} the length axis "
                         f"(-2); transpose to (..., length, features)")
    s = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    # one op of the op table where it serves (tensors on the numpy device, no dropout):
    # the scores taken a few heads at a time, in the cache (``easyad.ops._attention``)
    if not is_causal or attn_mask is None:
        bias = _attention_bias(attn_mask, False, qs[-2], ks[-2], _dtype(query))
        done = _fused_attention(query, key, value, bias, is_causal, s, dropout_p)
        if done is not NotImplemented:
            return done
    perm = tuple(range(len(ks) - 2)) + (len(ks) - 1, len(ks) - 2)
    if math.frexp(s)[0] == 0.5:
        # a power of two (1/sqrt(E) for E = 4, 16, 64, 256...): scaling the query is exact
        # as scaling the scores is, the same floats from a (..., L, E) pass rather than
        # an (..., L, S) one, forward and backward (barring subnormal products)
        scores = (query * s) @ key.transpose(perm)
    else:
        scores = (query @ key.transpose(perm)) * s
    bias = _attention_bias(attn_mask, is_causal, qs[-2], ks[-2], scores.dtype)
    if bias is not None:
        scores = scores + bias
    weights = _tensor.softmax(scores, axis=-1)
    if dropout_p > 0.0:
        weights = _dropout(weights, dropout_p, generator)
    return weights @ value


def _dropout(x: Any, p: float, generator: Any) -> Any:
    """functional.dropout's mask (kept here so this module does not import functional)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, not {p}")
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    shape, dtype = _shape(x), x.dtype

    def mask() -> np.ndarray:
        return ((_random.resolve(generator).random(shape) < 1.0 - p) * scale).astype(dtype)
    drawn = recorded_host_value(mask, dtype) if isinstance(x, Tensor) else None
    return x * (drawn if drawn is not None else mask())

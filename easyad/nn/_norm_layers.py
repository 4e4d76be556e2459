"""The normalisation layers (LayerNorm, GroupNorm, BatchNorm1d, BatchNorm2d) and
Embedding: thin Modules over ``nn.functional``'s, with torch's parameter and buffer names,
shapes and initialisation, so a torch state_dict loads as it is."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import random as _random
from easyad.errors import ShapeError
from easyad.nn import _norm_functional as F
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter, float_dtype


def _affine_pair(shape: tuple[int, ...], weight: bool, bias: bool, dtype: Any,
                 device: Any) -> tuple[Parameter | None, Parameter | None]:
    dt = float_dtype(dtype)
    return (Parameter(np.ones(shape), dt, device) if weight else None,
            Parameter(np.zeros(shape), dt, device) if bias else None)


def _tensor(p: Parameter | None, tape: Any) -> Any:
    return None if p is None else p.tensor(tape)


class LayerNorm(Module):
    """torch's ``LayerNorm``: normalise over the trailing ``normalized_shape``; weight
    (ones) and bias (zeros) of that shape when ``elementwise_affine``."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, dtype: Any = None,
                 device: Any = None) -> None:
        self.normalized_shape = (int(normalized_shape),) if isinstance(
            normalized_shape, (int, np.integer)) else tuple(int(n) for n in normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight, self.bias = _affine_pair(self.normalized_shape, elementwise_affine,
                                              elementwise_affine and bias, dtype, device)

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.layer_norm(x, self.normalized_shape, _tensor(self.weight, tape),
                            _tensor(self.bias, tape), self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """torch's ``GroupNorm``: ``num_channels`` in ``num_groups`` groups; per-channel
    weight (ones) and bias (zeros) when ``affine``."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, dtype: Any = None, device: Any = None) -> None:
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} must split into "
                             f"num_groups={num_groups}")
        self.num_groups, self.num_channels, self.eps, self.affine = (
            num_groups, num_channels, eps, affine)
        self.weight, self.bias = _affine_pair((num_channels,), affine, affine, dtype, device)

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.group_norm(x, self.num_groups, _tensor(self.weight, tape),
                            _tensor(self.bias, tape), self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _BatchNorm(Module):
    """Batch statistics in training (updating the running ones), running statistics in
    evaluation (``eval()``). ``momentum=None``: the running statistics are the cumulative
    average over the batches seen (torch's). Buffers ``running_mean`` (zeros),
    ``running_var`` (ones), ``num_batches_tracked`` (0), as torch's."""

    _buffer_names = ("running_mean", "running_var", "num_batches_tracked")
    axes: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, dtype: Any = None,
                 device: Any = None) -> None:
        self.num_features, self.eps, self.momentum = int(num_features), eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight, self.bias = _affine_pair((self.num_features,), affine, affine, dtype,
                                              device)
        self.running_mean: np.ndarray | None = None
        self.running_var: np.ndarray | None = None
        self.num_batches_tracked: np.ndarray | None = None
        if track_running_stats:
            self.running_mean = np.zeros(self.num_features)
            self.running_var = np.ones(self.num_features)
            self.num_batches_tracked = np.zeros((), dtype=np.int64)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            self.running_mean[...], self.running_var[...] = 0.0, 1.0
            self.num_batches_tracked[...] = 0      # type: ignore[index]

    def forward(self, x: Any, tape: Any = None) -> Any:
        nd = len(x.shape)
        if nd not in self.axes:
            raise ShapeError(f"{type(self).__name__}: the input of shape {tuple(x.shape)} "
                             f"must have {' or '.join(map(str, self.axes))} axes "
                             f"(N, C{', L' if 3 in self.axes else ', H, W'})")
        if x.shape[1] != self.num_features:
            raise ShapeError(f"{type(self).__name__}: the input has {x.shape[1]} channels "
                             f"(axis 1), the layer num_features={self.num_features}")
        batch_stats = self.training or not self.track_running_stats
        # num_batches_tracked and momentum=None's average move with each update (at
        # every replay of a recording): F._batch_norm counts them there
        tracking = self.training and self.track_running_stats
        running = (self.running_mean, self.running_var) \
            if not self.training or self.track_running_stats else (None, None)
        return F._batch_norm(x, running[0], running[1], _tensor(self.weight, tape),
                             _tensor(self.bias, tape), batch_stats,
                             self.momentum if tracking else (self.momentum or 0.0),
                             self.eps, self.num_batches_tracked if tracking else None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """torch's ``BatchNorm1d``: input (N, C) or (N, C, L), statistics per channel.

    >>> import numpy as np, easyad as ad
    >>> bn = ad.nn.BatchNorm1d(2)
    >>> _ = bn(np.array([[0.0, 1.0], [2.0, 5.0]]))
    >>> bn.running_mean, bn.running_var
    (array([0.1, 0.3]), array([1.1, 1.7]))
    """

    axes = (2, 3)


class BatchNorm2d(_BatchNorm):
    """torch's ``BatchNorm2d``: input (N, C, H, W), statistics per channel."""

    axes = (4,)


class Embedding(Module):
    """torch's ``Embedding``: a table ``weight`` (num_embeddings, embedding_dim) drawn
    from N(0, 1) (``generator``: a Generator or int seed; None: ``ad.random``'s), the row
    ``padding_idx`` zeroed and frozen. Called with integer indices of any shape."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: int | None = None, max_norm: Any = None,
                 generator: Any = None, dtype: Any = None, device: Any = None) -> None:
        if max_norm is not None:
            raise NotImplementedError("Embedding: max_norm is not supported (renormalise "
                                      "the weight between steps)")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(f"Embedding: padding_idx {padding_idx} is not a row of "
                             f"{num_embeddings}")
        self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
        table = _random.resolve(generator).standard_normal((num_embeddings, embedding_dim))
        if self.padding_idx is not None:
            table[self.padding_idx] = 0.0
        self.weight = Parameter(table, float_dtype(dtype), device)

    def __call__(self, x: Any, tape: Any = None) -> Any:
        # indices stay integers (Module.__call__ would turn them into float tensors)
        return self.forward(x, tape)

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.embedding(x, self.weight.tensor(tape), self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}"

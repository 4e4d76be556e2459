"""The layers: Linear, the activations (ReLU, Tanh, Sigmoid, GELU, Softmax, LogSoftmax),
Dropout and Identity. Each is a thin Module over a function of ``functional``."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import random as _random
from easyad.nn import functional as F
from easyad.nn import init
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter, float_dtype


class Linear(Module):
    """``y = x @ weight.T + bias``, weight of shape (out_features, in_features).

    Initialised as PyTorch does: weight by ``kaiming_uniform_(a=sqrt(5))``, that is
    U(-1/sqrt(in), 1/sqrt(in)), and bias by U(-1/sqrt(in), 1/sqrt(in)), drawn from
    ``generator`` (a numpy Generator or an int seed; None: ``ad.random``'s), weight first.

    >>> import easyad as ad
    >>> layer = ad.nn.Linear(3, 2, generator=0)
    >>> layer.weight.shape, layer.bias.shape
    ((2, 3), (2,))
    >>> layer([1.0, 2.0, 3.0]).shape
    (2,)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 generator: Any = None, dtype: Any = None, device: Any = None) -> None:
        self.in_features, self.out_features = int(in_features), int(out_features)
        dt = float_dtype(dtype)
        rng = _random.resolve(generator)
        self.weight = Parameter(np.zeros((self.out_features, self.in_features)), dt, device)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5.0), generator=rng)
        self.bias: Parameter | None = None
        if bias:
            self.bias = Parameter(np.zeros(self.out_features), dt, device)
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound, generator=rng)

    def forward(self, x: Any, tape: Any = None) -> Any:
        bias = self.bias.tensor(tape) if self.bias is not None else None
        return F.linear(x, self.weight.tensor(tape), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Identity(Module):
    """Returns its input."""

    def forward(self, x: Any, tape: Any = None) -> Any:
        return x


class ReLU(Module):
    """``max(x, 0)`` elementwise (derivative 0 at 0)."""

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.relu(x)


class Tanh(Module):
    """``tanh(x)`` elementwise."""

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.tanh(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` elementwise, without overflow."""

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.sigmoid(x)


class GELU(Module):
    """``x Φ(x)`` with the exact erf (PyTorch's default), or ``approximate="tanh"``."""

    def __init__(self, approximate: str = "none") -> None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate is 'none' or 'tanh', not {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    """Softmax along ``dim`` (default the last axis)."""

    def __init__(self, dim: int = -1) -> None:
        self.dim = dim

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """Log-softmax along ``dim`` (default the last axis)."""

    def __init__(self, dim: int = -1) -> None:
        self.dim = dim

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.log_softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Dropout(Module):
    """In training mode, zero each element with probability ``p`` and scale the others by
    ``1 / (1 - p)``; in eval mode, the identity. The masks come from ``generator`` (a numpy
    Generator or an int seed, fixed at construction; None: ``ad.random``'s at each call)."""

    def __init__(self, p: float = 0.5, generator: Any = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, not {p}")
        self.p = float(p)
        self.generator = None if generator is None else _random.resolve(generator)

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.dropout(x, self.p, self.training, self.generator)

    def extra_repr(self) -> str:
        return f"p={self.p}"

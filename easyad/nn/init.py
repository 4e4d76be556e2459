"""Initialisation of parameters in place, with PyTorch's formulas, from a seeded generator.

Every function takes ``generator=`` (a ``numpy.random.Generator``; None: the module-level
one of ``ad.random``, see ``ad.random.seed``), so a model built after ``ad.random.seed(0)``
is the same on every run. The distributions are PyTorch's; the draws are numpy's, so to
compare with PyTorch copy the arrays over (``load_state_dict``). Given the same draws the
values are PyTorch's (``tests/test_training.py`` feeds numpy's draws to ``torch.nn.init``).

The layers' defaults are PyTorch's: ``Linear``, ``Conv*`` and ``ConvTranspose2d`` draw
the weight by ``kaiming_uniform_(a=sqrt(5))`` and the bias from U(-1/sqrt(fan_in),
1/sqrt(fan_in)); ``Embedding`` N(0, 1); ``MultiheadAttention``'s input projection
``xavier_uniform_`` with zero biases; the norms ones and zeros.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import random as _random
from easyad.nn._parameter import Parameter

__all__ = ["calculate_gain", "constant_", "kaiming_normal_", "kaiming_uniform_", "normal_",
           "ones_", "orthogonal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_"]


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need at least 2 dimensions, not {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """PyTorch's recommended gain for a nonlinearity (``"relu"``, ``"tanh"``, ...)."""
    if nonlinearity in ("linear", "sigmoid", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                        "conv_transpose2d", "conv_transpose3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is not None and (isinstance(param, bool) or
                                  not isinstance(param, (int, float))):
            raise ValueError(f"leaky_relu's negative slope is a number, not {param!r}")
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope * slope))
    if nonlinearity == "selu":
        return 3.0 / 4.0
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r} (linear, sigmoid, tanh, "
                     f"relu, leaky_relu, selu, conv*)")


def uniform_(p: Parameter, low: float = 0.0, high: float = 1.0,
             generator: Any = None) -> Parameter:
    """Fill with draws from U(low, high)."""
    rng = _random.resolve(generator)
    p.data[...] = rng.uniform(low, high, size=p.data.shape)
    return p


def normal_(p: Parameter, mean: float = 0.0, std: float = 1.0,
            generator: Any = None) -> Parameter:
    """Fill with draws from N(mean, std²)."""
    if std < 0:
        raise ValueError(f"normal_: std must be >= 0, not {std}")
    rng = _random.resolve(generator)
    p.data[...] = rng.normal(mean, std, size=p.data.shape)
    return p


def constant_(p: Parameter, val: float) -> Parameter:
    """Fill with ``val``."""
    p.data[...] = val
    return p


def zeros_(p: Parameter) -> Parameter:
    """Fill with 0."""
    return constant_(p, 0.0)


def ones_(p: Parameter) -> Parameter:
    """Fill with 1."""
    return constant_(p, 1.0)


def _fan(shape: tuple[int, ...], mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode is 'fan_in' or 'fan_out', not {mode!r}")
    fan_in, fan_out = _fans(shape)
    return fan_in if mode == "fan_in" else fan_out


def kaiming_uniform_(p: Parameter, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator: Any = None) -> Parameter:
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al.), fan by ``mode``; ``nn.Linear``
    uses a = sqrt(5), which makes b = 1 / sqrt(fan_in)."""
    fan = _fan(p.shape, mode)
    gain = calculate_gain(nonlinearity, a)
    bound = gain * math.sqrt(3.0 / fan) if fan else 0.0
    return uniform_(p, -bound, bound, generator)


def kaiming_normal_(p: Parameter, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator: Any = None) -> Parameter:
    """N(0, std²) with std = gain / sqrt(fan) (He et al.), fan by ``mode``."""
    fan = _fan(p.shape, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0
    return normal_(p, 0.0, std, generator)


def xavier_uniform_(p: Parameter, gain: float = 1.0, generator: Any = None) -> Parameter:
    """U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(p.shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(p, -bound, bound, generator)




def xavier_normal_(p: Parameter, gain: float = 1.0, generator: Any = None) -> Parameter:
    """N(0, std²) with std = gain * sqrt(2 / (fan_in + fan_out)) (Glorot & Bengio)."""
    fan_in, fan_out = _fans(p.shape)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(p, 0.0, std, generator)


def orthogonal_(p: Parameter, gain: float = 1.0, generator: Any = None) -> Parameter:
    """A (semi-)orthogonal matrix times ``gain`` (Saxe et al.), as torch draws it: the Q of
    the QR factorisation of a standard normal (rows, numel / rows) matrix (transposed when
    wider than tall), its columns' signs set by R's diagonal so that Q is uniform
    (Haar) over the orthogonal matrices."""
    if len(p.shape) < 2:
        raise ValueError(f"orthogonal_ needs at least 2 dimensions, not {p.shape}")
    if p.size == 0:
        return p
    rows = p.shape[0]
    cols = p.size // rows
    flat = _random.resolve(generator).normal(0.0, 1.0, size=(rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    p.data[...] = q.reshape(p.shape)
    p.data *= gain
    return p

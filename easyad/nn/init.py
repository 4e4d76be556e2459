"""Initialisation of parameters in place, with PyTorch's formulas, from a seeded generator.

Every function takes ``generator=`` (a ``numpy.random.Generator``; None: the module-level
one of ``ad.random``, see ``ad.random.seed``), so a model built after ``ad.random.seed(0)``
is the same on every run. The distributions are PyTorch's; the draws are numpy's, so to
compare with PyTorch copy the arrays over (``load_state_dict``).
"""
from __future__ import annotations

import math
from typing import Any


from easyad import random as _random
from easyad.nn._parameter import Parameter

__all__ = ["calculate_gain", "kaiming_uniform_", "uniform_", "xavier_uniform_", "zeros_"]


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need at least 2 dimensions, not {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """PyTorch's recommended gain for a nonlinearity (``"relu"``, ``"tanh"``, ...)."""
    if nonlinearity in ("linear", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope * slope))
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def uniform_(p: Parameter, low: float = 0.0, high: float = 1.0,
             generator: Any = None) -> Parameter:
    """Fill with draws from U(low, high)."""
    rng = _random.resolve(generator)
    p.data[...] = rng.uniform(low, high, size=p.data.shape)
    return p


def zeros_(p: Parameter) -> Parameter:
    p.data[...] = 0.0
    return p


def kaiming_uniform_(p: Parameter, a: float = 0.0, nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Parameter:
    """U(-b, b) with b = gain * sqrt(3 / fan_in); ``nn.Linear`` uses a = sqrt(5), which
    makes b = 1 / sqrt(fan_in)."""
    fan_in, _ = _fans(p.shape)
    gain = calculate_gain(nonlinearity, a)
    bound = gain * math.sqrt(3.0 / fan_in) if fan_in else 0.0
    return uniform_(p, -bound, bound, generator)


def xavier_uniform_(p: Parameter, gain: float = 1.0, generator: Any = None) -> Parameter:
    """U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(p.shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(p, -bound, bound, generator)



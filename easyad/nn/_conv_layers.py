"""The convolution and pooling layers (Conv1d, Conv2d, ConvTranspose2d, MaxPool2d,
AvgPool2d, AdaptiveAvgPool2d) and Flatten: thin Modules over ``nn.functional``'s, with
torch's parameter names, shapes and default initialisation (so a torch state_dict's
arrays load as they are)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import random as _random
from easyad.nn import _conv_functional as F
from easyad.nn import init
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter, float_dtype


def _n(v: Any, d: int) -> tuple[int, ...]:
    return (int(v),) * d if isinstance(v, (int, np.integer)) else tuple(int(a) for a in v)


class _ConvNd(Module):
    """The weight ``shape`` drawn by torch's ``kaiming_uniform_(a=sqrt(5))``: U(-b, b) with
    b = 1 / sqrt(fan_in), fan_in = ``shape[1] * prod(kernel)``; the bias from the same
    U(-b, b); weight first, from ``generator`` (a Generator or int seed; None:
    ``ad.random``'s)."""

    def _parameters(self, shape: tuple[int, ...], out: int, bias: bool, generator: Any,
                    dtype: Any, device: Any) -> None:
        dt = float_dtype(dtype)
        rng = _random.resolve(generator)
        self.weight = Parameter(np.zeros(shape), dt, device)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5.0), generator=rng)
        self.bias: Parameter | None = None
        if bias:
            self.bias = Parameter(np.zeros(out), dt, device)
            fan_in = shape[1] * math.prod(shape[2:])
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound, generator=rng)

    def _check(self, in_channels: int, out_channels: int, groups: int,
               padding_mode: str) -> None:
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} "
                             f"must both split into groups={groups}")
        if padding_mode != "zeros":
            raise NotImplementedError(f"padding_mode={padding_mode!r}: only 'zeros' "
                                      f"(pad the input with ad.pad for the others)")

    def _tensors(self, tape: Any) -> tuple[Any, Any]:
        bias = self.bias.tensor(tape) if self.bias is not None else None
        return self.weight.tensor(tape), bias

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, groups={self.groups}, "
                f"bias={self.bias is not None}")


class Conv1d(_ConvNd):
    """torch's ``Conv1d``: weight (out, in / groups, k), bias (out,)."""

    d = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any,
                 stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                 bias: bool = True, padding_mode: str = "zeros", generator: Any = None,
                 dtype: Any = None, device: Any = None) -> None:
        self._check(in_channels, out_channels, groups, padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _n(kernel_size, self.d)
        self.stride, self.dilation = _n(stride, self.d), _n(dilation, self.d)
        self.padding = padding if isinstance(padding, str) else _n(padding, self.d)
        self._parameters((out_channels, in_channels // groups) + self.kernel_size,
                         out_channels, bias, generator, dtype, device)

    def forward(self, x: Any, tape: Any = None) -> Any:
        w, b = self._tensors(tape)
        return F._conv(type(self).__name__.lower(), self.d, x, w, b, self.stride,
                       self.padding, self.dilation, self.groups)


class Conv2d(Conv1d):
    """torch's ``Conv2d``: weight (out, in / groups, kh, kw), bias (out,); ``padding``
    ints, "valid" or "same".

    >>> import numpy as np, easyad as ad
    >>> layer = ad.nn.Conv2d(3, 8, 3, padding=1, generator=0)
    >>> layer.weight.shape, layer(np.zeros((2, 3, 5, 5))).shape
    ((8, 3, 3, 3), (2, 8, 5, 5))
    """

    d = 2


class ConvTranspose2d(_ConvNd):
    """torch's ``ConvTranspose2d``: weight (in, out / groups, kh, kw), bias (out,),
    initialised as torch's (fan_in = ``weight.shape[1] * kh * kw``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any,
                 stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                 bias: bool = True, dilation: Any = 1, padding_mode: str = "zeros",
                 generator: Any = None, dtype: Any = None, device: Any = None) -> None:
        self._check(in_channels, out_channels, groups, padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _n(kernel_size, 2)
        self.stride, self.dilation = _n(stride, 2), _n(dilation, 2)
        self.padding, self.output_padding = _n(padding, 2), _n(output_padding, 2)
        self._parameters((in_channels, out_channels // groups) + self.kernel_size,
                         out_channels, bias, generator, dtype, device)

    def forward(self, x: Any, tape: Any = None) -> Any:
        w, b = self._tensors(tape)
        return F.conv_transpose2d(x, w, b, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class MaxPool2d(Module):
    """torch's ``MaxPool2d`` (stride default: the kernel; ties: the first maximum)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 dilation: Any = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """torch's ``AvgPool2d`` (stride default: the kernel; ``count_include_pad=True``)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Any = None) -> None:
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """torch's ``AdaptiveAvgPool2d``: the mean over torch's adaptive windows to the spatial
    shape ``output_size``."""

    def __init__(self, output_size: Any) -> None:
        self.output_size = output_size

    def forward(self, x: Any, tape: Any = None) -> Any:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Flatten(Module):
    """torch's ``Flatten``: axes ``start_dim`` to ``end_dim`` (default 1 to -1) as one."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any, tape: Any = None) -> Any:
        shape = tuple(x.shape)
        nd = len(shape)
        start, end = self.start_dim % max(nd, 1), self.end_dim % max(nd, 1)
        if not (-nd <= self.start_dim < nd and -nd <= self.end_dim < nd) or start > end:
            raise ValueError(f"Flatten: start_dim {self.start_dim} and end_dim "
                             f"{self.end_dim} do not name axes in order of an input of "
                             f"shape {shape}")
        return x.reshape(shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"

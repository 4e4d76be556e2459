"""Convolution and pooling with torch's signatures and layouts (``nn.functional``'s
conv1d, conv2d, conv_transpose2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d).

Inputs are ``(N, C, *S)`` or unbatched ``(C, *S)``; weights ``(out, in / groups, *K)``
(conv_transpose2d: ``(in, out / groups, *K)``, torch's). Each is a call of the op table's
``conv``, ``conv_transpose``, ``max_pool``, ``avg_pool`` (``easyad.ops``), so every mode
(reverse, forward, create_graph, record and replay, eval_shape) differentiates it.
torch's options that change nothing here are taken; those easyad does not have
(``ceil_mode=True``, ``return_indices``, ``divisor_override``) raise.
"""
from __future__ import annotations

from typing import Any

from easyad import ops
from easyad.errors import ShapeError
from easyad.tensor import add_channel_bias


def _tuple(name: str, what: str, v: Any, d: int) -> tuple[int, ...]:
    t = (int(v),) * d if isinstance(v, int) or hasattr(v, "__index__") else \
        tuple(int(a) for a in v)
    if len(t) != d:
        raise ValueError(f"{name}: {what} {v} needs {d} entries (or one int)")
    return t


def _dims(name: str, x: Any, d: int) -> None:
    nd = len(x.shape)
    if nd not in (d + 1, d + 2):
        raise ShapeError(f"{name}: the input of shape {tuple(x.shape)} must have {d + 2} "
                         f"axes (N, C, {d} spatial) or {d + 1} (unbatched); reshape it")


def _bias(y: Any, bias: Any, d: int) -> Any:
    if bias is None:
        return y
    if tuple(bias.shape) != (y.shape[-d - 1],):
        raise ShapeError(f"the bias of shape {tuple(bias.shape)} must be ({y.shape[-d - 1]},)"
                         f": one per output channel")
    # y: _bias's parameter only when the caller passed the op's output straight in
    return add_channel_bias(y, bias, d, fresh=1)


def _padding(name: str, padding: Any, weight: Any, stride: tuple[int, ...],
             dilation: tuple[int, ...], d: int) -> tuple[int, ...]:
    """torch's padding: ints, or "valid" (none) or "same" (the output as large as the
    input: stride 1 only; an odd total puts the extra element on the high side)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * d
        if padding != "same":
            raise ValueError(f"{name}: padding {padding!r} is 'valid', 'same' or ints")
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' needs stride 1, got {stride} (give "
                             f"the padding as ints)")
        total = [dilation[i] * (weight.shape[2 + i] - 1) for i in range(d)]
        return tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
    return _tuple(name, "padding", padding, d)


def _conv(name: str, d: int, x: Any, weight: Any, bias: Any, stride: Any, padding: Any,
          dilation: Any, groups: int) -> Any:
    _dims(name, x, d)
    if len(weight.shape) != d + 2:
        raise ShapeError(f"{name}: the weight of shape {tuple(weight.shape)} must have "
                         f"{d + 2} axes (out, in / groups, {d} kernel extents)")
    stride, dilation = _tuple(name, "stride", stride, d), _tuple(name, "dilation", dilation, d)
    pad = _padding(name, padding, weight, stride, dilation, d)
    # (the op's output straight into _bias: its only reference, so the bias may be added
    # into its buffer)
    return _bias(ops.conv(x, weight, stride=stride, padding=pad, dilation=dilation,
                          groups=groups), bias, d)


def conv1d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Any:
    """torch's ``conv1d``: ``input`` (N, C_in, L) or (C_in, L), ``weight``
    (C_out, C_in / groups, k), ``padding`` an int, "valid" or "same"."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Any:
    """torch's ``conv2d``: ``input`` (N, C_in, H, W) or (C_in, H, W), ``weight``
    (C_out, C_in / groups, kh, kw), ``padding`` ints, "valid" or "same".

    >>> import numpy as np, easyad as ad
    >>> ad.nn.functional.conv2d(np.ones((1, 1, 3, 3)), np.ones((2, 1, 2, 2))).shape
    (1, 2, 2, 2)
    """
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                     dilation: Any = 1) -> Any:
    """torch's ``conv_transpose2d``: ``input`` (N, C_in, H, W), ``weight``
    (C_in, C_out / groups, kh, kw); the output's extent per axis is
    ``(H - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1``
    (``output_padding`` < stride or dilation, as torch)."""
    name, d = "conv_transpose2d", 2
    _dims(name, input, d)
    if len(weight.shape) != d + 2:
        raise ShapeError(f"{name}: the weight of shape {tuple(weight.shape)} must have 4 "
                         f"axes (in, out / groups, kh, kw)")
    stride, dilation = _tuple(name, "stride", stride, d), _tuple(name, "dilation", dilation, d)
    pad, extra = _tuple(name, "padding", padding, d), _tuple(name, "output_padding",
                                                             output_padding, d)
    if any(e >= max(s, r) for e, s, r in zip(extra, stride, dilation)):
        raise ValueError(f"{name}: output_padding {extra} must be smaller than the stride "
                         f"{stride} or the dilation {dilation}")
    size = tuple((input.shape[-d + i] - 1) * stride[i] - 2 * pad[i] + dilation[i] *
                 (weight.shape[2 + i] - 1) + extra[i] + 1 for i in range(d))
    y = ops.conv_transpose(input, weight, size=size, stride=stride, padding=pad,
                           dilation=dilation, groups=groups)
    return _bias(y, bias, d)


def _no_ceil(name: str, ceil_mode: bool) -> None:
    if ceil_mode:
        raise NotImplementedError(f"{name}: ceil_mode=True is not supported (pad the input "
                                  f"on the high side instead)")


def max_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    """torch's ``max_pool2d`` (stride default: the kernel). Ties: the first maximum in the
    window (row-major) gets the derivative, as torch's."""
    name = "max_pool2d"
    _dims(name, input, 2)
    _no_ceil(name, ceil_mode)
    if return_indices:
        raise NotImplementedError(f"{name}: return_indices=True is not supported")
    kernel = _tuple(name, "kernel_size", kernel_size, 2)
    stride = kernel if stride is None else _tuple(name, "stride", stride, 2)
    return ops.max_pool(input, kernel, stride, _tuple(name, "padding", padding, 2),
                        _tuple(name, "dilation", dilation, 2))


def avg_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> Any:
    """torch's ``avg_pool2d`` (stride default: the kernel; the padding counted in the
    divisor unless ``count_include_pad=False``)."""
    name = "avg_pool2d"
    _dims(name, input, 2)
    _no_ceil(name, ceil_mode)
    if divisor_override is not None:
        raise NotImplementedError(f"{name}: divisor_override is not supported (scale the "
                                  f"result)")
    kernel = _tuple(name, "kernel_size", kernel_size, 2)
    stride = kernel if stride is None else _tuple(name, "stride", stride, 2)
    return ops.avg_pool(input, kernel, stride, _tuple(name, "padding", padding, 2),
                        count_include_pad)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Any:
    """torch's ``adaptive_avg_pool2d``: the mean over torch's windows
    ``[floor(i H / h), ceil((i + 1) H / h))`` to the spatial shape ``output_size`` (an
    int, or a pair whose None entries keep that axis)."""
    _dims("adaptive_avg_pool2d", input, 2)
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return ops.adaptive_avg_pool(input, size)

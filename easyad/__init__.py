"""easyad: automatic differentiation for numeric Python.

Public API only (no logic here). Layers, each depending on the ones before:
rules (_rules.py) -> compiled core (_core: Trace, Record, WengertList, generic functions)
-> numeric protocols (numeric.py) -> tensors (easyad/tensor: Tensor on numpy or OpenCL)
-> neural networks (easyad/nn: modules, losses; easyad/optim: optimizers, schedulers;
easyad/random: the seeded generator they draw from).
"""
from easyad._core import (
    Derivatives,
    Record,
    Trace,
    WengertList,
    abs,
    absolute,
    acos,
    acosh,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    cbrt,
    cos,
    cosh,
    erf,
    exp,
    expm1,
    hypot,
    ln,
    log,
    log1p,
    log2,
    log10,
    maximum,
    minimum,
    pow,
    power,
    sin,
    sinh,
    sqrt,
    tan,
    tanh,
    where,
)
from easyad.errors import ShapeError, StaleRecordError, TapeMismatchError
from easyad.numeric import Numeric, Real
from easyad.tensor import (
    Device,
    Tensor,
    TraceTensor,
    amax,
    amin,
    concatenate,
    devices,
    eval_shape,
    get_device,
    log_softmax,
    logsumexp,
    mean,
    set_device,
    softmax,
    stack,
    sum,
)

# subpackages, last: they build on the names above (pure Python, numpy only)
from easyad import nn, optim, random  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Derivatives", "Numeric", "Real", "Record", "StaleRecordError", "TapeMismatchError",
    "Trace", "WengertList",
    "abs", "absolute", "acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
    "arctan2", "arctanh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "cos", "cosh",
    "erf", "exp", "expm1", "hypot", "ln", "log", "log1p", "log2", "log10", "maximum",
    "minimum", "pow", "power", "sin", "sinh", "sqrt", "tan", "tanh", "where",
    # tensors
    "Device", "ShapeError", "Tensor", "TraceTensor", "amax", "amin", "concatenate", "devices", "eval_shape",
    "get_device", "log_softmax", "logsumexp", "mean", "set_device", "softmax", "stack", "sum",
    # neural networks
    "nn", "optim", "random",
]

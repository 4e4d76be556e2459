"""easyad: exact derivatives of ordinary numeric Python.

Write a function once with ``+ - * /``, ``**`` and the ``ad.`` functions (``ad.sin``,
``ad.exp``, ``ad.sum``...); it runs on floats, numpy arrays, forward-mode ``Trace``
objects, reverse-mode ``Record`` objects and ``Tensor`` objects on numpy or an OpenCL device::

    import numpy as np
    import easyad as ad

    def f(x):
        return ad.sum(ad.sin(x) * x ** 2)

    ad.grad(f)(np.array([0.5, 1.0]))         # reverse mode: the gradient
    ad.jvp(f, np.array([0.5, 1.0]), np.array([1.0, 0.0]))   # forward mode: f, df.v
    F = ad.record(f, np.ones(2))              # record once ...
    F.gradient(np.array([0.3, 0.7]))          # ... replay at new points, batches, Hessians

Where to start: ``ad.grad``, ``ad.value_and_grad``, ``ad.jacobian``, ``ad.hessian``,
``ad.jvp``/``ad.vjp`` (the functional API); ``ad.Trace`` and ``ad.WengertList`` with
``Record`` (dual numbers and the tape, by hand); ``ad.record`` -> ``Function`` /
``TensorFunction`` (record once, replay, ``compile()``); ``ad.Tensor`` and ``ad.devices()``
(arrays on numpy or OpenCL); ``easyad.nn`` and ``easyad.optim`` (networks, optimizers);
``ad.define``/``ad.primitive`` (your own operations with their derivatives);
``ad.check_gradients`` (finite-difference checks). Errors are ``easyad.errors``'
exceptions, each naming the problem and its fix.

The documentation (docs/, ``make docs``) has a getting-started page, one page per topic,
and docs/internals.md on how the library is built. ``python -m easyad`` runs a tour.
"""
# Public names only, no logic. The layers below (tables -> engine -> devices -> program
# compiler -> tensors -> recorded functions -> transforms -> nn/optim) are docs/internals.md's
# map of the package, which tests/test_layers.py checks against the imports.
from easyad._core import Derivatives, Record, Trace, WengertList, where
from easyad._core import Comparison
# the generic function ad.<rule> of every row of the rule table (and its aliases), with
# their __all__: rendered from easyad/_rules.py at build time (codegen/api.py)
from easyad._generated import functions as _functions
from easyad._generated.functions import *  # noqa: F403
# registered with the core, which calls up to them: lst.to_dot(), create_graph=True,
# numpy's ufuncs on Traces and Records
from easyad import _higher, _ufuncs, dot  # noqa: F401
from easyad.anomaly import detect_anomaly
from easyad.checks import check_gradients
from easyad.errors import (
    AnomalyError,
    BranchChangedError,
    CompilerWarning,
    ConvergenceError,
    DeviceError,
    GradientCheckError,
    KernelFallbackWarning,
    PowDomainError,
    ShapeError,
    StaleRecordError,
    TapeFormatError,
    TapeMismatchError,
)
from easyad.functional import (derivative, grad, hessian, hvp, jacobian, jvp, value_and_grad,
                               vjp)
from easyad.numeric import Numeric, Real
from easyad.primitives import Primitive, define, primitive
from easyad.replay import Function, load, record
from easyad._recorded import TensorFunction
from easyad.taylor import Taylor, taylor  # after the module: ad.taylor is the function
from easyad.tensor import (
    ArrayPrimitive,
    Device,
    ShapeDtype,
    Tensor,
    TraceTensor,
    amax,
    amin,
    concatenate,
    device_report,
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

# the op table (above the tensors: its calls run on them)
from easyad.ops import cumsum, flip  # noqa: E402
from easyad import linalg  # noqa: E402  (its ops join the table)
from easyad.ops import (  # noqa: E402  numpy's functions on tensors
    argmax, argmin, argsort, broadcast_to, clip, cumprod, diag, diagonal, einsum,
    expand_dims, inner, kron, moveaxis, order_by, outer, pad, prod, repeat, roll, sort,
    split, squeeze, std, swapaxes, take, take_along_axis, tensordot, tile, trace, tril,
    triu, var,
)

# subpackages, last: they build on the names above (pure Python, numpy only)
from easyad import data, nn, optim, random  # noqa: E402
from easyad import scipy  # noqa: E402  (SciPy with easyad's derivatives)
from easyad import distributed  # noqa: E402  (dask arrays in, dask arrays out; dask lazily)
from easyad.transforms.checkpoint import checkpoint  # noqa: E402
from easyad.transforms.checkpoint_scan import fori_loop, scan  # noqa: E402
# implicit differentiation; its module also puts ad.linalg.cg and ad.linalg.gmres in place
from easyad.transforms.implicit import custom_root, fixed_point  # noqa: E402
from easyad.transforms import implicit_linear as _implicit_linear  # noqa: E402, F401
from easyad.transforms.vmap import vmap  # noqa: E402  (issue 27's transforms)

from easyad._version import __version__ as __version__  # noqa: E402  (re-exported)

__all__ = [
    "BranchChangedError", "Comparison", "Derivatives", "Function", "TensorFunction",
    "GradientCheckError",
    "Numeric", "Real", "Record", "ShapeError", "DeviceError", "StaleRecordError",
    "TapeMismatchError",
    "Trace", "WengertList", "hessian", "hvp", "load", "record",
    "Primitive", "ArrayPrimitive", "define", "primitive", "AnomalyError", "detect_anomaly",
    "TapeFormatError", "PowDomainError", "where", "CompilerWarning", "KernelFallbackWarning",
    # the functional API, its check, Taylor mode
    "derivative", "grad", "value_and_grad", "jacobian", "jvp", "vjp",
    "check_gradients", "Taylor", "taylor",
    # tensors
    "Device", "Tensor", "TraceTensor", "amax", "amin", "concatenate", "devices", "device_report",
    "eval_shape", "ShapeDtype", "get_device", "log_softmax", "logsumexp", "mean", "set_device",
    "softmax", "stack", "sum",
    # the op table's ops
    "cumsum", "flip",
    # differentiable linear algebra (a subpackage, as nn)
    "linalg",
    # SciPy with easyad's derivatives: minimize, least_squares, ode_jacobian, special
    "scipy",
    # recorded functions over dask arrays and clusters (dask imported only when used)
    "distributed",
    # numpy's functions on tensors (easyad/ops/_sorting.py, _npfunctions.py, _products.py)
    "argmax", "argmin", "argsort", "broadcast_to", "clip", "cumprod", "diag", "diagonal",
    "einsum", "expand_dims", "inner", "kron", "moveaxis", "order_by", "outer", "pad",
    "prod", "repeat", "roll", "sort", "split", "squeeze", "std", "swapaxes",
    "take", "take_along_axis", "tensordot", "tile", "trace", "tril", "triu", "var",
    # neural networks
    "data", "nn", "optim", "random",
    # transforms (easyad/transforms/)
    "checkpoint", "fori_loop", "scan",
    # implicit differentiation (easyad/transforms/implicit.py)
    "custom_root", "fixed_point", "ConvergenceError",
    # the transforms of easyad/transforms/
    "vmap",
]
__all__ += _functions.__all__   # the rule table's functions (a form static tools follow)

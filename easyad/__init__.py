"""easyad: automatic differentiation for numeric Python.

Public API only (no logic here). Layers, each depending on the ones before:
rules (_rules.py) -> compiled core (_core: Trace, Record, WengertList, generic functions,
replay sweeps) -> numeric protocols (numeric.py) -> functional API (functional.py: grad,
jacobian, jvp, vjp; checks.py; taylor.py), record/replay (replay.py: Function, hessian,
hvp), higher order (_higher.py), user primitives (primitives.py), pictures (dot.py),
debugging (anomaly.py) -> tensors (easyad/tensor: Tensor on numpy or OpenCL)
-> neural networks (easyad/nn: modules, losses; easyad/optim: optimizers, schedulers;
easyad/random: the seeded generator they draw from).
"""
from easyad._core import Derivatives, Record, Trace, WengertList, where
from easyad._core import Comparison
# the generic function ad.<rule> of every row of the rule table (and its aliases), with
# their __all__: rendered from easyad/_rules.py at build time (codegen/api.py)
from easyad._generated import functions as _functions
from easyad._generated.functions import *  # noqa: F403
# registered with the core, which calls up to them: lst.to_dot(), create_graph=True
from easyad import _higher, dot  # noqa: F401
from easyad.anomaly import detect_anomaly
from easyad.checks import check_gradients
from easyad.errors import (
    AnomalyError,
    BranchChangedError,
    CompilerWarning,
    DeviceError,
    GradientCheckError,
    KernelFallbackWarning,
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

# subpackages, last: they build on the names above (pure Python, numpy only)
from easyad import nn, optim, random  # noqa: E402

from easyad._version import __version__ as __version__  # noqa: E402  (re-exported)

__all__ = [
    "BranchChangedError", "Comparison", "Derivatives", "Function", "TensorFunction",
    "GradientCheckError",
    "Numeric", "Real", "Record", "ShapeError", "DeviceError", "StaleRecordError",
    "TapeMismatchError",
    "Trace", "WengertList", "hessian", "hvp", "load", "record",
    "Primitive", "ArrayPrimitive", "define", "primitive", "AnomalyError", "detect_anomaly",
    "TapeFormatError", "where", "CompilerWarning", "KernelFallbackWarning",
    # the functional API, its check, Taylor mode
    "derivative", "grad", "value_and_grad", "jacobian", "jvp", "vjp",
    "check_gradients", "Taylor", "taylor",
    # tensors
    "Device", "Tensor", "TraceTensor", "amax", "amin", "concatenate", "devices", "device_report",
    "eval_shape", "ShapeDtype", "get_device", "log_softmax", "logsumexp", "mean", "set_device",
    "softmax", "stack", "sum",
    # neural networks
    "nn", "optim", "random",
]
__all__ += _functions.__all__   # the rule table's functions (a form static tools follow)

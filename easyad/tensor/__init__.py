"""Tensors: arrays on a device (numpy or OpenCL), differentiated on the same WengertList as
scalar Records, or in forward mode as TraceTensors.

Layers, each importing only those before it (``tests/test_layers.py`` checks):
``_shapes`` (shape arithmetic, ShapeError), ``_steps`` (Step: a recorded operation's vjp
as data), ``_buffers``, ``_composed`` -> backends
``_meta`` / ``_numpy`` / ``_opencl`` (kernels rendered by ``_kernels`` from the rule table
and ``_kernels_matmul``; the OpenCL backend assembled from ``_cl_memory``, ``_cl_matmul``
and ``_cl_errors``), all conforming to ``_backend.Backend`` -> ``_devices`` (device
choice; imports a backend when first asked for it) -> ``_base`` (TensorBase: storage,
recording) -> the operations
``_elementwise`` (rule kernels), ``_structural`` (reductions, matmul, reshape, indexing,
joins, where), ``_fused`` (linear, cross_entropy, sigmoid), ``_generic`` (ad.sum...) ->
``_tensor`` (Tensor = TensorBase + the generated ``_rule_methods.RuleMethods`` + methods
calling the operations) -> ``_trace`` (TraceTensor) -> ``_functions`` (softmax family,
eval_shape, ShapeDtype) -> ``_custom`` (ArrayPrimitive: user array operations, registered
with ``easyad.primitives``). ``_parameters`` (ParameterValues: a trainable parameter's
values on the host or a device, for nn and optim) sits on ``_devices``. (A scalar tape
rendered into one OpenCL kernel for batched gradients: ``compiler/tape/render_cl.py``.)

``linear``, ``cross_entropy`` and ``sigmoid`` are the fused operations ``easyad.nn`` uses
(one tape entry each).
"""
from easyad.tensor._custom import ArrayPrimitive
from easyad.tensor._devices import Device, device_report, devices, get_device, set_device
from easyad.tensor._fused import add_channel_bias, cross_entropy, linear, sigmoid
from easyad.tensor._functions import (ShapeDtype, amax, amin, concatenate, eval_shape,
                                      log_softmax, logsumexp, mean, softmax, stack, sum)
from easyad.tensor._parameters import ParameterValues, host_copy
from easyad.tensor._tensor import (Tensor, recorded_effect, recorded_host_value,
                                   recorded_parameter)
from easyad.tensor._trace import TraceTensor

__all__ = ["ArrayPrimitive", "Device", "ParameterValues", "ShapeDtype", "Tensor",
           "add_channel_bias", "amax",
           "amin", "concatenate",
           "cross_entropy",
           "device_report", "devices", "eval_shape", "linear", "sigmoid",
           "get_device", "host_copy", "log_softmax", "logsumexp", "mean", "recorded_effect",
           "recorded_host_value",
           "recorded_parameter",
           "set_device", "softmax", "stack",
           "sum", "TraceTensor"]

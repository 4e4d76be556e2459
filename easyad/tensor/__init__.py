"""Tensors: arrays on a device (numpy or OpenCL), differentiated on the same WengertList as
scalar Records, or in forward mode as TraceTensors.

Layers: ``_shapes`` (shape arithmetic, ShapeError) -> ``_devices`` (device choice) ->
backends ``_numpy`` / ``_opencl`` (kernels rendered by ``_kernels`` from the rule table) ->
``_tensor`` (Tensor, recording, the rule-generated elementwise ops) -> ``_structural``
(reductions, matmul, reshape, indexing, joins, where) -> ``_functions`` (ad.sum...,
softmax family, eval_shape) and ``_trace`` (TraceTensor). ``_replay_cl`` renders a scalar
tape into one OpenCL kernel for batched gradients.
"""
from easyad.tensor._devices import Device, device_report, devices, get_device, set_device
from easyad.tensor._functions import (amax, amin, concatenate, eval_shape, log_softmax,
                                      logsumexp, mean, softmax, stack, sum)
from easyad.tensor._tensor import Tensor
from easyad.tensor._trace import TraceTensor

__all__ = ["Device", "Tensor", "amax", "amin", "concatenate", "device_report", "devices",
           "eval_shape",
           "get_device", "log_softmax", "logsumexp", "mean", "set_device", "softmax", "stack",
           "sum", "TraceTensor"]

"""Neural networks on easyad tensors: modules, parameters, losses (``ad.nn``).

Sits on top of the tensors: a module's parameters are numpy arrays that become tensor
variables on the step's WengertList when the model is called with it, and the optimizers
of ``ad.optim`` update them from that list's derivatives. One training step::

    lst = ad.WengertList()
    loss = nn.functional.cross_entropy(model(x, tape=lst), y)
    opt.step(loss.derivatives())

Layout: ``_parameter`` (Parameter) -> ``_module`` (Module, Sequential) -> ``functional``
(activations, linear, dropout, losses; ``_fused`` has single-entry versions for the numpy
device; ``_conv_functional``: convolution and pooling; ``_norm_functional``: norms,
embedding, attention) -> ``_layers`` (Linear, ReLU, ...), ``_conv_layers`` (Conv2d,
MaxPool2d, Flatten, ...), ``_norm_layers`` (LayerNorm, BatchNorm2d, Embedding, ...),
``_attention`` (MultiheadAttention); ``init`` (PyTorch's initialisations); ``utils``
(gradient clipping); ``_checkpoint`` (a model, optimizer and scheduler in one file).

Examples
--------
>>> import numpy as np, easyad as ad
>>> from easyad import nn
>>> _ = ad.random.seed(0)
>>> model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
>>> lst = ad.WengertList()
>>> loss = nn.mse_loss(model(np.ones((2, 3)), tape=lst), np.zeros((2, 1)))
>>> d = loss.derivatives()
>>> d[model[0].weight].shape
(4, 3)
"""
from easyad.nn import functional, init, utils
from easyad.nn._conv_layers import (AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d,
                                   ConvTranspose2d, Flatten, MaxPool2d)
from easyad.nn._attention import MultiheadAttention
from easyad.nn._checkpoint import load_checkpoint, save_checkpoint
from easyad.nn._layers import (GELU, Dropout, Identity, Linear, LogSoftmax, ReLU, Sigmoid,
                               Softmax, Tanh)
from easyad.nn._module import Function, Module, Sequential, as_module, functional_call
from easyad.nn._norm_layers import (BatchNorm1d, BatchNorm2d, Embedding, GroupNorm,
                                    LayerNorm)
from easyad.nn._parameter import Parameter
from easyad.nn.functional import (binary_cross_entropy, binary_cross_entropy_with_logits,
                                  cross_entropy, l1_loss, mse_loss, nll_loss)

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "Conv1d", "Conv2d", "ConvTranspose2d",
           "Flatten", "MaxPool2d",
           "BatchNorm1d", "BatchNorm2d", "Embedding", "GroupNorm", "LayerNorm",
           "MultiheadAttention", "load_checkpoint", "save_checkpoint",
           "Dropout", "Function", "GELU", "Identity", "Linear", "LogSoftmax", "Module",
           "Parameter", "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh", "as_module",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
           "functional", "functional_call", "init", "l1_loss", "mse_loss", "nll_loss", "utils"]

"""The op table: every tensor operation that is not elementwise, registered once (as
``easyad._rules`` holds the elementwise functions), and the interpreters that run a call
of one on whatever its operands are. ``_table``: the ``Op`` record, ``register``, the
lowering chooser; ``_apply``: the call (forward, reverse, every device, eval_shape,
ad.record, object arrays of scalars, batching); ``_builtin``: flip, cumsum,
concatenate; ``_structural``: reshape, transpose, sum, max, min, where, getitem, put and
matmul (the tensor layer's older operations, moved in);
``_linalg``, ``_linalg_spectral``: linear algebra (registered when ``easyad.linalg``, their
public face, is imported, which ``import easyad`` does);
``_sorting``: sort and order_by (table ops), argsort/argmax/argmin; ``_prod_ops``: prod,
cumprod and recurrence (table ops, which ``_npfunctions``' prod/cumprod call);
``_conv``: conv, conv_transpose and conv_weight (table ops: each one's derivatives are
the other two); ``_pool``: max_pool (with max_pool_gather/scatter, its derivatives),
avg_pool and its transpose, adaptive_avg_pool (a composition); ``_attention``: attention
(scaled dot-product, one op; its numpy kernels in ``_attention_cpu``); ``_npfunctions`` and
``_products``: numpy's reductions, shape functions and products on tensors, composed of
easyad operations (no table entry: every engine differentiates the pieces).

How to add an op: docs/internals.md ("How to add an op"); tests/test_add_an_op.py does it.
"""
from easyad.ops._table import OPS, Loop, Op, get, register, unregister
from easyad.ops._apply import OpStep, apply, batched, call
from easyad.ops._builtin import cumsum, flip
from easyad.ops import _structural  # noqa: F401  (reshape, transpose, sum, max, min)
from easyad.ops._sorting import argmax, argmin, argsort, order_by, sort
from easyad.ops._npfunctions import (broadcast_to, clip, cumprod, diag, diagonal,
                                     expand_dims, moveaxis, pad, prod, repeat, roll, split,
                                     squeeze, std, swapaxes, take, take_along_axis, tile,
                                     trace, tril, triu, var)
from easyad.ops._products import einsum, inner, kron, outer, tensordot
from easyad.ops._conv import conv, conv_transpose
from easyad.ops._pool import adaptive_avg_pool, avg_pool, max_pool
from easyad.ops import _lstm  # noqa: F401  (lstm_scan, lstm_scan_vjp: nn.lstm calls them)
from easyad.ops import _attention  # noqa: F401  (attention: nn.functional's sdpa calls it)

__all__ = ["OPS", "Loop", "Op", "OpStep", "apply", "batched", "call", "cumsum", "flip", "get",
           "register", "unregister",
           # numpy's functions on tensors (NUMPY_FUNCTIONS entries), each also ad.<name>
           "argmax", "argmin", "argsort", "broadcast_to", "clip", "cumprod", "diag",
           "diagonal", "einsum", "expand_dims", "inner", "kron", "moveaxis", "order_by",
           "outer", "pad", "prod", "repeat", "roll", "sort", "split", "squeeze", "std",
           "swapaxes", "take", "take_along_axis", "tensordot", "tile", "trace", "tril",
           "triu", "var",
           # convolution and pooling (nn.functional's conv2d, max_pool2d... call these)
           "adaptive_avg_pool", "avg_pool", "conv", "conv_transpose", "max_pool"]

"""The op table: every tensor operation that is not elementwise, registered once (as
``easyad._rules`` holds the elementwise functions), and the interpreters that run a call
of one on whatever its operands are. ``_table``: the ``Op`` record, ``register``, the
lowering chooser; ``_apply``: the call (forward, reverse, every device, eval_shape,
ad.record, object arrays of scalars, batching); ``_builtin``: the ops themselves;
``_linalg``, ``_linalg_spectral``: linear algebra (registered when ``easyad.linalg``, their
public face, is imported, which ``import easyad`` does).

How to add an op: docs/internals.md ("How to add an op"); tests/test_add_an_op.py does it.
"""
from easyad.ops._table import OPS, Op, get, register, unregister
from easyad.ops._apply import OpStep, apply, batched, call
from easyad.ops._builtin import cumsum, flip

__all__ = ["OPS", "Op", "OpStep", "apply", "batched", "call", "cumsum", "flip", "get",
           "register", "unregister"]

"""The transforms that rewrite a whole function, each in one module of its own.

``functional.py`` holds the derivative transforms (grad, jacobian, hessian, jvp, vjp);
this package holds those built on them and on the op table:

- ``vmap.py``: ``ad.vmap``, a function mapped over a batch axis by the op table's
  batching rules (an interpreter, not a Python loop);
- ``sparse.py``: sparse Jacobians and Hessians of recorded functions (pattern,
  colouring, compressed sweeps, ``scipy.sparse`` results);
- ``checkpoint.py``: ``ad.checkpoint`` and loops with binomial checkpointing;
- ``implicit.py``: implicit differentiation (``ad.custom_root``, ``ad.fixed_point``,
  matrix-free linear solves).

Each module's public names are re-exported by ``easyad/__init__.py``.
"""

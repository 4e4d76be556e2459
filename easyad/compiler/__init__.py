"""The program compiler: recorded programs (scalar tapes and tensor programs) optimised and
rendered as C (the numpy device) or OpenCL (OpenCL devices), built once and cached.

- ``tape``: the scalar tape's compiler (``Function.compile`` and its gradient, Hessian and
  batch kernels): its optimiser, the second-order builder, the C renderer and the loader
  of the built library.
- ``program``: the tensor program's compiler (``TensorFunction``): grouping and buffer
  planning, and one renderer with a C and an OpenCL dialect.

Both print constants with ``easyad._csyntax`` and use the strong zero of ``_helpers.h``.
"""

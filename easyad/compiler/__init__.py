"""The program compiler: recorded programs (scalar tapes and tensor programs) optimised and
rendered as C (the numpy device) or OpenCL (OpenCL devices), built once and cached.

- ``ir``: the one program format (``Node`` with typed params, ``Graph``), with the scalar
  tape's front end (``from_tape``) and back end (``to_tape``); the tensor ``Program`` is
  a ``Graph``.
- ``optimiser``: the one optimiser on the IR (constants folded, common subexpressions,
  exact identities, dead nodes), for both kinds of program.
- ``tape``: the scalar tape's compiler (``Function.compile`` and its gradient, Hessian and
  batch kernels): the optimiser's entry for tapes, the second-order builder, the C
  renderer and the loader of the built library.
- ``program``: the tensor program's compiler (``TensorFunction``): the optimiser run
  first, then grouping and buffer planning, and one renderer with a C and an OpenCL
  dialect.

Both print constants with ``easyad._csyntax`` and use the strong zero of ``_helpers.h``.
"""

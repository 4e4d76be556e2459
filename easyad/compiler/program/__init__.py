"""The tensor program's compiler (``TensorFunction``): grouping and buffer planning, and one
renderer with a C and an OpenCL dialect.

- ``plan``: the scheduler, after ``compiler.optimiser`` (groups, loops, what is stored,
  recomputed, shared).
- ``cstyle``: the dialects (``CDialect``, ``OpenCLDialect``) and the renderer (C's form).
- ``render_cl``: the OpenCL renderer (a kernel per group; ``points``: over a batch).
- ``vector_cl``: the vector widths and builtins proven on an OpenCL device.
- ``fused_c``, ``fused_cl``, ``batch_cl``: the executors (numpy device, OpenCL device,
  OpenCL batches).
"""

"""The tensor program's compiler (``TensorFunction``): grouping and buffer planning, and one
renderer with a C and an OpenCL dialect."""

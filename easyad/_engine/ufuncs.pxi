# ---- numpy ufuncs of the strong-zero helpers (mul0, div0), for the numpy tensor backend ----
# One pass in C with _helpers.h's very definitions, instead of numpy's masks (four to five
# passes and a temporary per call). float64 and float32 loops; numpy casts other inputs.

cdef extern from "numpy/ufuncobject.h":
    int _easyad_import_umath "_import_umath" () except -1

cdef inline float _mul0_f(float a, float b) noexcept nogil:
    return 0.0 if (a == 0.0 or b == 0.0) else a * b

cdef inline float _div0_f(float a, float b) noexcept nogil:
    return 0.0 if a == 0.0 else a / b


cdef void _loop_mul0_d(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps,
                       void* data) noexcept nogil:
    cdef cnp.npy_intp i, n = dims[0]
    cdef char* a = args[0]
    cdef char* b = args[1]
    cdef char* o = args[2]
    cdef double* x
    cdef double* y
    cdef double* z
    if (steps[0] == sizeof(double) and steps[1] == sizeof(double)
            and steps[2] == sizeof(double)):      # contiguous: a loop GCC vectorises
        x, y, z = <double*>a, <double*>b, <double*>o
        for i in range(n):
            z[i] = mul0(x[i], y[i])
        return
    for i in range(n):
        (<double*>o)[0] = mul0((<double*>a)[0], (<double*>b)[0])
        a += steps[0]
        b += steps[1]
        o += steps[2]


cdef void _loop_mul0_f(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps,
                       void* data) noexcept nogil:
    cdef cnp.npy_intp i, n = dims[0]
    cdef char* a = args[0]
    cdef char* b = args[1]
    cdef char* o = args[2]
    cdef float* x
    cdef float* y
    cdef float* z
    if (steps[0] == sizeof(float) and steps[1] == sizeof(float)
            and steps[2] == sizeof(float)):      # contiguous: a loop GCC vectorises
        x, y, z = <float*>a, <float*>b, <float*>o
        for i in range(n):
            z[i] = _mul0_f(x[i], y[i])
        return
    for i in range(n):
        (<float*>o)[0] = _mul0_f((<float*>a)[0], (<float*>b)[0])
        a += steps[0]
        b += steps[1]
        o += steps[2]


cdef void _loop_div0_d(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps,
                       void* data) noexcept nogil:
    cdef cnp.npy_intp i, n = dims[0]
    cdef char* a = args[0]
    cdef char* b = args[1]
    cdef char* o = args[2]
    cdef double* x
    cdef double* y
    cdef double* z
    if (steps[0] == sizeof(double) and steps[1] == sizeof(double)
            and steps[2] == sizeof(double)):      # contiguous: a loop GCC vectorises
        x, y, z = <double*>a, <double*>b, <double*>o
        for i in range(n):
            z[i] = div0(x[i], y[i])
        return
    for i in range(n):
        (<double*>o)[0] = div0((<double*>a)[0], (<double*>b)[0])
        a += steps[0]
        b += steps[1]
        o += steps[2]


cdef void _loop_div0_f(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps,
                       void* data) noexcept nogil:
    cdef cnp.npy_intp i, n = dims[0]
    cdef char* a = args[0]
    cdef char* b = args[1]
    cdef char* o = args[2]
    cdef float* x
    cdef float* y
    cdef float* z
    if (steps[0] == sizeof(float) and steps[1] == sizeof(float)
            and steps[2] == sizeof(float)):      # contiguous: a loop GCC vectorises
        x, y, z = <float*>a, <float*>b, <float*>o
        for i in range(n):
            z[i] = _div0_f(x[i], y[i])
        return
    for i in range(n):
        (<float*>o)[0] = _div0_f((<float*>a)[0], (<float*>b)[0])
        a += steps[0]
        b += steps[1]
        o += steps[2]


cdef cnp.PyUFuncGenericFunction _mul0_loops[2]
cdef cnp.PyUFuncGenericFunction _div0_loops[2]
cdef char _ufunc_types[6]
cdef void* _ufunc_data[2]
# float32 first: numpy takes the first loop its inputs cast to safely
_mul0_loops[0] = <cnp.PyUFuncGenericFunction>_loop_mul0_f
_mul0_loops[1] = <cnp.PyUFuncGenericFunction>_loop_mul0_d
_div0_loops[0] = <cnp.PyUFuncGenericFunction>_loop_div0_f
_div0_loops[1] = <cnp.PyUFuncGenericFunction>_loop_div0_d
_ufunc_types[:] = [cnp.NPY_FLOAT, cnp.NPY_FLOAT, cnp.NPY_FLOAT,
                   cnp.NPY_DOUBLE, cnp.NPY_DOUBLE, cnp.NPY_DOUBLE]
_ufunc_data[0] = NULL
_ufunc_data[1] = NULL
_easyad_import_umath()

_mul0_ufunc = cnp.PyUFunc_FromFuncAndData(
    _mul0_loops, _ufunc_data, _ufunc_types, 2, 2, 1, cnp.PyUFunc_None, b"mul0",
    b"mul0(a, b): a * b, but 0 where a or b is 0 (even against inf or NaN)", 0)
_div0_ufunc = cnp.PyUFunc_FromFuncAndData(
    _div0_loops, _ufunc_data, _ufunc_types, 2, 2, 1, cnp.PyUFunc_None, b"div0",
    b"div0(a, b): a / b, but 0 where a is 0", 0)

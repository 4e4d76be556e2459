# ---- numpy ufuncs of the strong-zero helpers (mul0, div0), for the numpy tensor backend ----
# One pass in C, instead of numpy's masks (four to five passes and a temporary per call).
# float32 and float64 loops; numpy casts other inputs. The loops are written so GCC
# vectorises them (the product computed, then selected: no short-circuit), with the
# contiguous and the scalar-operand cases apart; mul0/div0 are _helpers.h's, as in C.
# On x86-64 Linux (glibc) each loop is also compiled for AVX2 and AVX-512, chosen when the
# module loads (target_clones): the baseline build has SSE2 only, half numpy's vector width
# (its own loops dispatch the same way), and div0 is bound by the divider's throughput.
# Every clone computes the same IEEE products and quotients (no FMA): identical results.

cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__has_attribute)
    #if __has_attribute(target_clones)
    #define EASYAD_UFUNC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
    #endif
    #endif
    #ifndef EASYAD_UFUNC_CLONES
    #define EASYAD_UFUNC_CLONES
    #endif
    #define EASYAD_UFUNC_LOOP(NAME, T, EXPR)                                              \
    EASYAD_UFUNC_CLONES static void NAME(char **args, npy_intp const *dims, npy_intp const *steps, void *d) { \
        npy_intp i, n = dims[0];                                                        \
        char *pa = args[0], *pb = args[1], *po = args[2];                               \
        npy_intp sa = steps[0], sb = steps[1], so = steps[2];                           \
        (void)d;                                                                        \
        if (sa == sizeof(T) && sb == sizeof(T) && so == sizeof(T)) {                    \
            const T *x = (const T *)pa, *y = (const T *)pb; T *z = (T *)po;              \
            for (i = 0; i < n; i++) { T a = x[i], b = y[i]; z[i] = (EXPR); }             \
        } else if (sa == sizeof(T) && sb == 0 && so == sizeof(T)) {                     \
            const T *x = (const T *)pa; const T b = *(const T *)pb; T *z = (T *)po;      \
            for (i = 0; i < n; i++) { T a = x[i]; z[i] = (EXPR); }                       \
        } else if (sa == 0 && sb == sizeof(T) && so == sizeof(T)) {                     \
            const T a = *(const T *)pa; const T *y = (const T *)pb; T *z = (T *)po;      \
            for (i = 0; i < n; i++) { T b = y[i]; z[i] = (EXPR); }                       \
        } else {                                                                        \
            for (i = 0; i < n; i++, pa += sa, pb += sb, po += so) {                     \
                T a = *(const T *)pa, b = *(const T *)pb; *(T *)po = (EXPR);             \
            }                                                                           \
        }                                                                               \
    }
    /* mul0 and div0 of _helpers.h (its EASYAD_MUL0/EASYAD_DIV0: the one definition), as
       selects of computed values (vectorisable). The product or quotient is computed in
       every lane, so a lane the helper zeroes (0 * inf, 0 / 0) may raise a floating-point
       flag: the backend runs its kernels with numpy's errors ignored, and a caller that
       does not may see a RuntimeWarning */
    #include "_helpers.h"
    EASYAD_UFUNC_LOOP(easyad_loop_mul0_d, double, EASYAD_MUL0(double, a, b))
    EASYAD_UFUNC_LOOP(easyad_loop_mul0_f, float, EASYAD_MUL0(float, a, b))
    EASYAD_UFUNC_LOOP(easyad_loop_div0_d, double, EASYAD_DIV0(double, a, b))
    EASYAD_UFUNC_LOOP(easyad_loop_div0_f, float, EASYAD_DIV0(float, a, b))
    """
    void easyad_loop_mul0_d(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps, void* d)
    void easyad_loop_mul0_f(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps, void* d)
    void easyad_loop_div0_d(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps, void* d)
    void easyad_loop_div0_f(char** args, cnp.npy_intp* dims, cnp.npy_intp* steps, void* d)

cdef extern from "numpy/ufuncobject.h":
    int _easyad_import_umath "_import_umath" () except -1

cdef cnp.PyUFuncGenericFunction _mul0_loops[2]
cdef cnp.PyUFuncGenericFunction _div0_loops[2]
cdef char _ufunc_types[6]
cdef void* _ufunc_data[2]
# float32 first: numpy takes the first loop its inputs cast to safely
_mul0_loops[0] = <cnp.PyUFuncGenericFunction>easyad_loop_mul0_f
_mul0_loops[1] = <cnp.PyUFuncGenericFunction>easyad_loop_mul0_d
_div0_loops[0] = <cnp.PyUFuncGenericFunction>easyad_loop_div0_f
_div0_loops[1] = <cnp.PyUFuncGenericFunction>easyad_loop_div0_d
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


# ---- a rule's values on float64 arrays, as the replay sweeps compute them ----
# numpy's meaning of a row numpy has no ufunc for (erf, expit, digamma...): the table's C,
# IEEE values (inf, NaN) and no Python error, as numpy's own ufuncs give on arrays.
def _rule_values(int op, x, y=0.0):
    """Opcode ``op``'s value on float64 arrays ``x`` (and ``y``), broadcast together."""
    cdef cnp.ndarray xa, ya, out, p0, p1
    cdef long n
    xb, yb = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    shape = xb.shape
    xa = np.ascontiguousarray(xb)
    ya = np.ascontiguousarray(yb)
    out = np.empty(shape, dtype=np.float64)
    n = xa.size
    if n == 0:
        return out
    p0 = np.empty(n, dtype=np.float64)   # the loop writes (zero) partials it is not asked for
    p1 = np.empty(n, dtype=np.float64)
    with nogil:
        easyad_rule_eval_affine(op, n, <const double*>cnp.PyArray_DATA(xa), 1,
                                <const double*>cnp.PyArray_DATA(ya), 1,
                                <double*>cnp.PyArray_DATA(out), <double*>cnp.PyArray_DATA(p0),
                                <double*>cnp.PyArray_DATA(p1), 0, 0)
    return out

# Matrix products on the AVX-512 kernels of _gemm.h (see there, and tensor/_blas.py for
# when the numpy backend uses them instead of numpy's BLAS).

cdef extern from "_gemm.h" nogil:
    int easyad_gemm_supported()
    void easyad_gemm_f64(long M, long N, long K, const double* A, long ai, long ak,
                         const double* B, long bk, long bn, double* C, long ldc)
    void easyad_gemm_f32(long M, long N, long K, const float* A, long ai, long ak,
                         const float* B, long bk, long bn, float* C, long ldc)

GEMM_SUPPORTED = bool(easyad_gemm_supported())


def _gemm(a, b):
    """``a @ b`` of two 2-D arrays of one dtype, float64 or float32, with any strides (a
    transpose is a view), as a new C-contiguous array, on the AVX-512 kernels; the GIL is
    released while they run. TypeError/ValueError for anything else."""
    if not GEMM_SUPPORTED:
        raise RuntimeError("this CPU lacks AVX-512 (F, VL, DQ) or FMA: use numpy.matmul")
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        raise TypeError("_gemm takes two numpy arrays")
    cdef cnp.ndarray x = <cnp.ndarray>a
    cdef cnp.ndarray y = <cnp.ndarray>b
    dtype = a.dtype
    if dtype != b.dtype or dtype not in (np.float64, np.float32):
        raise TypeError(f"_gemm takes two float64 or two float32 arrays, not {a.dtype} "
                        f"and {b.dtype}")
    if cnp.PyArray_NDIM(x) != 2 or cnp.PyArray_NDIM(y) != 2 or \
            cnp.PyArray_DIMS(x)[1] != cnp.PyArray_DIMS(y)[0]:
        raise ValueError(f"_gemm multiplies (M, K) by (K, N), not {a.shape} by {b.shape}")
    cdef long item = cnp.PyArray_ITEMSIZE(x)
    cdef cnp.npy_intp* sx = cnp.PyArray_STRIDES(x)
    cdef cnp.npy_intp* sy = cnp.PyArray_STRIDES(y)
    if sx[0] % item or sx[1] % item or sy[0] % item or sy[1] % item:
        raise ValueError("_gemm takes arrays whose strides are whole elements")
    cdef long m = cnp.PyArray_DIMS(x)[0], k = cnp.PyArray_DIMS(x)[1]
    cdef long n = cnp.PyArray_DIMS(y)[1]
    cdef cnp.ndarray out = np.empty((m, n), dtype)
    cdef long ai = sx[0] // item, ak = sx[1] // item, bk = sy[0] // item, bn = sy[1] // item
    cdef void* pa = cnp.PyArray_DATA(x)
    cdef void* pb = cnp.PyArray_DATA(y)
    cdef void* pc = cnp.PyArray_DATA(out)
    if item == 8:
        with nogil:
            easyad_gemm_f64(m, n, k, <const double*>pa, ai, ak, <const double*>pb, bk, bn,
                            <double*>pc, n)
    else:
        with nogil:
            easyad_gemm_f32(m, n, k, <const float*>pa, ai, ak, <const float*>pb, bk, bn,
                            <float*>pc, n)
    return out

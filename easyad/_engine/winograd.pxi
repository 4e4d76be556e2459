# Winograd F(2x2, 3x3) transforms (_winograd.h) for ops/_conv_winograd.py: each takes
# C-contiguous arrays of one dtype, float32 or float64, checks their shapes, and runs
# with the GIL released.

cdef extern from "_winograd.h" nogil:
    int easyad_wino_in_f32(const float* x, long n, long C, long H, long W, long Hv, long Wv,
                           long lo_h, long lo_w, long th, long tw, float* V, long T)
    int easyad_wino_in_f64(const double* x, long n, long C, long H, long W, long Hv,
                           long Wv, long lo_h, long lo_w, long th, long tw, double* V,
                           long T)
    int easyad_wino_in_t_f32(const float* x, long n, long C, long H, long W, long Hv,
                             long Wv, long lo_h, long lo_w, long th, long tw, float* V,
                             long T)
    int easyad_wino_in_t_f64(const double* x, long n, long C, long H, long W, long Hv,
                             long Wv, long lo_h, long lo_w, long th, long tw, double* V,
                             long T)
    int easyad_wino_conv_f32(const float* x, long n, long C, long H, long W, long Hv,
                             long Wv, long lo_h, long lo_w, long th, long tw,
                             const float* U, long Co, float* y, long Oh, long Ow,
                             void* gemm, int idx64)
    int easyad_wino_conv_f64(const double* x, long n, long C, long H, long W, long Hv,
                             long Wv, long lo_h, long lo_w, long th, long tw,
                             const double* U, long Co, double* y, long Oh, long Ow,
                             void* gemm, int idx64)
    int easyad_wino_wgrad_f32(const float* x, const float* g, long n, long C, long H,
                              long W, long Hv, long Wv, long lo_h, long lo_w, long th,
                              long tw, long Co, long Oh, long Ow, float* total, void* gemm,
                              int idx64)
    int easyad_wino_wgrad_f64(const double* x, const double* g, long n, long C, long H,
                              long W, long Hv, long Wv, long lo_h, long lo_w, long th,
                              long tw, long Co, long Oh, long Ow, double* total,
                              void* gemm, int idx64)
    int easyad_wino_out_f32(const float* M, long n, long C, long th, long tw, long T,
                            float* y, long Oh, long Ow)
    int easyad_wino_out_f64(const double* M, long n, long C, long th, long tw, long T,
                            double* y, long Oh, long Ow)
    int easyad_wino_grad_f32(const float* g, long n, long C, long Oh, long Ow, long th,
                             long tw, long T, float* Q)
    int easyad_wino_grad_f64(const double* g, long n, long C, long Oh, long Ow, long th,
                             long tw, long T, double* Q)


cdef _wino_check(str name, a, b, int a_dim, tuple planes):
    """a (a_dim axes) and b ``planes`` = (16, C, T): numpy, one float dtype, C-contiguous."""
    for v in (a, b):
        if type(v) is not np.ndarray or not (<cnp.ndarray>v).flags.c_contiguous:
            raise TypeError(f"{name} takes C-contiguous numpy arrays")
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} takes two float32 or two float64 arrays, not {a.dtype} "
                        f"and {b.dtype}")
    if a.ndim != a_dim or b.shape != planes:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not fit "
                         f"(planes {planes})")


def _wino_in(x, V, long Hv, long Wv, long lo_h, long lo_w, long th, long tw):
    """V (16, C, n*th*(tw+1)) = B^T d B of every input tile of x (n, C, H, W)."""
    _wino_check("_wino_in", x, V, 4, (16, x.shape[1], x.shape[0] * th * (tw + 1)))
    cdef long n = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    if not (0 <= Hv <= H and 0 <= Wv <= W and th >= 1 and tw >= 1):
        raise ValueError(f"_wino_in: rows {Hv} and columns {Wv} read of {H}x{W}, "
                         f"{th}x{tw} tiles")
    cdef long T = n * th * (tw + 1)
    cdef void* px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void* pv = cnp.PyArray_DATA(<cnp.ndarray>V)
    cdef int rc
    if x.dtype == np.float32:
        with nogil:
            rc = easyad_wino_in_f32(<const float*>px, n, C, H, W, Hv, Wv, lo_h, lo_w, th,
                                    tw, <float*>pv, T)
    else:
        with nogil:
            rc = easyad_wino_in_f64(<const double*>px, n, C, H, W, Hv, Wv, lo_h, lo_w, th,
                                    tw, <double*>pv, T)
    if rc:
        raise MemoryError("_wino_in: no memory for the phase planes")


def _wino_in_t(x, V, long Hv, long Wv, long lo_h, long lo_w, long th, long tw):
    """V (16, n*th*(tw+1), C) = B^T d B of every input tile of x (n, C, H, W), tile-major
    (channels innermost: the weight gradient's product runs faster on it); C a multiple
    of 8."""
    _wino_check("_wino_in_t", x, V, 4, (16, x.shape[0] * th * (tw + 1), x.shape[1]))
    cdef long n = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    if not (0 <= Hv <= H and 0 <= Wv <= W and th >= 1 and tw >= 1) or C % 8:
        raise ValueError(f"_wino_in_t: rows {Hv} and columns {Wv} read of {H}x{W}, "
                         f"{th}x{tw} tiles, {C} channels (a multiple of 8 needed)")
    cdef long T = n * th * (tw + 1)
    cdef void* px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void* pv = cnp.PyArray_DATA(<cnp.ndarray>V)
    cdef int rc
    if x.dtype == np.float32:
        with nogil:
            rc = easyad_wino_in_t_f32(<const float*>px, n, C, H, W, Hv, Wv, lo_h, lo_w, th,
                                      tw, <float*>pv, T)
    else:
        with nogil:
            rc = easyad_wino_in_t_f64(<const double*>px, n, C, H, W, Hv, Wv, lo_h, lo_w,
                                      th, tw, <double*>pv, T)
    if rc:
        raise MemoryError("_wino_in_t: no memory for the phase planes")


def _wino_out(M, y, long th, long tw):
    """y (n, C, Oh, Ow) = A^T m A of every tile of M (16, C, n*th*(tw+1)) (tw + 1:
    _winograd.h's spare tile a row). Returns whether every tile came out finite (False:
    an inf or NaN somewhere, or a sum of a tile's entries overflowing)."""
    _wino_check("_wino_out", y, M, 4, (16, y.shape[1], y.shape[0] * th * (tw + 1)))
    cdef long n = y.shape[0], C = y.shape[1], Oh = y.shape[2], Ow = y.shape[3]
    if not (2 * th - 1 <= Oh <= 2 * th and 2 * tw - 1 <= Ow <= 2 * tw):
        raise ValueError(f"_wino_out: {th}x{tw} tiles do not make {Oh}x{Ow}")
    cdef long T = n * th * (tw + 1)
    cdef void* pm = cnp.PyArray_DATA(<cnp.ndarray>M)
    cdef void* py = cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef int rc
    if y.dtype == np.float32:
        with nogil:
            rc = easyad_wino_out_f32(<const float*>pm, n, C, th, tw, T, <float*>py, Oh, Ow)
    else:
        with nogil:
            rc = easyad_wino_out_f64(<const double*>pm, n, C, th, tw, T, <double*>py, Oh,
                                     Ow)
    if rc < 0:
        raise MemoryError("_wino_out: no memory for the phase planes")
    return rc == 0


def _wino_grad(g, Q, long th, long tw):
    """Q (16, C, n*th*(tw+1)) = A gg A^T of every 2x2 tile of g (n, C, Oh, Ow)."""
    _wino_check("_wino_grad", g, Q, 4, (16, g.shape[1], g.shape[0] * th * (tw + 1)))
    cdef long n = g.shape[0], C = g.shape[1], Oh = g.shape[2], Ow = g.shape[3]
    if not (2 * th - 1 <= Oh <= 2 * th and 2 * tw - 1 <= Ow <= 2 * tw):
        raise ValueError(f"_wino_grad: {th}x{tw} tiles do not cover {Oh}x{Ow}")
    cdef long T = n * th * (tw + 1)
    cdef void* pg = cnp.PyArray_DATA(<cnp.ndarray>g)
    cdef void* pq = cnp.PyArray_DATA(<cnp.ndarray>Q)
    cdef int rc
    if g.dtype == np.float32:
        with nogil:
            rc = easyad_wino_grad_f32(<const float*>pg, n, C, Oh, Ow, th, tw, T,
                                      <float*>pq)
    else:
        with nogil:
            rc = easyad_wino_grad_f64(<const double*>pg, n, C, Oh, Ow, th, tw, T,
                                      <double*>pq)
    if rc:
        raise MemoryError("_wino_grad: no memory for the phase planes")


def _wino_conv(x, U, y, long Hv, long Wv, long lo_h, long lo_w, long th, long tw,
               size_t gemm, bint idx64):
    """y (n, Co, Oh, Ow) = the one-group convolution of x (n, C, H, W) whose kernels'
    transforms are U (16, Co, C), image by image in C: _wino_in, 16 products on the
    cblas gemm at address ``gemm`` (numpy's OpenBLAS: tensor/_blas.cblas_gemm; 64-bit
    integers where idx64), _wino_out. Returns whether every tile came out finite."""
    _wino_check("_wino_conv", x, U, 4, (16, y.shape[1], x.shape[1]))
    _wino_check("_wino_conv", y, U, 4, (16, y.shape[1], x.shape[1]))
    if gemm == 0:
        raise ValueError("_wino_conv needs the address of a cblas gemm")
    cdef long n = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef long Co = y.shape[1], Oh = y.shape[2], Ow = y.shape[3]
    if y.shape[0] != n or not (0 <= Hv <= H and 0 <= Wv <= W and th >= 1 and tw >= 1) \
            or not (2 * th - 1 <= Oh <= 2 * th and 2 * tw - 1 <= Ow <= 2 * tw):
        raise ValueError(f"_wino_conv: {x.shape} to {y.shape} with rows {Hv} and columns "
                         f"{Wv} read, {th}x{tw} tiles")
    cdef void* px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void* pu = cnp.PyArray_DATA(<cnp.ndarray>U)
    cdef void* py = cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef void* pg = <void*>gemm
    cdef int rc
    if x.dtype == np.float32:
        with nogil:
            rc = easyad_wino_conv_f32(<const float*>px, n, C, H, W, Hv, Wv, lo_h, lo_w, th,
                                      tw, <const float*>pu, Co, <float*>py, Oh, Ow, pg,
                                      idx64)
    else:
        with nogil:
            rc = easyad_wino_conv_f64(<const double*>px, n, C, H, W, Hv, Wv, lo_h, lo_w,
                                      th, tw, <const double*>pu, Co, <double*>py, Oh, Ow,
                                      pg, idx64)
    if rc < 0:
        raise MemoryError("_wino_conv: no memory for the transforms")
    return rc == 0


def _wino_wgrad(x, g, total, long Hv, long Wv, long lo_h, long lo_w, long th, long tw,
                size_t gemm, bint idx64):
    """total (16, Co, C) += the weight gradient's 16 products of x (n, C, H, W; C a
    multiple of 8) and the cotangent g (n, Co, Oh, Ow), image by image in C (_wino_in_t,
    _wino_grad, the gemm at ``gemm`` with beta = 1; see _wino_conv)."""
    _wino_check("_wino_wgrad", x, total, 4, (16, g.shape[1], x.shape[1]))
    _wino_check("_wino_wgrad", g, total, 4, (16, g.shape[1], x.shape[1]))
    if gemm == 0:
        raise ValueError("_wino_wgrad needs the address of a cblas gemm")
    cdef long n = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef long Co = g.shape[1], Oh = g.shape[2], Ow = g.shape[3]
    if g.shape[0] != n or C % 8 or not (0 <= Hv <= H and 0 <= Wv <= W and th >= 1
                                         and tw >= 1) \
            or not (2 * th - 1 <= Oh <= 2 * th and 2 * tw - 1 <= Ow <= 2 * tw):
        raise ValueError(f"_wino_wgrad: {x.shape} and {g.shape} with rows {Hv} and "
                         f"columns {Wv} read, {th}x{tw} tiles (channels in eights)")
    cdef void* px = cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef void* pg = cnp.PyArray_DATA(<cnp.ndarray>g)
    cdef void* pt = cnp.PyArray_DATA(<cnp.ndarray>total)
    cdef void* pf = <void*>gemm
    cdef int rc
    if x.dtype == np.float32:
        with nogil:
            rc = easyad_wino_wgrad_f32(<const float*>px, <const float*>pg, n, C, H, W, Hv,
                                       Wv, lo_h, lo_w, th, tw, Co, Oh, Ow, <float*>pt, pf,
                                       idx64)
    else:
        with nogil:
            rc = easyad_wino_wgrad_f64(<const double*>px, <const double*>pg, n, C, H, W,
                                       Hv, Wv, lo_h, lo_w, th, tw, Co, Oh, Ow,
                                       <double*>pt, pf, idx64)
    if rc:
        raise MemoryError("_wino_wgrad: no memory for the transforms")

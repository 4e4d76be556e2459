# An LSTM layer's float32 recurrence on the kernels of _lstm.h (easyad/ops/_lstm.py calls
# these where _gemm's AVX-512 kernels run): one call runs every step, without the GIL.

cdef extern from "_lstm.h" nogil:
    int easyad_lstm_scan_f32(long T, long B, long H, int reverse, const float* xproj,
                              const float* h0, const float* c0, const float* w, float* y,
                              float* prod)
    int easyad_lstm_scan_vjp_f32(long T, long B, long H, int reverse, int initial,
                                  const float* gy, const float* y, const float* c0,
                                  const float* w, float* d, float* dh, float* dc)
    void easyad_lstm_apply_f32(int which, long n, const float* x, float* z)


cdef const float* _lstm_f32(a, str name, tuple shape) except NULL:
    """The data of a C-contiguous float32 array of this shape (TypeError/ValueError
    naming the operand otherwise)."""
    if type(a) is not np.ndarray or (<cnp.ndarray>a).dtype != np.float32:
        raise TypeError(f"lstm kernel: {name} must be a float32 numpy array, not "
                        f"{getattr(a, 'dtype', type(a).__name__)}")
    if a.shape != shape or not (<cnp.ndarray>a).flags.c_contiguous:
        raise ValueError(f"lstm kernel: {name} must be C-contiguous of shape {shape}, not "
                         f"{a.shape}")
    return <const float*>cnp.PyArray_DATA(<cnp.ndarray>a)


def _lstm_scan_f32(xproj, h0, c0, w, bint reverse):
    """lstm_scan's packed result y (T, 6, B, H) from xproj (T, B, 4H), h0 and c0 (B, H)
    and w = W_hh (4H, H), every one C-contiguous float32."""
    if not GEMM_SUPPORTED:
        raise RuntimeError("this CPU lacks AVX-512 (F, VL, DQ) or FMA: use the numpy path")
    if type(xproj) is not np.ndarray or xproj.ndim != 3 or xproj.shape[2] % 4:
        raise ValueError("lstm kernel: xproj must be a (T, B, 4H) numpy array")
    cdef long T = xproj.shape[0], B = xproj.shape[1], H = xproj.shape[2] // 4
    cdef const float* px = _lstm_f32(xproj, "xproj", (T, B, 4 * H))
    cdef const float* ph = _lstm_f32(h0, "h0", (B, H))
    cdef const float* pc = _lstm_f32(c0, "c0", (B, H))
    cdef const float* pw = _lstm_f32(w, "w", (4 * H, H))
    cdef cnp.ndarray y = np.empty((T, 6, B, H), np.float32)
    cdef cnp.ndarray prod = np.empty((B, 4 * H), np.float32)
    cdef float* py = <float*>cnp.PyArray_DATA(y)
    cdef float* pp = <float*>cnp.PyArray_DATA(prod)
    cdef int rev = reverse, status
    with nogil:
        status = easyad_lstm_scan_f32(T, B, H, rev, px, ph, pc, pw, py, pp)
    if status:
        raise MemoryError("lstm kernel: no memory for W_hh's packed copy")
    return y


def _lstm_scan_vjp_f32(gy, y, c0, w, bint reverse, bint initial):
    """lstm_scan_vjp's result d (T [+1], B, 4H) from gy (T, 6, B, H) (None: zeros), y
    (T, 6, B, H), c0 (B, H) and w = W_hh (4H, H), every one C-contiguous float32."""
    if not GEMM_SUPPORTED:
        raise RuntimeError("this CPU lacks AVX-512 (F, VL, DQ) or FMA: use the numpy path")
    if type(y) is not np.ndarray or y.ndim != 4 or y.shape[1] != 6:
        raise ValueError("lstm kernel: y must be a (T, 6, B, H) numpy array")
    cdef long T = y.shape[0], B = y.shape[2], H = y.shape[3]
    cdef const float* pyv = _lstm_f32(y, "y", (T, 6, B, H))
    cdef const float* pg = NULL
    if gy is not None:
        pg = _lstm_f32(gy, "gy", (T, 6, B, H))
    cdef const float* pc = _lstm_f32(c0, "c0", (B, H))
    cdef const float* pw = _lstm_f32(w, "w", (4 * H, H))
    cdef cnp.ndarray d = np.empty((T + initial, B, 4 * H), np.float32)
    cdef cnp.ndarray state = np.empty((2, B, H), np.float32)
    cdef float* pd = <float*>cnp.PyArray_DATA(d)
    cdef float* ps = <float*>cnp.PyArray_DATA(state)
    cdef int rev = reverse, ini = initial, status
    with nogil:
        status = easyad_lstm_scan_vjp_f32(T, B, H, rev, ini, pg, pyv, pc, pw, pd, ps,
                                          ps + B * H)
    if status:
        raise MemoryError("lstm kernel: no memory for W_hh's packed copy")
    return d


def _lstm_apply_f32(int which, x):
    """The kernels' exp (which 0), sigmoid (1) or tanh (2) of a float32 array, for the
    tests of their accuracy."""
    if not GEMM_SUPPORTED:
        raise RuntimeError("this CPU lacks AVX-512 (F, VL, DQ) or FMA")
    if which not in (0, 1, 2):
        raise ValueError(f"_lstm_apply_f32: which is 0 (exp), 1 (sigmoid) or 2 (tanh), "
                         f"not {which}")
    cdef const float* px = _lstm_f32(x, "x", x.shape)
    cdef cnp.ndarray z = np.empty(x.shape, np.float32)
    cdef long n = x.size
    with nogil:
        easyad_lstm_apply_f32(which, n, px, <float*>cnp.PyArray_DATA(z))
    return z

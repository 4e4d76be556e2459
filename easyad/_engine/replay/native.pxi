# _Native: the call into machine code compiled from a recorded program (Function.compile;
# easyad/_compile.py renders the C, compiles and loads it). This class only holds the
# function pointers and calls them without the GIL: one point in one call, or rows of a
# batch (replay.py splits those over its threads). The compiled functions return flags per
# point (bit 0: a guard's outcome changed, bit 1: an entry with an error policy failed);
# a flagged point is handed back to the VM, which raises, re-records or masks as asked.

ctypedef int (*_native_point_fn)(const double* x, double* out, double* g,
                                 double* work) noexcept nogil
ctypedef int64_t (*_native_rows_fn)(int gradient, int64_t r0, int64_t r1, const double* X,
                                    double* out, double* G, uint8_t* flags) noexcept nogil


@cython.final
cdef class _Native:
    """Function pointers of a compiled program (addresses from ctypes) and its work buffer."""
    cdef _native_point_fn value_fn
    cdef _native_point_fn gradient_fn
    cdef _native_rows_fn rows_fn
    cdef object library          # the loaded shared object: kept alive while this is
    cdef double* _spare
    cdef readonly Py_ssize_t n_inputs
    cdef readonly Py_ssize_t n_outputs
    cdef readonly Py_ssize_t work_size

    def __cinit__(self, library, size_t value, size_t gradient, size_t rows,
                  Py_ssize_t n_inputs, Py_ssize_t n_outputs, Py_ssize_t work_size):
        if value == 0 or gradient == 0 or rows == 0 or n_outputs < 1 or work_size < 1:
            raise ValueError("_Native needs the three functions of a compiled program")
        self.library = library
        self.value_fn = <_native_point_fn>value
        self.gradient_fn = <_native_point_fn>gradient
        self.rows_fn = <_native_rows_fn>rows
        self.n_inputs = n_inputs
        self.n_outputs = n_outputs
        self.work_size = work_size

    def __dealloc__(self):
        free(self._spare)

    def __reduce__(self):
        raise TypeError("pickle the Function, not its compiled code")

    cdef double* _take(self) except NULL:
        cdef double* work = self._spare
        if work != NULL:
            self._spare = NULL
            return work
        work = <double*>malloc(self.work_size * sizeof(double))
        if work == NULL:
            raise MemoryError("cannot allocate the compiled replay's work space")
        return work

    def point(self, cnp.ndarray x, bint gradient):
        """``(outputs (m,), gradient (n,) of output 0 or None)`` at one point, or None
        when the VM must do this call: x not a C-contiguous float64 vector of n, anomaly
        mode, or a point the compiled code flags (a changed branch, a failed entry)."""
        cdef Py_ssize_t n = self.n_inputs
        cdef int flags
        if (cnp.PyArray_TYPE(x) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(x) != 1
                or cnp.PyArray_DIM(x, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(x)
                or _anomaly_mode):
            return None
        cdef cnp.npy_intp size = self.n_outputs
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef cnp.ndarray g = None
        size = n
        if gradient:
            g = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef double* o = <double*>cnp.PyArray_DATA(out)
        cdef double* G = <double*>cnp.PyArray_DATA(g) if gradient else NULL
        cdef double* work = self._take()
        with nogil:
            if gradient:
                flags = self.gradient_fn(X, o, G, work)
            else:
                flags = self.value_fn(X, o, NULL, work)
        if self._spare == NULL:
            self._spare = work
        else:
            free(work)
        if flags:
            return None
        return out, g

    def rows(self, bint gradient, cnp.ndarray X, cnp.ndarray out, cnp.ndarray G,
             cnp.ndarray flags, Py_ssize_t r0, Py_ssize_t r1):
        """Rows r0..r1 of X (B, n) into out (B, m) and, for gradients, G (B, n), without
        the GIL; flags (B,) uint8 per row as the compiled code returns them. Returns the
        number of flagged rows, or -1 when out of memory. Private to easyad.replay, which
        passes C-contiguous arrays of the right dtypes and shapes."""
        cdef int64_t bad
        if not (0 <= r0 <= r1 <= X.shape[0]) or X.shape[1] != self.n_inputs:
            raise ValueError("rows: X must be (B, n) and 0 <= r0 <= r1 <= B")
        for array in (X, out, G, flags):
            if array is not None and not cnp.PyArray_IS_C_CONTIGUOUS(array):
                raise ValueError("compiled replay arrays must be C-contiguous")
        cdef const double* x = <const double*>cnp.PyArray_DATA(X)
        cdef double* o = <double*>cnp.PyArray_DATA(out)
        cdef double* g = <double*>cnp.PyArray_DATA(G) if G is not None else NULL
        cdef uint8_t* f = <uint8_t*>cnp.PyArray_DATA(flags)
        if gradient and g == NULL:
            raise ValueError("rows: gradients need G")
        with nogil:
            bad = self.rows_fn(gradient, r0, r1, x, o, g, f)
        return bad

# _Native: the call into machine code compiled from a recorded program (Function.compile;
# easyad/compiler/tape renders the C, compiles and loads it). This class only holds the
# function pointers and calls them without the GIL: one point in one call, or rows of a
# batch, looped over here (replay.py splits them over its threads; a loop in the rendered C
# would cost gcc ~15 ms a program, and it calls through the same pointers). The compiled
# functions return flags per point (bit 0: a guard's outcome changed, bit 1: an entry with
# an error policy has a non-finite value, an error or not); a flagged point is handed back
# to the VM, which raises, re-records or masks as asked.

ctypedef int (*_native_point_fn)(const double* x, double* out, double* g,
                                 double* work) noexcept nogil
ctypedef int (*_native_second_fn)(const double* x, const double* direction, double* result,
                                  double* work) noexcept nogil


@cython.final
cdef class _Native:
    """Function pointers of a compiled program (addresses from ctypes) and its work buffer."""
    cdef _native_point_fn value_fn
    cdef _native_point_fn gradient_fn
    cdef _native_second_fn hessian_fn    # NULL: compiled without second order
    cdef _native_second_fn hvp_fn
    cdef object library          # the loaded shared object: kept alive while this is
    cdef double* _spare
    cdef readonly Py_ssize_t n_inputs
    cdef readonly Py_ssize_t n_outputs
    cdef readonly Py_ssize_t work_size
    cdef readonly Py_ssize_t colours          # directions of the compiled Hessian sweep
    cdef readonly Py_ssize_t second_work_size

    def __cinit__(self, library, size_t value, size_t gradient,
                  Py_ssize_t n_inputs, Py_ssize_t n_outputs, Py_ssize_t work_size,
                  size_t hessian=0, size_t hvp=0, Py_ssize_t colours=0,
                  Py_ssize_t second_work_size=0):
        if value == 0 or gradient == 0 or n_outputs < 1 or work_size < 1:
            raise ValueError("_Native needs the two functions of a compiled program")
        if (hessian != 0 or hvp != 0) and (hessian == 0 or hvp == 0 or colours < 1
                                            or second_work_size < 1):
            raise ValueError("_Native: second order needs both functions, colours, work")
        self.library = library
        self.value_fn = <_native_point_fn>value
        self.gradient_fn = <_native_point_fn>gradient
        self.hessian_fn = <_native_second_fn>hessian
        self.hvp_fn = <_native_second_fn>hvp
        self.n_inputs = n_inputs
        self.n_outputs = n_outputs
        self.work_size = work_size
        self.colours = colours
        self.second_work_size = second_work_size

    @property
    def second_order(self):
        """Whether Hessians and HVPs were compiled too."""
        return self.hessian_fn != NULL

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
        if (not _plain_vector(x, n)
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
        if n >= _NATIVE_NOGIL_INPUTS:
            with nogil:
                if gradient:
                    flags = self.gradient_fn(X, o, G, work)
                else:
                    flags = self.value_fn(X, o, NULL, work)
        elif gradient:     # a small program: the GIL's release costs more than it runs
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

    def second_point(self, cnp.ndarray x, cnp.ndarray source, cnp.ndarray target,
                     cnp.ndarray out):
        """``_Replayer.second_point`` by the compiled code of a second-order program."""
        cdef Py_ssize_t n = self.n_inputs
        cdef int flags
        if (not _plain_vector(x, n)
                or _anomaly_mode):
            return None
        _check_source(source, self.n_outputs)
        cdef double* vals = <double*>malloc(self.n_outputs * sizeof(double))
        if vals == NULL:
            raise MemoryError("cannot allocate the Hessian's values")
        cdef double* work
        try:
            work = self._take()
            if n >= _NATIVE_NOGIL_INPUTS:
                with nogil:
                    flags = self.value_fn(<const double*>cnp.PyArray_DATA(x), vals, NULL,
                                          work)
            else:      # a small program: the GIL's release costs more than it runs
                flags = self.value_fn(<const double*>cnp.PyArray_DATA(x), vals, NULL, work)
            if self._spare == NULL:
                self._spare = work
            else:
                free(work)
            return None if flags else _second_result(vals, source, target, out, n)
        finally:
            free(vals)

    cdef bint _vector(self, cnp.ndarray x, Py_ssize_t n):
        return _plain_vector(x, n) and cnp.PyArray_ISWRITEABLE(x)

    def gradient_into(self, cnp.ndarray x, cnp.ndarray g):
        """The gradient at x written into g (both C-contiguous float64 (n,), g writable):
        True, or False (g untouched) when the VM must do this call (as point)."""
        cdef Py_ssize_t n = self.n_inputs
        cdef int flags
        if not _plain_vector(x, n) \
                or not self._vector(g, n) or _anomaly_mode or self.n_outputs != 1 \
                or _overlap(x, g, n):
            return False
        cdef double* work = self._take()
        cdef double* G = <double*>cnp.PyArray_DATA(g)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        # out NULL: the compiled code skips the values only the output reads (sums)
        if n >= _NATIVE_NOGIL_INPUTS:
            with nogil:
                flags = self.gradient_fn(X, NULL, G, work)
        else:
            flags = self.gradient_fn(X, NULL, G, work)
        if self._spare == NULL:
            self._spare = work
        else:
            free(work)
        return flags == 0

    def hessian_point(self, cnp.ndarray x, cnp.ndarray target, cnp.ndarray source):
        """The Hessian (n, n) at one point by the compiled second-order sweep:
        H.flat[target] = (H @ seeds).flat[source] (the seeds of the colouring it was
        compiled with), other entries 0; None when the VM must do this call (as point)."""
        cdef Py_ssize_t n = self.n_inputs, K = self.colours, k, count
        cdef int flags
        if self.hessian_fn == NULL:
            return None
        if (not _plain_vector(x, n)
                or _anomaly_mode or self.n_outputs != 1):
            return None
        if (cnp.PyArray_TYPE(target) != cnp.NPY_INT64 or cnp.PyArray_TYPE(source) != cnp.NPY_INT64
                or cnp.PyArray_SIZE(target) != cnp.PyArray_SIZE(source)
                or not cnp.PyArray_IS_C_CONTIGUOUS(target)
                or not cnp.PyArray_IS_C_CONTIGUOUS(source)):
            raise ValueError("hessian_point: target/source int64 of one size")
        count = cnp.PyArray_SIZE(target)
        cdef cnp.npy_intp dims[2]
        dims[0] = n
        dims[1] = n
        cdef cnp.ndarray H = cnp.PyArray_ZEROS(2, dims, cnp.NPY_DOUBLE, 0)
        cdef double* h = <double*>cnp.PyArray_DATA(H)
        cdef const int64_t* to = <const int64_t*>cnp.PyArray_DATA(target)
        cdef const int64_t* frm = <const int64_t*>cnp.PyArray_DATA(source)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef double* work = <double*>malloc((self.second_work_size + n * K) * sizeof(double))
        if work == NULL:
            raise MemoryError("cannot allocate the compiled Hessian's work space")
        cdef double* compressed = work + self.second_work_size
        with nogil:
            flags = self.hessian_fn(X, NULL, compressed, work)
            if flags == 0:
                for k in range(count):
                    if 0 <= frm[k] < n * K and 0 <= to[k] < n * n:
                        h[to[k]] = compressed[frm[k]]
        free(work)
        return None if flags else H

    def hvp_point(self, cnp.ndarray x, cnp.ndarray v):
        """H(x) @ v (n,) by the compiled second-order sweep in one direction, or None when
        the VM must do this call."""
        cdef Py_ssize_t n = self.n_inputs
        cdef int flags
        if self.hvp_fn == NULL or _anomaly_mode or self.n_outputs != 1:
            return None
        if not (_plain_vector(x, n) and _plain_vector(v, n)):
            return None
        cdef cnp.npy_intp size = n
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef double* work = <double*>malloc(self.second_work_size * sizeof(double))
        if work == NULL:
            raise MemoryError("cannot allocate the compiled HVP's work space")
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef const double* V = <const double*>cnp.PyArray_DATA(v)
        cdef double* o = <double*>cnp.PyArray_DATA(out)
        with nogil:
            flags = self.hvp_fn(X, V, o, work)
        free(work)
        return None if flags else out

    def rows(self, bint gradient, cnp.ndarray X, cnp.ndarray out, cnp.ndarray G,
             cnp.ndarray flags, Py_ssize_t r0, Py_ssize_t r1):
        """Rows r0..r1 of X (B, n) into out (B, m) and, for gradients, G (B, n), without
        the GIL (out None with gradients: no values, and the sums only they read skipped);
        flags (B,) uint8 per row as the compiled code returns them. Returns the number of
        flagged rows, or -1 when out of memory. Private to easyad.replay, which passes
        C-contiguous arrays of the right dtypes and shapes."""
        cdef int64_t bad
        if not (0 <= r0 <= r1 <= X.shape[0]) or X.shape[1] != self.n_inputs:
            raise ValueError("rows: X must be (B, n) and 0 <= r0 <= r1 <= B")
        for array in (X, out, G):
            if array is not None and not _doubles(array):
                raise ValueError("compiled replay arrays must be C-contiguous native float64")
        if flags is None or not cnp.PyArray_IS_C_CONTIGUOUS(flags):
            raise ValueError("compiled replay flags must be C-contiguous")
        cdef const double* x = <const double*>cnp.PyArray_DATA(X)
        cdef double* o = <double*>cnp.PyArray_DATA(out) if out is not None else NULL
        cdef double* g = <double*>cnp.PyArray_DATA(G) if G is not None else NULL
        cdef uint8_t* f = <uint8_t*>cnp.PyArray_DATA(flags)
        if gradient and g == NULL:
            raise ValueError("rows: gradients need G")
        if not gradient and o == NULL:
            raise ValueError("rows: values need out")
        cdef Py_ssize_t n = self.n_inputs, m = self.n_outputs, r
        cdef int flag
        cdef double* work = <double*>malloc(self.work_size * sizeof(double))
        if work == NULL:
            return -1
        bad = 0
        with nogil:
            for r in range(r0, r1):
                if gradient:
                    flag = self.gradient_fn(x + r * n, o + r * m if o != NULL else NULL,
                                            g + r * n, work)
                else:
                    flag = self.value_fn(x + r * n, o + r * m, NULL, work)
                f[r] = <uint8_t>flag
                bad += flag != 0
        free(work)
        return bad


cdef bint _overlap(cnp.ndarray a, cnp.ndarray b, Py_ssize_t n):
    # whether two C-contiguous float64 arrays' first n elements (b: its size) share memory
    cdef char* p = <char*>cnp.PyArray_DATA(a)
    cdef char* q = <char*>cnp.PyArray_DATA(b)
    return p < q + cnp.PyArray_SIZE(b) * sizeof(double) and q < p + n * sizeof(double)


cdef enum:
    _NATIVE_NOGIL_INPUTS = 512   # a one-point call releases the GIL from this many inputs
                                 # on (below, the release costs more than the call)


@cython.final
cdef class _BoundGradient:
    """A gradient bound once to its arrays (``Function.bind_gradient``): each call runs the
    compiled code (or, given no compiled code, the VM's program: replayer) on the current
    contents of x into g (and value), with the checks done at binding, no allocation and
    no Python in between; a point the code flags (or anomaly mode, user primitives) goes
    to ``fallback`` (the Function's own path, which raises, re-records or masks as
    asked)."""
    cdef _native_point_fn fn
    cdef object native, x, g, value, fallback
    cdef _Replayer vm            # the VM's program, where no compiled code is given
    cdef const double* X
    cdef double* G
    cdef double* O
    cdef double scratch
    cdef double* work
    cdef bint release, busy

    def __cinit__(self, _Native native, cnp.ndarray x not None, cnp.ndarray g not None,
                  cnp.ndarray value, fallback not None, _Replayer replayer=None):
        cdef Py_ssize_t n = cnp.PyArray_DIM(x, 0) if cnp.PyArray_NDIM(x) == 1 else -1
        if native is not None:
            n = native.n_inputs
        elif replayer is not None:
            n = replayer.n_inputs
        for name, array, size in (("x", x, n), ("g", g, n), ("value", value, 1)):
            if array is None:
                continue
            if (not _plain_vector(array, size)
                    or (name != "x" and not cnp.PyArray_ISWRITEABLE(array))):
                raise ValueError(f"{name} must be a C-contiguous float64 array of shape "
                                 f"({size},){'' if name == 'x' else ', writable'}")
        if _overlap(x, g, n) or (value is not None and (_overlap(x, value, 1)
                                                          or _overlap(g, value, 1))):
            raise ValueError("x, g and value must not share memory")
        self.native = native
        self.x, self.g, self.value, self.fallback = x, g, value, fallback
        self.X = <const double*>cnp.PyArray_DATA(x)
        self.G = <double*>cnp.PyArray_DATA(g)
        self.O = <double*>cnp.PyArray_DATA(value) if value is not None else &self.scratch
        if native is not None and native.n_outputs == 1:
            self.fn = native.gradient_fn
            self.work = <double*>malloc(native.work_size * sizeof(double))
            if self.work == NULL:
                raise MemoryError("cannot allocate the compiled replay's work space")
            self.release = n >= _NATIVE_NOGIL_INPUTS
        elif native is None and replayer is not None and replayer.n_outputs == 1:
            # the VM: its program straight from here, with a work buffer of its own
            self.vm = replayer
            self.work = replayer._new_work()
            self.release = replayer.program.length >= _VM_NOGIL_ENTRIES

    def __dealloc__(self):
        free(self.work)

    def __reduce__(self):
        raise TypeError("a bound gradient holds raw pointers; bind again after unpickling")

    def __call__(self):
        """g (and value) at the current x."""
        cdef int flags = 1
        cdef double* O
        if self.vm is not None and not self.busy and self.vm._plain():
            self.busy = True
            O = self.O if self.value is not None else NULL   # no value: skip the sums
            if self.release:
                with nogil:
                    flags = _point_row(&self.vm.program, self.X, O, self.G, self.work)
            else:
                flags = _point_row(&self.vm.program, self.X, O, self.G, self.work)
            self.busy = False
        elif self.fn != NULL and not _anomaly_mode and not self.busy:
            self.busy = True     # another thread inside this call: the slow path
            O = self.O if self.value is not None else NULL   # no value: skip the sums
            if self.release:
                with nogil:
                    flags = self.fn(self.X, O, self.G, self.work)
            else:
                flags = self.fn(self.X, O, self.G, self.work)
            self.busy = False
        if flags:
            self.fallback()


@cython.final
cdef class _BoundSecond:
    """A Hessian's nonzeros bound once to their arrays (``Function.bind_hessian``): each
    call runs the second-order program (compiled, else in the VM) at the current contents
    of x and writes nonzero k, output source[k] of the program, into h[k]; no checks, no
    allocation, no Python in between. A flagged point, a nonzero that is not finite,
    anomaly mode: ``fallback`` (the Function's own path)."""
    cdef _native_point_fn fn
    cdef _Replayer vm
    cdef const _Program* program
    cdef object native, x, h, source, fallback
    cdef const double* X
    cdef double* H
    cdef const int64_t* frm
    cdef double* vals
    cdef double* work
    cdef Py_ssize_t count
    cdef bint busy, release

    def __cinit__(self, _Native native, _Replayer replayer not None, cnp.ndarray x not None,
                  cnp.ndarray h not None, cnp.ndarray source not None, fallback not None):
        cdef Py_ssize_t n = replayer.n_inputs
        _check_source(source, replayer.n_outputs)
        self.count = cnp.PyArray_SIZE(source)
        for name, array, size in (("x", x, n), ("h", h, self.count)):
            if (not _plain_vector(array, size)
                    or (name == "h" and not cnp.PyArray_ISWRITEABLE(array))):
                raise ValueError(f"{name} must be a C-contiguous float64 array of shape "
                                 f"({size},){'' if name == 'x' else ', writable'}")
        if _overlap(x, h, n):
            raise ValueError("x and h must not share memory")
        self.vm = replayer
        self.program = &replayer.program
        self.native = native
        self.x, self.h, self.source, self.fallback = x, h, source, fallback
        self.X = <const double*>cnp.PyArray_DATA(x)
        self.H = <double*>cnp.PyArray_DATA(h)
        self.frm = <const int64_t*>cnp.PyArray_DATA(source)
        self.vals = <double*>malloc(replayer.n_outputs * sizeof(double))
        if self.vals == NULL:
            raise MemoryError("cannot allocate the Hessian's values")
        if native is not None:
            self.fn = native.value_fn
            self.work = <double*>malloc(native.work_size * sizeof(double))
            if self.work == NULL:
                raise MemoryError("cannot allocate the compiled replay's work space")
        else:
            self.work = replayer._new_work()
        self.release = replayer.program.length >= _VM_NOGIL_ENTRIES

    def __dealloc__(self):
        free(self.work)
        free(self.vals)

    def __reduce__(self):
        raise TypeError("a bound Hessian holds raw pointers; bind again after unpickling")

    def __call__(self):
        """h at the current x."""
        cdef int flags = 1
        if not self.busy and not _anomaly_mode and (self.fn != NULL or self.vm._plain()):
            self.busy = True     # another thread inside this call: the slow path
            if self.release:
                with nogil:
                    flags = self._run()
            else:
                flags = self._run()
            self.busy = False
        if flags:
            self.fallback()

    cdef int _run(self) noexcept nogil:
        cdef int flags
        if self.fn != NULL:
            flags = self.fn(self.X, self.vals, NULL, self.work)
        else:
            flags = _point_row(self.program, self.X, self.vals, NULL, self.work)
        if flags == 0 and not _gather_finite(self.vals, self.frm, self.count, self.H):
            flags = 1
        return flags

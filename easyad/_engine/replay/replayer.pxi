# _Replayer: the Python class replay.py holds; builds the program once and runs rows
# (single points in one call, batches split over threads), keeping its work buffer.

cdef enum:
    _VM_NOGIL_ENTRIES = 20000   # a one-point call of the VM releases the GIL from this
                                # many entries on (below, the release costs more than it frees)


cdef inline bint _doubles(cnp.ndarray a):
    # whether C may read a as doubles: float64 in native byte order, aligned, C-contiguous
    # (PyArray_TYPE alone is NPY_DOUBLE for big-endian '>f8' too: read as garbage)
    return (a is not None and cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE
            and cnp.PyArray_ISNOTSWAPPED(a) and cnp.PyArray_ISALIGNED(a)
            and cnp.PyArray_IS_C_CONTIGUOUS(a))


cdef inline bint _plain_vector(cnp.ndarray x, Py_ssize_t n):
    # a vector of n doubles C may read (the gate of every one-point fast path: anything
    # else goes to the Python path, which converts it, easyad/_arrays.py)
    return _doubles(x) and cnp.PyArray_NDIM(x) == 1 and cnp.PyArray_DIM(x, 0) == n



cdef int _point_row(const _Program* P, const double* X, double* out, double* G,
                    double* work) noexcept nogil:
    # one point: the outputs into out (NULL: not wanted), the gradient of output 0 into G
    # (NULL: none) with the work buffer of _take_work; 0, or 1 when an entry failed or a
    # branch changed (the general path then raises, re-records or masks)
    cdef int32_t guard = -1, status_entry = -1
    cdef Py_ssize_t k
    cdef size_t slots = P.length + P.n_constants
    cdef double* v = work
    cdef double* adj = v + slots
    cdef double* p0 = adj + slots
    cdef double* p1 = p0 + (P.length if P.length > 0 else 1)
    cdef int code = _forward_row(P, X, v, p0, p1, &guard, &status_entry,
                                 out == NULL and G != NULL)
    if code or guard >= 0:
        return 1
    if out != NULL:
        for k in range(P.n_outputs):
            out[k] = v[P.outputs[k]]
    if G != NULL:
        _reverse_row(P, p0, p1, adj, P.outputs[0], G, False)
    return 0

@cython.final
cdef class _Replayer:
    """A WengertList frozen as a program: inputs and outputs marked (used by replay.py)."""
    cdef WengertList tape
    cdef _Program program      # the list laid out in run order (owns its arrays)
    cdef double* _spare        # a work buffer kept set up between calls (see _take_work)
    cdef readonly Py_ssize_t n_inputs
    cdef readonly Py_ssize_t n_outputs

    def __cinit__(self, WengertList tape not None, inputs, outputs):
        if tape._nodes:
            raise TypeError("a tape with tensor operations cannot be replayed yet; record "
                            "a function of scalar Records")
        self.tape = tape
        cdef int32_t[::1] ins = np.ascontiguousarray(inputs, dtype=np.int32)
        cdef int32_t[::1] outs = np.ascontiguousarray(outputs, dtype=np.int32)
        if outs.shape[0] == 0:
            raise ValueError("a Function needs at least one output")
        for i in range(ins.shape[0]):
            if not (0 <= ins[i] < tape._length) or tape._ops[ins[i]] != OP_VARIABLE:
                raise ValueError(f"input {i} is not a variable of {tape!r}")
        for i in range(outs.shape[0]):
            if not (0 <= outs[i] < tape._length):
                raise ValueError(f"output {i} is not an entry of {tape!r}")
        self.n_inputs = ins.shape[0]
        self.n_outputs = outs.shape[0]
        tape._settle_all()
        # the whole list: a guard recorded after the last output (f returned an input, or
        # a value computed before its branch) must still be checked
        cdef int rc = _build_program(tape._ops, tape._arg0, tape._arg1, tape._values,
                                     tape._partial0, tape._partial1, tape._length,
                                     &ins[0] if ins.shape[0] else NULL, ins.shape[0],
                                     &outs[0], outs.shape[0], &self.program)
        if rc == -1:
            raise MemoryError("cannot allocate the replay program")
        if rc:
            raise ValueError(f"{tape!r} has a select whose condition is not the entry "
                             "before it; it cannot be replayed")
        self.program.customs = <void*>tape._customs if tape._customs else NULL

    def __dealloc__(self):
        _free_program(&self.program)
        free(self._spare)

    cdef double* _take_work(self) except NULL:
        # (GIL held) the spare buffer, or a new one: values of the variables that are not
        # inputs and the constant slots in v, zero partials where nothing writes them. A
        # call keeps its buffer to itself (threads each take one) and gives it back after.
        cdef double* work = self._spare
        if work != NULL:
            self._spare = NULL
            return work
        return self._new_work()

    cdef double* _new_work(self) except NULL:
        # (GIL held) a work buffer set up as _take_work's, of the caller's own (a bound call
        # keeps one: the spare stays for the other calls)
        cdef double* work
        cdef Py_ssize_t L = self.program.length
        cdef size_t width = L if L > 0 else 1
        cdef size_t slots = L + self.program.n_constants
        work = <double*>malloc((2 * slots + 2 * width) * sizeof(double))
        if work == NULL:
            raise MemoryError("cannot allocate the replay's work space")
        memcpy(work, self.program.values, L * sizeof(double))
        memcpy(&work[L], self.program.constants, self.program.n_constants * sizeof(double))
        memset(&work[slots], 0, slots * sizeof(double))   # adjoints: kept 0 between sweeps
        _fixed_partials(&self.program, &work[2 * slots], &work[2 * slots + width])
        return work

    cdef void _give_work(self, double* work) noexcept:
        if self._spare == NULL:
            self._spare = work
        else:
            free(work)

    @property
    def length(self):
        return self.program.length

    @property
    def runs(self):
        """How the list was laid out: (opcode name, or "structural"; entries; whether the
        run is affine, its operands in arithmetic progression: a vectorisable loop) per run."""
        return [(OPCODE_NAMES[self.program.run_op[r]] if self.program.run_op[r] else "structural",
                 self.program.run_start[r + 1] - self.program.run_start[r],
                 bool(self.program.run_affine[r]))
                for r in range(self.program.n_runs)]

    def __reduce__(self):
        raise TypeError("pickle the Function, not its replayer")

    def _layout(self):
        """The program as numpy arrays (copies), for renderers of it (easyad/compiler/tape):
        per position ops, arg0/arg1 (positions, -1: none or a constant), values, slot0/
        slot1 (a position, or length + c for constants[c]), original (list index); per run
        run_start (n_runs + 1), run_op (0: structural), run_need, run_affine, run_base0/1;
        constants, inputs and outputs (positions), first (positions before it compute
        nothing) and length."""
        cdef const _Program* P = &self.program
        cdef Py_ssize_t L = P.length, R = P.n_runs

        def copy(size_t address, Py_ssize_t count, dtype):
            if count == 0:
                return np.empty(0, dtype=dtype)
            return np.frombuffer(
                (<char*>address)[:count * np.dtype(dtype).itemsize], dtype=dtype).copy()

        return dict(
            length=L, first=P.first,
            ops=copy(<size_t>P.ops, L, np.uint8),
            arg0=copy(<size_t>P.arg0, L, np.int32), arg1=copy(<size_t>P.arg1, L, np.int32),
            values=copy(<size_t>P.values, L, np.float64),
            slot0=copy(<size_t>P.slot0, L, np.int32), slot1=copy(<size_t>P.slot1, L, np.int32),
            original=copy(<size_t>P.original, L, np.int32),
            constants=copy(<size_t>P.constants, P.n_constants, np.float64),
            run_start=copy(<size_t>P.run_start, R + 1, np.int32),
            run_op=copy(<size_t>P.run_op, R, np.uint8),
            run_need=copy(<size_t>P.run_need, R, np.uint8),
            run_affine=copy(<size_t>P.run_affine, R, np.uint8),
            run_base0=copy(<size_t>P.run_base0, R, np.int32),
            run_base1=copy(<size_t>P.run_base1, R, np.int32),
            inputs=copy(<size_t>P.inputs, P.n_inputs, np.int32),
            outputs=copy(<size_t>P.outputs, P.n_outputs, np.int32))

    cdef bint _plain(self):
        # whether one point may run in C alone: no user primitives, no anomaly mode, the
        # tape not cleared (else the general path, run, handles the call)
        return not (self.tape._customs or _anomaly_mode
                    or self.tape._length < self.program.length)

    def point(self, cnp.ndarray x, bint gradient, bint value=True):
        """The common case in one call: ``(outputs (m,), gradient (n,) of output 0 or None)``
        at one point x, or None when the general path (run) must handle it: x not a
        float64 vector of n, a non-scalar gradient, user primitives, anomaly mode, an
        error or a changed branch at x (run then raises or re-records as asked). With
        gradient and not value: ``(None, gradient)``, skipping values only outputs read."""
        cdef const _Program* P = &self.program
        cdef Py_ssize_t n = self.n_inputs, m = self.n_outputs, k
        cdef int code = 0
        if (not _plain_vector(x, n)
                or (gradient and m != 1) or not self._plain()):
            return None
        if not gradient:
            value = True
        cdef cnp.npy_intp size = m
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0) if value else None
        cdef cnp.ndarray g = None
        size = n
        if gradient:
            g = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef double* o = <double*>cnp.PyArray_DATA(out) if value else NULL
        cdef double* G = <double*>cnp.PyArray_DATA(g) if gradient else NULL
        cdef double* work = self._take_work()
        if P.length >= _VM_NOGIL_ENTRIES:
            with nogil:
                code = _point_row(P, X, o, G, work)
        else:       # releasing and taking the GIL back costs more than a short program
            code = _point_row(P, X, o, G, work)
        self._give_work(work)
        if code:
            return None
        return out, g

    def gradient_into(self, cnp.ndarray x, cnp.ndarray g):
        """The gradient at x written into g (both C-contiguous float64 (n,), g writable, not
        sharing memory): True, or False (g untouched) when the general path must do this
        call (as point)."""
        cdef Py_ssize_t n = self.n_inputs
        cdef int code
        if not (_plain_vector(x, n) and _plain_vector(g, n) and cnp.PyArray_ISWRITEABLE(g)) \
                or self.n_outputs != 1 or not self._plain() or _overlap(x, g, n):
            return False
        cdef double* work = self._take_work()
        cdef double* G = <double*>cnp.PyArray_DATA(g)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        if self.program.length >= _VM_NOGIL_ENTRIES:
            with nogil:
                code = _point_row(&self.program, X, NULL, G, work)
        else:
            code = _point_row(&self.program, X, NULL, G, work)
        self._give_work(work)
        return code == 0

    def second_point(self, cnp.ndarray x, cnp.ndarray source, cnp.ndarray target,
                     cnp.ndarray out):
        """For a second-order program (``compiler.tape.second_order_program``): the Hessian's
        nonzeros at x, nonzero k being output source[k] (int64), into out ((nnz,) float64,
        C-contiguous, writable; returned; any other out: None) or a new array, or, with
        target (int64 (nnz,):
        flat indices), scattered into a new dense (n, n) array of zeros. None when the
        general path must answer: x not a float64 vector of n, a flagged point (an error,
        a changed branch), a nonzero that is not finite (the sweeps' strong zeros decide
        there), user primitives or anomaly mode."""
        cdef const _Program* P = &self.program
        cdef Py_ssize_t n = self.n_inputs
        cdef int code
        if (not _plain_vector(x, n)
                or not self._plain()):
            return None
        _check_source(source, self.n_outputs)
        cdef double* work = self._take_work()
        cdef double* vals = <double*>malloc(self.n_outputs * sizeof(double))
        if vals == NULL:
            self._give_work(work)
            raise MemoryError("cannot allocate the Hessian's values")
        code = _point_row(P, <const double*>cnp.PyArray_DATA(x), vals, NULL, work)
        self._give_work(work)
        try:
            return None if code else _second_result(vals, source, target, out, n)
        finally:
            free(vals)

    def hessian_point(self, cnp.ndarray x, cnp.ndarray seeds, cnp.ndarray target,
                      cnp.ndarray source, bint sparse=False):
        """The Hessian (n, n) at one point in one call, from the sweep in the seed
        directions (n, K) of a colouring: H.flat[target] = (H @ seeds).flat[source]
        (int64 indices), other entries 0; ``sparse``: only the nonzeros (len(source),),
        h[t] = (H @ seeds).flat[source[t]], no (n, n) array at all. None when the general
        path must handle it (as point)."""
        cdef WengertList tape = self.tape
        cdef const _Program* P = &self.program
        cdef Py_ssize_t n = self.n_inputs, K, k, count
        cdef int32_t guard = -1, status_entry = -1
        cdef int code = 0
        if (not _plain_vector(x, n)
                or self.n_outputs != 1 or tape._customs or _anomaly_mode
                or tape._length < P.length):
            return None
        if (not _doubles(seeds) or cnp.PyArray_NDIM(seeds) != 2
                or cnp.PyArray_DIM(seeds, 0) != n
                or cnp.PyArray_TYPE(target) != cnp.NPY_INT64
                or cnp.PyArray_TYPE(source) != cnp.NPY_INT64
                or cnp.PyArray_SIZE(target) != cnp.PyArray_SIZE(source)):
            raise ValueError("hessian_point: seeds (n, K) float64, target/source int64")
        K = cnp.PyArray_DIM(seeds, 1)
        count = cnp.PyArray_SIZE(target)
        cdef cnp.npy_intp dims[2]
        dims[0] = count if sparse else n
        dims[1] = n
        cdef cnp.ndarray H = cnp.PyArray_ZEROS(1 if sparse else 2, dims, cnp.NPY_DOUBLE, 0)
        cdef double* h = <double*>cnp.PyArray_DATA(H)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef const double* S = <const double*>cnp.PyArray_DATA(seeds)
        cdef const int64_t* to = <const int64_t*>cnp.PyArray_DATA(target)
        cdef const int64_t* frm = <const int64_t*>cnp.PyArray_DATA(source)
        cdef size_t width = P.length if P.length > 0 else 1
        cdef size_t slots = P.length + P.n_constants
        cdef double* wide = <double*>malloc((4 * width * K + n * K + 1) * sizeof(double))
        if wide == NULL:
            raise MemoryError("cannot allocate the Hessian's work space")
        cdef double* work = self._take_work()
        cdef double* v = work
        cdef double* adj = v + slots
        cdef double* p0 = adj + slots
        cdef double* p1 = p0 + width
        cdef double* compressed = wide + 4 * width * K
        with nogil:
            code = _forward_row(P, X, v, p0, p1, &guard, &status_entry)
            if code == 0 and guard < 0:
                _reverse_row(P, p0, p1, adj, P.outputs[0], NULL, True)
                code = _second_order_row(P, v, p0, p1, adj, S, K, wide, wide + width * K,
                                         wide + 2 * width * K, wide + 3 * width * K,
                                         P.outputs[0], compressed, &status_entry)
                memset(adj, 0, slots * sizeof(double))
                if code == 0 and sparse:
                    for k in range(count):
                        h[k] = compressed[frm[k]]
                elif code == 0:
                    for k in range(count):
                        h[to[k]] = compressed[frm[k]]
        self._give_work(work)
        free(wide)
        if code or guard >= 0:
            return None
        return H

    def run(self, int what, cnp.ndarray X, cnp.ndarray out, cnp.ndarray jac,
            cnp.ndarray second, cnp.ndarray seeds, cnp.ndarray changed, cnp.ndarray guard,
            cnp.ndarray status, cnp.ndarray status_entry, Py_ssize_t r0, Py_ssize_t r1,
            cnp.ndarray claim=None, Py_ssize_t chunk=0):
        """Rows r0..r1 of X into the given arrays (None where not wanted), without the GIL.

        Private to easyad.replay, which passes C-contiguous arrays of the right dtypes and
        shapes: X (B, n), out (B, m), jac (B, m or 1, n), second (B, n, K), seeds (1 or B,
        n, K) float64; changed uint8, guard/status/status_entry int32, all (B,). With
        claim (int64 (1,), shared by the threads of one batch) the rows are taken chunk by
        chunk from r0 + claim[0] on, so a thread that runs slower takes fewer."""
        cdef _Rows R
        cdef WengertList tape = self.tape
        if tape._length < self.program.length:
            raise RuntimeError("the Function's tape was cleared after recording; record again")
        for array in (X, out, jac, second, seeds):
            if array is not None and not _doubles(array):
                raise ValueError("replay arrays must be C-contiguous native float64")
        for array in (changed, guard, status, status_entry):
            if array is None or not cnp.PyArray_IS_C_CONTIGUOUS(array):
                raise ValueError("replay arrays must be C-contiguous")
        self.program.customs = <void*>tape._customs if tape._customs else NULL
        R.X = <const double*>cnp.PyArray_DATA(X)
        R.out = <double*>cnp.PyArray_DATA(out) if out is not None else NULL
        R.jac = <double*>cnp.PyArray_DATA(jac) if jac is not None else NULL
        R.second = <double*>cnp.PyArray_DATA(second) if second is not None else NULL
        R.seeds = <const double*>cnp.PyArray_DATA(seeds) if seeds is not None else NULL
        R.seeds_stride = (seeds.shape[1] * seeds.shape[2] if seeds.shape[0] > 1 else 0) \
            if seeds is not None else 0
        R.K = seeds.shape[2] if seeds is not None else 0
        R.changed = <uint8_t*>cnp.PyArray_DATA(changed)
        R.guard = <int32_t*>cnp.PyArray_DATA(guard)
        R.status = <int32_t*>cnp.PyArray_DATA(status)
        R.status_entry = <int32_t*>cnp.PyArray_DATA(status_entry)
        cdef int rc = 0
        cdef Py_ssize_t row, first_error = -1, first_changed = -1
        cdef int64_t* counter = NULL
        cdef Py_ssize_t lo = r0, hi = r1
        if claim is not None:
            if cnp.PyArray_TYPE(claim) != cnp.NPY_INT64 or chunk < 1:
                raise ValueError("claim must be an int64 array and chunk positive")
            counter = <int64_t*>cnp.PyArray_DATA(claim)
        cdef double* work = self._take_work()
        with nogil:
            while True:
                if counter != NULL:
                    lo = r0 + easyad_claim(counter, chunk)
                    hi = min(lo + chunk, r1)
                    if lo >= r1:
                        break
                rc = _replay_rows(&self.program, &R, what, lo, hi, work)
                for row in range(lo, hi):
                    if R.status[row] and (first_error < 0 or row < first_error):
                        first_error = row
                    if R.changed[row] and (first_changed < 0 or row < first_changed):
                        first_changed = row
                if rc or counter == NULL:
                    break
        self._give_work(work)
        if rc:
            raise MemoryError("cannot allocate the replay's work space")
        # the first row that raised and the first that took another branch (-1: none)
        return first_error, first_changed


cdef int _check_source(cnp.ndarray source, Py_ssize_t m) except -1:
    cdef Py_ssize_t k
    cdef const int64_t* frm
    if (source is None or cnp.PyArray_TYPE(source) != cnp.NPY_INT64
            or not cnp.PyArray_IS_C_CONTIGUOUS(source)):
        raise ValueError("source must be a C-contiguous int64 array")
    frm = <const int64_t*>cnp.PyArray_DATA(source)
    for k in range(cnp.PyArray_SIZE(source)):
        if not 0 <= frm[k] < m:
            raise ValueError("source: an index outside the program's outputs")
    return 0


cdef inline bint _gather_finite(const double* vals, const int64_t* frm, Py_ssize_t count,
                                double* into) noexcept nogil:
    # into[k] = vals[frm[k]]; False (into partly written) at a value that is not finite
    cdef Py_ssize_t k
    cdef double v
    for k in range(count):
        v = vals[frm[k]]
        if not isfinite(v):
            return False
        into[k] = v
    return True


cdef object _second_result(const double* vals, cnp.ndarray source, cnp.ndarray target,
                           cnp.ndarray out, Py_ssize_t n):
    # the nonzeros of a second-order program's point as second_point returns them
    cdef Py_ssize_t k, count = cnp.PyArray_SIZE(source)
    cdef cnp.npy_intp dims[2]
    cdef double* h
    cdef const int64_t* to
    cdef const int64_t* frm = <const int64_t*>cnp.PyArray_DATA(source)
    if target is not None:
        if (cnp.PyArray_TYPE(target) != cnp.NPY_INT64 or cnp.PyArray_SIZE(target) != count
                or not cnp.PyArray_IS_C_CONTIGUOUS(target)):
            raise ValueError("second_point: target must be int64 of the nonzeros' count")
        for k in range(count):
            if not isfinite(vals[frm[k]]):
                return None
        dims[0] = n
        dims[1] = n
        H = cnp.PyArray_ZEROS(2, dims, cnp.NPY_DOUBLE, 0)
        h = <double*>cnp.PyArray_DATA(H)
        to = <const int64_t*>cnp.PyArray_DATA(target)
        for k in range(count):
            if 0 <= to[k] < n * n:
                h[to[k]] = vals[frm[k]]
        return H
    if out is None:
        dims[0] = count
        result = cnp.PyArray_EMPTY(1, dims, cnp.NPY_DOUBLE, 0)
    elif not (_plain_vector(out, count) and cnp.PyArray_ISWRITEABLE(out)):
        return None      # not C's to write: the caller checks out and writes it converted
    else:
        result = out
    if not _gather_finite(vals, frm, count, <double*>cnp.PyArray_DATA(result)):
        return None      # (out may be partly written: the caller's path writes it again)
    return result

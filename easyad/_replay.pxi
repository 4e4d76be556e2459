# Replay: a recorded WengertList run as a program at new points, without Python in the loop.
# One row of X at a time: a forward sweep recomputes every value and partial from the
# opcodes (easyad_rule_eval, rendered from the rule table), then reverse sweeps give
# gradients and Jacobians; forward-over-reverse (tangents of the partials, also rendered
# from the table) gives Hessian-vector products and Hessians. Rows run in C without the
# GIL, split over threads by easyad/replay.py.

cdef enum:
    _WHAT_VALUE = 0
    _WHAT_GRADIENT = 1      # reverse sweep from each output: Jacobian rows
    _WHAT_SECOND = 2        # H @ S for K seed directions (first output)
    _STATUS_NO_SECOND = 5   # a user primitive without d2f met a second-order sweep
    _STATUS_PYTHON = 6      # a user primitive raised


cdef struct _Program:
    const uint8_t* ops
    const int32_t* arg0
    const int32_t* arg1
    const double* values     # recorded values (variables that are not inputs keep theirs)
    const double* partial0   # recorded: constants of constant operands
    const double* partial1
    Py_ssize_t length        # entries up to the last output
    const int32_t* inputs
    Py_ssize_t n_inputs
    const int32_t* outputs
    Py_ssize_t n_outputs
    void* customs            # the list's dict of user primitives (borrowed), or NULL


cdef struct _Rows:
    # per row: outputs (B, m) | gradients (B, m, n) | second (B, n, K) and their seeds (B?, n, K)
    const double* X
    double* out
    double* jac
    double* second
    const double* seeds
    Py_ssize_t seeds_stride  # 0: the same seeds for every row
    Py_ssize_t K
    uint8_t* changed         # per row: a guard's outcome differs
    int32_t* guard           # per row: the first guard that differs (-1: none)
    int32_t* status          # per row: an error code (0: none)
    int32_t* status_entry    # per row: the entry that raised


_custom_errors = []  # the exception a user primitive raised during replay, for the caller


cdef int _custom_eval(void* customs, Py_ssize_t i, double x, double y, double* z,
                      double* p0, double* p1) noexcept with gil:
    try:
        z[0], p0[0], p1[0] = (<dict>customs)[i]._replay(x, y)
        return 0
    except BaseException as error:
        _custom_errors.append(error)
        return _STATUS_PYTHON


cdef int _custom_second(void* customs, Py_ssize_t i, double x, double y, double* h00,
                        double* h01, double* h11) noexcept with gil:
    try:
        second = (<dict>customs)[i]._replay_second(x, y)
        if second is None:
            return _STATUS_NO_SECOND
        h00[0], h01[0], h11[0] = second
        return 0
    except BaseException as error:
        _custom_errors.append(error)
        return _STATUS_PYTHON


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
cdef int _forward_row(const _Program* P, const double* x_row, double* v, double* p0,
                      double* p1, int32_t* guard, int32_t* status_entry) noexcept nogil:
    # values and partials of every entry at one point; returns an error status (0: none)
    cdef Py_ssize_t i, L = P.length, first_error = -1
    cdef int op, a, b, code
    cdef double x, y, z, c
    memcpy(v, P.values, L * sizeof(double))
    for i in range(P.n_inputs):
        v[P.inputs[i]] = x_row[i]
    guard[0] = -1
    for i in range(L):
        op = P.ops[i]
        if op == OP_VARIABLE:
            p0[i] = 0.0
            p1[i] = 0.0
            continue
        a = P.arg0[i]
        b = P.arg1[i]
        x = v[a] if a >= 0 else P.partial0[i]
        y = v[b] if b >= 0 else P.partial1[i]
        if op >= OP_FIRST_RULE:
            z = easyad_rule_eval(op, x, y, &p0[i], &p1[i], a >= 0, b >= 0)
            # every error of the table's policies shows as a non-finite value, so the
            # status is only looked at then; raised only if it reaches an output (below)
            if not isfinite(z) and first_error < 0 and easyad_rule_status(op, x, y, z):
                first_error = i
        elif op == OP_SELECT:
            c = v[i - 1]
            z = x if c != 0.0 else y
            p0[i] = 1.0 if c != 0.0 else 0.0
            p1[i] = 0.0 if c != 0.0 else 1.0
        elif _is_comparison(op):
            z = 1.0 if _compare_values(op, x, y) else 0.0
            if op >= OP_GUARD_LT and z != P.values[i] and guard[0] < 0:
                guard[0] = <int32_t>i
            p0[i] = 0.0
            p1[i] = 0.0
        elif op == OP_CUSTOM:
            code = _custom_eval(P.customs, i, x, y, &z, &p0[i], &p1[i])
            if code:
                status_entry[0] = <int32_t>i
                return code
        else:  # a constant entry
            z = v[i]
            p0[i] = 0.0
            p1[i] = 0.0
        v[i] = z
    if first_error >= 0:
        return _live_error(P, v, first_error, status_entry)
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _live_error(const _Program* P, const double* v, Py_ssize_t first,
                     int32_t* status_entry) noexcept nogil:
    # An operation failed (log of a negative...). Like Python, raise if its value is used:
    # if it reaches an output through the branches the selects take at this point. A select
    # evaluates both sides, so a failure on the side not taken is no error.
    cdef Py_ssize_t i, L = P.length
    cdef int op, a, b, code
    cdef double x, y
    cdef uint8_t* live = <uint8_t*>calloc(L, 1)
    if live == NULL:
        status_entry[0] = <int32_t>first
        return 1  # EASYAD_DOMAIN
    for i in range(P.n_outputs):
        live[P.outputs[i]] = 1
    for i in range(L - 1, first - 1, -1):
        if not live[i]:
            continue
        op = P.ops[i]
        a = P.arg0[i]
        b = P.arg1[i]
        if op == OP_SELECT:
            live[i - 1] = 1
            if v[i - 1] != 0.0:
                b = -1
            else:
                a = -1
        if a >= 0:
            live[a] = 1
        if b >= 0:
            live[b] = 1
    code = 0
    for i in range(first, L):
        op = P.ops[i]
        if live[i] and op >= OP_FIRST_RULE:
            a = P.arg0[i]
            b = P.arg1[i]
            x = v[a] if a >= 0 else P.partial0[i]
            y = v[b] if b >= 0 else P.partial1[i]
            code = easyad_rule_status(op, x, y, v[i])
            if code:
                status_entry[0] = <int32_t>i
                break
    free(live)
    return code


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _second_order_row(const _Program* P, const double* v, const double* p0,
                           const double* p1, const double* adj, const double* seeds,
                           Py_ssize_t K, double* dv, double* dp0, double* dp1, double* dadj,
                           Py_ssize_t output, double* result, int32_t* status_entry) noexcept nogil:
    # Forward-over-reverse for K directions at once: tangents of values and partials
    # (forward), then tangents of the adjoints (reverse); result (n, K) = H @ seeds.
    cdef Py_ssize_t i, k, L = output + 1, j
    cdef int op, a, b, code
    cdef double x, y, z, dx, dy, dz, g, q, h00 = 0.0, h01 = 0.0, h11 = 0.0
    cdef double* dvi
    memset(dv, 0, L * K * sizeof(double))
    memset(dadj, 0, L * K * sizeof(double))
    for j in range(P.n_inputs):
        if P.inputs[j] < L:
            memcpy(&dv[P.inputs[j] * K], &seeds[j * K], K * sizeof(double))
    for i in range(L):
        op = P.ops[i]
        a = P.arg0[i]
        b = P.arg1[i]
        dvi = &dv[i * K]
        if op == OP_VARIABLE or _is_comparison(op):
            for k in range(K):
                dp0[i * K + k] = 0.0
                dp1[i * K + k] = 0.0
            continue
        x = v[a] if a >= 0 else P.partial0[i]
        y = v[b] if b >= 0 else P.partial1[i]
        z = v[i]
        if op == OP_CUSTOM:
            code = _custom_second(P.customs, i, x, y, &h00, &h01, &h11)
            if code:
                status_entry[0] = <int32_t>i
                return code
        if op >= OP_FIRST_RULE:
            # one switch, the K directions inside; a constant operand has no tangent (NULL)
            easyad_rule_tangents_block(op, x, y, z, p0[i], p1[i],
                                       &dv[a * K] if a >= 0 else NULL,
                                       &dv[b * K] if b >= 0 else NULL,
                                       K, dvi, &dp0[i * K], &dp1[i * K])
            continue
        for k in range(K):
            dx = dv[a * K + k] if a >= 0 else 0.0
            dy = dv[b * K + k] if b >= 0 else 0.0
            dz = mul0(p0[i], dx) + mul0(p1[i], dy)
            dvi[k] = dz
            if op == OP_CUSTOM:
                dp0[i * K + k] = mul0(h00, dx) + mul0(h01, dy)
                dp1[i * K + k] = mul0(h01, dx) + mul0(h11, dy)
            else:  # select: constant partials
                dp0[i * K + k] = 0.0
                dp1[i * K + k] = 0.0
    for i in range(output, -1, -1):
        g = adj[i]
        for k in range(K):
            q = dadj[i * K + k]
            if g == 0.0 and q == 0.0:
                continue
            a = P.arg0[i]
            if a >= 0:
                dadj[a * K + k] += mul0(dp0[i * K + k], g) + mul0(p0[i], q)
            b = P.arg1[i]
            if b >= 0:
                dadj[b * K + k] += mul0(dp1[i * K + k], g) + mul0(p1[i], q)
    for j in range(P.n_inputs):
        if P.inputs[j] < L:
            memcpy(&result[j * K], &dadj[P.inputs[j] * K], K * sizeof(double))
        else:
            memset(&result[j * K], 0, K * sizeof(double))
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _replay_rows(const _Program* P, _Rows* R, int what, Py_ssize_t r0,
                      Py_ssize_t r1) noexcept nogil:
    cdef Py_ssize_t L = P.length, n = P.n_inputs, m = P.n_outputs, K = R.K
    cdef Py_ssize_t row, j, k, o
    cdef int code
    cdef size_t width = L if L > 0 else 1
    cdef size_t wide = width * (K if what == _WHAT_SECOND else 0)
    cdef double* work = <double*>malloc((4 * width + 4 * wide) * sizeof(double))
    if work == NULL:
        return -1
    cdef double* v = work
    cdef double* p0 = v + width
    cdef double* p1 = p0 + width
    cdef double* adj = p1 + width
    cdef double* dv = adj + width
    cdef double* dp0 = dv + wide
    cdef double* dp1 = dp0 + wide
    cdef double* dadj = dp1 + wide
    for row in range(r0, r1):
        R.status[row] = 0
        code = _forward_row(P, &R.X[row * n], v, p0, p1, &R.guard[row], &R.status_entry[row])
        R.changed[row] = R.guard[row] >= 0
        if code:
            R.status[row] = code
            continue
        if R.out != NULL:
            for j in range(m):
                R.out[row * m + j] = v[P.outputs[j]]
        if what == _WHAT_VALUE:
            continue
        for j in range(m if what == _WHAT_GRADIENT else 1):
            o = P.outputs[j]
            memset(adj, 0, (o + 1) * sizeof(double))
            adj[o] = 1.0
            _reverse_sweep(p0, p1, P.arg0, P.arg1, adj, 0, o)
            if R.jac != NULL:
                for k in range(n):
                    R.jac[(row * m + j) * n + k] = adj[P.inputs[k]] if P.inputs[k] <= o else 0.0
        if what == _WHAT_SECOND:
            code = _second_order_row(P, v, p0, p1, adj, &R.seeds[row * R.seeds_stride], K,
                                     dv, dp0, dp1, dadj, P.outputs[0],
                                     &R.second[row * n * K], &R.status_entry[row])
            if code:
                R.status[row] = code
    free(work)
    return 0


@cython.final
cdef class _Replayer:
    """A WengertList frozen as a program: inputs and outputs marked (used by replay.py)."""
    cdef WengertList tape
    cdef _Program program
    cdef object _inputs        # int32 arrays kept alive for the program's pointers
    cdef object _outputs
    cdef readonly Py_ssize_t n_inputs
    cdef readonly Py_ssize_t n_outputs

    def __cinit__(self, WengertList tape not None, inputs, outputs):
        if tape._nodes:
            raise TypeError("a tape with tensor operations cannot be replayed yet; record "
                            "a function of scalar Records")
        self.tape = tape
        self._inputs = np.ascontiguousarray(inputs, dtype=np.int32)
        self._outputs = np.ascontiguousarray(outputs, dtype=np.int32)
        cdef int32_t[::1] ins = self._inputs
        cdef int32_t[::1] outs = self._outputs
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
        self.program.ops = tape._ops
        self.program.arg0 = tape._arg0
        self.program.arg1 = tape._arg1
        self.program.values = tape._values
        self.program.partial0 = tape._partial0
        self.program.partial1 = tape._partial1
        # the whole tape: a guard recorded after the last output (f returned an input, or
        # a value computed before its branch) must still be checked
        self.program.length = tape._length
        self.program.inputs = &ins[0] if ins.shape[0] else NULL
        self.program.n_inputs = ins.shape[0]
        self.program.outputs = &outs[0]
        self.program.n_outputs = outs.shape[0]
        self.program.customs = <void*>tape._customs if tape._customs else NULL

    @property
    def length(self):
        return self.program.length

    def __reduce__(self):
        raise TypeError("pickle the Function, not its replayer")

    def run(self, int what, cnp.ndarray X, cnp.ndarray out, cnp.ndarray jac,
            cnp.ndarray second, cnp.ndarray seeds, cnp.ndarray changed, cnp.ndarray guard,
            cnp.ndarray status, cnp.ndarray status_entry, Py_ssize_t r0, Py_ssize_t r1):
        """Rows r0..r1 of X into the given arrays (None where not wanted), without the GIL.

        Private to easyad.replay, which passes C-contiguous arrays of the right dtypes and
        shapes: X (B, n), out (B, m), jac (B, m or 1, n), second (B, n, K), seeds (1 or B,
        n, K) float64; changed uint8, guard/status/status_entry int32, all (B,)."""
        cdef _Rows R
        cdef WengertList tape = self.tape
        if tape._length < self.program.length:
            raise RuntimeError("the Function's tape was cleared after recording; record again")
        for array in (X, out, jac, second, seeds, changed, guard, status, status_entry):
            if array is not None and not cnp.PyArray_IS_C_CONTIGUOUS(array):
                raise ValueError("replay arrays must be C-contiguous")
        # the block may have moved if the list grew since: point at it again
        self.program.ops, self.program.arg0, self.program.arg1 = tape._ops, tape._arg0, tape._arg1
        self.program.values = tape._values
        self.program.partial0, self.program.partial1 = tape._partial0, tape._partial1
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
        cdef int rc
        cdef Py_ssize_t row, first_error = -1, first_changed = -1
        with nogil:
            rc = _replay_rows(&self.program, &R, what, r0, r1)
            for row in range(r0, r1):
                if first_error < 0 and R.status[row]:
                    first_error = row
                if first_changed < 0 and R.changed[row]:
                    first_changed = row
        if rc:
            raise MemoryError("cannot allocate the replay's work space")
        # the first row that raised and the first that took another branch (-1: none)
        return first_error, first_changed

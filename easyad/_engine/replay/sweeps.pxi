# The sweeps over a _Program, one row at a time, in C without the GIL: forward values and
# partials, reverse adjoints, errors on live entries only, second order (tangents of the
# partials) and the row loop a thread runs for a batch.

cdef extern from *:
    """
    /* x ** 2.0 over an affine segment (_SPECIAL_SQUARE): the table's pow with the exponent
     * 2.0 known, so the same numbers bit for bit (its pow returns x * x for the exponent
     * 2, and its partial mul0(y, pow(x, y - 1)) is then mul0(2.0, x)); the exponent's
     * partial is not needed (a constant) and stays 0. Without the per-entry test of the
     * exponent the loop vectorises. */
    static int easyad_square_affine(long len, const double* xs, long sx, double* out,
                                    double* p0, int need0) {
        long j;
        double bad = 0.0;
        if (need0) {
            EASYAD_IVDEP for (j = 0; j < len; j++) {
                const double x = xs[j * sx];
                const double z = x * x;
                out[j] = z;
                p0[j] = (x == 0.0) ? 0.0 : 2.0 * x;
                bad = (z - z == 0.0) ? bad : 1.0;
            }
        } else {
            EASYAD_IVDEP for (j = 0; j < len; j++) {
                const double x = xs[j * sx];
                const double z = x * x;
                out[j] = z;
                bad = (z - z == 0.0) ? bad : 1.0;
            }
        }
        return bad == 0.0;
    }

    static inline int64_t easyad_claim(int64_t* counter, int64_t n) {
        return __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
    }
    """
    int64_t easyad_claim(int64_t* counter, int64_t n) nogil
    int easyad_square_affine(long len, const double* xs, long sx, double* out, double* p0,
                             int need0) nogil


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
cdef int _forward_row(const _Program* P, const double* x_row, double* v, double* p0,
                      double* p1, int32_t* guard, int32_t* status_entry,
                      bint gradient_only=False) noexcept nogil:
    # values and partials of every entry at one point, run by run; returns an error status
    # (0: none). v holds the recorded values of the variables that are not inputs and the
    # constant slots; p0/p1 are 0 where nothing writes them (both set up by _take_work).
    # gradient_only: for a reverse sweep alone, no output value read after (P.run_dead
    # runs are skipped).
    cdef Py_ssize_t r, i, lo
    cdef int op, code, finite = 1
    cdef int32_t e
    cdef double x, y, z = 0.0, c
    for i in range(P.n_inputs):
        v[P.inputs[i]] = x_row[i]
    guard[0] = -1
    for r in range(P.n_runs):
        if gradient_only and P.run_dead[r]:
            continue
        op = P.run_op[r]
        lo = P.run_start[r]
        if P.run_special[r] == _SPECIAL_SQUARE:
            finite &= easyad_square_affine(P.run_start[r + 1] - lo, &v[P.run_base0[r]],
                                           (P.run_affine[r] >> 1) & 1, &v[lo], &p0[lo],
                                           P.run_need[r] & 1)
            continue
        if P.run_affine[r]:
            # every error of the table's policies shows as a non-finite value, so statuses
            # are only looked at then (_live_error)
            finite &= easyad_rule_eval_affine(op, P.run_start[r + 1] - lo, &v[P.run_base0[r]],
                                              (P.run_affine[r] >> 1) & 1, &v[P.run_base1[r]],
                                              P.run_affine[r] >> 2, &v[lo], &p0[lo], &p1[lo],
                                              P.run_need[r] & 1, P.run_need[r] >> 1)
            continue
        if op != _RUN_ONE_BY_ONE:
            finite &= easyad_rule_eval_run(op, lo, P.run_start[r + 1], P.slot0, P.slot1, v,
                                           p0, p1, P.run_need[r] & 1, P.run_need[r] >> 1)
            continue
        for i in range(P.run_start[r], P.run_start[r + 1]):
            op = P.ops[i]
            x = v[P.slot0[i]]
            y = v[P.slot1[i]]
            if op == OP_SELECT:
                c = v[_select_condition(i)]
                z = x if c != 0.0 else y
                p0[i] = 1.0 if c != 0.0 else 0.0
                p1[i] = 0.0 if c != 0.0 else 1.0
            elif _is_comparison(op):
                z = 1.0 if _compare_values(op, x, y) else 0.0
                e = P.original[i]
                # the first changed guard in recorded order
                if op >= OP_GUARD_LT and z != P.values[i] and (guard[0] < 0 or e < guard[0]):
                    guard[0] = e
            elif op == OP_CUSTOM:
                code = _custom_eval(P.customs, P.original[i], x, y, &z, &p0[i], &p1[i])
                if code:
                    status_entry[0] = P.original[i]
                    return code
            else:
                z = NAN  # no other opcode is laid out (tensor nodes are refused)
            v[i] = z
    if not finite:
        return _live_error(P, v, status_entry)
    return 0


cdef void _reverse_row(const _Program* P, const double* p0, const double* p1, double* adj,
                       Py_ssize_t output, double* gradient, bint keep) noexcept nogil:
    # The reverse sweep from one output, run by run from the last (easyad_rule_reverse_run,
    # rendered from the table; structural runs take its generic loop). Run order puts
    # entries that do not depend on each other side by side, so their updates overlap.
    # adj has a slot per operand slot; constants' slots get nothing. adj is all 0 before
    # and, unless keep (the second-order sweep reads it, then clears it), after: the
    # sweep zeroes what it reads, and the inputs' slots are zeroed once copied to gradient.
    cdef Py_ssize_t r, k, lo
    adj[output] = 1.0
    for r in range(P.n_runs - 1, -1, -1):
        lo = P.run_start[r]
        if P.run_affine[r]:
            easyad_rule_reverse_affine(P.run_op[r], P.run_start[r + 1] - lo, &p0[lo], &p1[lo],
                                       &adj[lo], &adj[P.run_base0[r]], &adj[P.run_base1[r]],
                                       P.run_need[r] & 1, P.run_need[r] >> 1)
            if not keep:
                memset(&adj[lo], 0, (P.run_start[r + 1] - lo) * sizeof(double))
            continue
        easyad_rule_reverse_run(P.run_op[r], lo, P.run_start[r + 1], P.slot0,
                                P.slot1, p0, p1, adj, P.run_need[r] & 1, P.run_need[r] >> 1,
                                P.length, not keep)
    for k in range(P.n_inputs):
        if gradient != NULL:
            gradient[k] = adj[P.inputs[k]]
        if not keep:
            adj[P.inputs[k]] = 0.0
    if not keep:
        adj[output] = 0.0  # an output that computes nothing (an input, a constant)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _live_error(const _Program* P, const double* v, int32_t* status_entry) noexcept nogil:
    # An operation failed (log of a negative...). Like Python, raise if its value is used:
    # if it reaches an output through the branches the selects take at this point (a
    # select evaluates both sides, so a failure on the side not taken is no error). The
    # first such entry in recorded order is the one reported.
    cdef Py_ssize_t i, e, L = P.length
    cdef int op, a, b, code = 0
    cdef double x, y
    cdef uint8_t* live = <uint8_t*>calloc(L + 1, 1)
    if live == NULL:
        for e in range(L):
            i = P.position[e]
            if P.ops[i] >= OP_FIRST_RULE and not isfinite(v[i]):
                status_entry[0] = <int32_t>e
                return 1  # EASYAD_DOMAIN
        return 0
    for i in range(P.n_outputs):
        live[P.outputs[i]] = 1
    for i in range(L - 1, -1, -1):
        if not live[i]:
            continue
        op = P.ops[i]
        a = P.arg0[i]
        b = P.arg1[i]
        if op == OP_SELECT:
            live[_select_condition(i)] = 1
            if v[_select_condition(i)] != 0.0:
                b = -1
            else:
                a = -1
        if a >= 0:
            live[a] = 1
        if b >= 0:
            live[b] = 1
    for e in range(L):
        i = P.position[e]
        op = P.ops[i]
        if live[i] and op >= OP_FIRST_RULE and not isfinite(v[i]):
            x = v[P.arg0[i]] if P.arg0[i] >= 0 else P.partial0[i]
            y = v[P.arg1[i]] if P.arg1[i] >= 0 else P.partial1[i]
            code = easyad_rule_status(op, x, y, v[i])
            if code:
                status_entry[0] = <int32_t>e
                break
    free(live)
    return code


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _second_order_entry(const _Program* P, Py_ssize_t i, const double* v, const double* p0,
                             const double* p1, Py_ssize_t K, double* dv, double* dp0,
                             double* dp1, int32_t* status_entry) noexcept nogil:
    # tangents of a structural entry's value and partials (comparison, select, custom)
    cdef Py_ssize_t k
    cdef int op = P.ops[i], code
    cdef int a = P.arg0[i], b = P.arg1[i]
    cdef double x, y, dx, dy, dz, h00 = 0.0, h01 = 0.0, h11 = 0.0
    cdef double* dvi = &dv[i * K]
    if _is_comparison(op):
        for k in range(K):
            dvi[k] = 0.0
            dp0[i * K + k] = 0.0
            dp1[i * K + k] = 0.0
        return 0
    if op == OP_CUSTOM:
        x = v[a] if a >= 0 else P.partial0[i]
        y = v[b] if b >= 0 else P.partial1[i]
        code = _custom_second(P.customs, P.original[i], x, y, &h00, &h01, &h11)
        if code:
            status_entry[0] = P.original[i]
            return code
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
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _second_order_row(const _Program* P, const double* v, const double* p0,
                           const double* p1, const double* adj, const double* seeds,
                           Py_ssize_t K, double* dv, double* dp0, double* dp1, double* dadj,
                           Py_ssize_t output, double* result, int32_t* status_entry) noexcept nogil:
    # Forward-over-reverse for K directions at once: tangents of values and partials
    # (forward, run by run), then tangents of the adjoints (reverse); result (n, K) =
    # H @ seeds. Entries that compute nothing keep tangent 0 (inputs: their seeds).
    cdef Py_ssize_t i, k, L = output + 1, j, r, lo, hi
    cdef int a, b, code
    cdef double g, q
    memset(dv, 0, L * K * sizeof(double))
    memset(dadj, 0, L * K * sizeof(double))
    for j in range(P.n_inputs):
        if P.inputs[j] < L:
            memcpy(&dv[P.inputs[j] * K], &seeds[j * K], K * sizeof(double))
    for r in range(P.n_runs):
        lo = P.run_start[r]
        hi = min(P.run_start[r + 1], L)
        if lo >= L:
            break   # positions after the output: nothing there reaches it
        if P.run_op[r] != _RUN_ONE_BY_ONE:
            # one switch per run, the K directions inside (rendered from the table)
            easyad_rule_tangents_run(P.run_op[r], lo, hi, P.slot0, P.slot1, v, p0, p1, dv,
                                     dp0, dp1, K, P.run_need[r] & 1, P.run_need[r] >> 1)
            continue
        for i in range(lo, hi):
            code = _second_order_entry(P, i, v, p0, p1, K, dv, dp0, dp1, status_entry)
            if code:
                return code
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
cdef int _replay_rows(const _Program* P, _Rows* R, int what, Py_ssize_t r0, Py_ssize_t r1,
                      double* work) noexcept nogil:
    # work: a buffer from _Replayer._take_work (values, adjoints, partials, set up)
    cdef Py_ssize_t L = P.length, n = P.n_inputs, m = P.n_outputs, K = R.K
    cdef Py_ssize_t row, j, k, o
    cdef int code
    cdef size_t width = L if L > 0 else 1
    cdef size_t slots = L + P.n_constants   # values and adjoints of entries and constants
    cdef size_t wide = width * (K if what == _WHAT_SECOND else 0)
    cdef double* v = work
    cdef double* adj = v + slots
    cdef double* p0 = adj + slots
    cdef double* p1 = p0 + width
    cdef double* dv = NULL
    if wide:
        dv = <double*>malloc(4 * wide * sizeof(double))
        if dv == NULL:
            return -1
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
            _reverse_row(P, p0, p1, adj, P.outputs[j],
                         &R.jac[(row * m + j) * n] if R.jac != NULL else NULL,
                         what == _WHAT_SECOND)
        if what == _WHAT_SECOND:
            code = _second_order_row(P, v, p0, p1, adj, &R.seeds[row * R.seeds_stride], K,
                                     dv, dp0, dp1, dadj, P.outputs[0],
                                     &R.second[row * n * K], &R.status_entry[row])
            memset(adj, 0, slots * sizeof(double))
            if code:
                R.status[row] = code
    free(dv)
    return 0


cdef void _fixed_partials(const _Program* P, double* p0, double* p1) noexcept nogil:
    # Partials no sweep writes: 0 where nothing is computed or an operand is not recorded,
    # and the table's constant partials (add's 1.0...), which the run loops use as written
    cdef Py_ssize_t r, i
    cdef int fixed
    cdef double c0, c1
    memset(p0, 0, (P.length if P.length > 0 else 1) * sizeof(double))
    memset(p1, 0, (P.length if P.length > 0 else 1) * sizeof(double))
    for r in range(P.n_runs):
        if P.run_op[r] == _RUN_ONE_BY_ONE:
            continue
        fixed = easyad_rule_fixed_partials(P.run_op[r], &c0, &c1)
        for i in range(P.run_start[r], P.run_start[r + 1]):
            if fixed & 1 and P.run_need[r] & 1:
                p0[i] = c0
            if fixed & 2 and P.run_need[r] & 2:
                p1[i] = c1

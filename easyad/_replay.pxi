# Replay: a recorded WengertList run as a program at new points, without Python in the loop.
# One row of X at a time: a forward sweep recomputes every value and partial from the
# opcodes, then reverse sweeps give gradients and Jacobians; forward-over-reverse (tangents of the partials, also rendered
# from the table) gives Hessian-vector products and Hessians. Rows run in C without the
# GIL, split over threads by easyad/replay.py.
#
# The tape is scheduled once per Function (_build_schedule): its computing entries are
# reordered, dependencies kept, into runs of one opcode, so the forward sweep dispatches
# once per run and loops (easyad_rule_eval_run, rendered from the table), and the reverse
# sweep walks entries that do not depend on each other back to back. A loop in the user's
# code (the terms of a sum) becomes a few long runs instead of one switch per entry.

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


cdef struct _Schedule:
    # the computing entries of the tape in run order; operands as slots of the value array
    # v (width L + n_constants): slot L + c holds constants[c] (a constant operand, or 0.0
    # for the absent operand of a unary rule), so the sweeps never test for constants
    Py_ssize_t n_instr
    int32_t* dst             # entry index
    int32_t* a               # operand slots
    int32_t* b
    Py_ssize_t n_runs
    int32_t* run_start       # run r is dst[run_start[r] : run_start[r + 1]]
    uint8_t* run_op
    uint8_t* run_need        # bit 0: operand a is recorded, bit 1: operand b is
    Py_ssize_t n_constants
    double* constants


cdef void _free_schedule(_Schedule* S) noexcept nogil:
    free(S.dst)
    free(S.a)
    free(S.b)
    free(S.run_start)
    free(S.run_op)
    free(S.run_need)
    free(S.constants)
    memset(S, 0, sizeof(_Schedule))


cdef inline bint _computes(int op) noexcept nogil:
    return op != OP_VARIABLE and op != OP_CONSTANT


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _build_schedule(const uint8_t* ops, const int32_t* arg0, const int32_t* arg1,
                         const double* partial0, const double* partial1, Py_ssize_t L,
                         _Schedule* S) noexcept nogil:
    # List scheduling by opcode: take the opcode (with its need bits) that has the most
    # entries ready, run every ready entry of it, including those that become ready during
    # the run (a chain of adds is one run), then pick again. O(L + runs * keys in use).
    # Returns -1 when out of memory (S then holds nothing).
    cdef Py_ssize_t i, k, r, n = 0, c = 0, edges = 0, pos
    cdef int op, key, best, count_best, n_active, j
    cdef int32_t u
    cdef int deps[3]
    cdef int32_t* indeg = <int32_t*>calloc(L + 1, sizeof(int32_t))
    cdef int32_t* first_use = <int32_t*>calloc(L + 2, sizeof(int32_t))
    cdef int32_t* users = NULL
    cdef int32_t* fill = NULL
    cdef int32_t* next_ready = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    cdef int32_t* head = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* tail = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* count = <int32_t*>calloc(1024, sizeof(int32_t))
    cdef int32_t* active = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* key_of = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    memset(S, 0, sizeof(_Schedule))
    for i in range(L):
        if _computes(ops[i]):
            n += 1
            c += (arg0[i] < 0) + (arg1[i] < 0)
    S.dst = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    S.a = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    S.b = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    S.run_start = <int32_t*>malloc((n + 2) * sizeof(int32_t))
    S.run_op = <uint8_t*>malloc(n + 1)
    S.run_need = <uint8_t*>malloc(n + 1)
    S.constants = <double*>malloc((c + 1) * sizeof(double))
    if (indeg == NULL or first_use == NULL or next_ready == NULL or head == NULL
            or tail == NULL or count == NULL or active == NULL or key_of == NULL
            or S.dst == NULL or S.a == NULL or S.b == NULL or S.run_start == NULL
            or S.run_op == NULL or S.run_need == NULL or S.constants == NULL):
        _free_schedule(S)
        n = -1
    if n >= 0:
        # users of each entry (CSR), an edge per operand use; a select also waits for the
        # comparison just before it
        for i in range(L):
            if not _computes(ops[i]):
                continue
            deps[0] = arg0[i]
            deps[1] = arg1[i]
            deps[2] = <int>i - 1 if ops[i] == OP_SELECT else -1
            for j in range(3):
                if deps[j] >= 0 and _computes(ops[deps[j]]):
                    first_use[deps[j] + 1] += 1
                    indeg[i] += 1
                    edges += 1
        for i in range(L):
            first_use[i + 1] += first_use[i]
        users = <int32_t*>malloc((edges + 1) * sizeof(int32_t))
        fill = <int32_t*>malloc((L + 1) * sizeof(int32_t))
        if users == NULL or fill == NULL:
            _free_schedule(S)
            n = -1
    if n >= 0:
        memcpy(fill, first_use, L * sizeof(int32_t))
        for i in range(L):
            if not _computes(ops[i]):
                continue
            deps[0] = arg0[i]
            deps[1] = arg1[i]
            deps[2] = <int>i - 1 if ops[i] == OP_SELECT else -1
            for j in range(3):
                if deps[j] >= 0 and _computes(ops[deps[j]]):
                    users[fill[deps[j]]] = <int32_t>i
                    fill[deps[j]] += 1
        # ready queues (FIFO linked lists) per key = opcode * 4 + need bits
        n_active = 0
        for i in range(L):
            op = ops[i]
            if not _computes(op):
                continue
            key_of[i] = op * 4 + (arg0[i] >= 0) + 2 * (arg1[i] >= 0)
            if indeg[i] == 0:
                key = key_of[i]
                if count[key] == 0:
                    head[key] = <int32_t>i
                    active[n_active] = key
                    n_active += 1
                else:
                    next_ready[tail[key]] = <int32_t>i
                tail[key] = <int32_t>i
                count[key] += 1
        pos = 0
        r = 0
        while n_active > 0:
            best = 0
            for j in range(1, n_active):
                if count[active[j]] > count[active[best]]:
                    best = j
            key = active[best]
            n_active -= 1
            active[best] = active[n_active]
            S.run_start[r] = <int32_t>pos
            S.run_op[r] = <uint8_t>(key >> 2)
            S.run_need[r] = <uint8_t>(key & 3)
            r += 1
            while count[key] > 0:
                u = head[key]
                count[key] -= 1
                if count[key] > 0:
                    head[key] = next_ready[u]
                S.dst[pos] = u
                pos += 1
                for k in range(first_use[u], first_use[u + 1]):
                    i = users[k]
                    indeg[i] -= 1
                    if indeg[i] == 0:
                        j = key_of[i]
                        if count[j] == 0:
                            head[j] = <int32_t>i
                            if j != key:
                                active[n_active] = j
                                n_active += 1
                        else:
                            next_ready[tail[j]] = <int32_t>i
                        tail[j] = <int32_t>i
                        count[j] += 1
        S.run_start[r] = <int32_t>pos
        S.n_runs = r
        S.n_instr = n
        # operand slots: constants after the L entries; the absent operand of a unary rule
        # shares slot L (0.0)
        S.constants[0] = 0.0
        c = 1
        for k in range(n):
            i = S.dst[k]
            op = ops[i]
            S.a[k] = arg0[i]
            if arg0[i] < 0:
                S.a[k] = <int32_t>(L + c)
                S.constants[c] = partial0[i]
                c += 1
            S.b[k] = arg1[i]
            if arg1[i] < 0:
                if op >= OP_FIRST_RULE and easyad_rule_arity(op) == 1:
                    S.b[k] = <int32_t>L
                else:
                    S.b[k] = <int32_t>(L + c)
                    S.constants[c] = partial1[i]
                    c += 1
        S.n_constants = c
    free(indeg)
    free(first_use)
    free(users)
    free(fill)
    free(next_ready)
    free(head)
    free(tail)
    free(count)
    free(active)
    free(key_of)
    return 0 if n >= 0 else -1


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
cdef int _forward_row(const _Program* P, const _Schedule* S, const double* x_row, double* v,
                      double* p0, double* p1, int32_t* guard, int32_t* status_entry) noexcept nogil:
    # values and partials of every entry at one point, run by run; returns an error status
    # (0: none). v holds the recorded values of entries no instruction writes (variables
    # that are not inputs) and the constant slots; p0/p1 are 0 for entries that compute
    # nothing (both set up by _replay_rows).
    cdef Py_ssize_t r, k, i, L = P.length
    cdef int op, code, finite = 1
    cdef double x, y, z = 0.0, c
    for k in range(P.n_inputs):
        v[P.inputs[k]] = x_row[k]
    guard[0] = -1
    for r in range(S.n_runs):
        op = S.run_op[r]
        if op >= OP_FIRST_RULE:
            # every error of the table's policies shows as a non-finite value, so statuses
            # are only looked at then (below)
            finite &= easyad_rule_eval_run(op, S.run_start[r], S.run_start[r + 1], S.dst,
                                           S.a, S.b, v, p0, p1, S.run_need[r] & 1,
                                           S.run_need[r] >> 1)
            continue
        for k in range(S.run_start[r], S.run_start[r + 1]):
            i = S.dst[k]
            x = v[S.a[k]]
            y = v[S.b[k]]
            if op == OP_SELECT:
                c = v[i - 1]
                z = x if c != 0.0 else y
                p0[i] = 1.0 if c != 0.0 else 0.0
                p1[i] = 0.0 if c != 0.0 else 1.0
            elif _is_comparison(op):
                z = 1.0 if _compare_values(op, x, y) else 0.0
                # the first guard in tape order that changed
                if op >= OP_GUARD_LT and z != P.values[i] and (guard[0] < 0 or i < guard[0]):
                    guard[0] = <int32_t>i
            elif op == OP_CUSTOM:
                code = _custom_eval(P.customs, i, x, y, &z, &p0[i], &p1[i])
                if code:
                    status_entry[0] = <int32_t>i
                    return code
            else:
                z = NAN  # no other opcode is scheduled (tensor nodes are refused)
            v[i] = z
    if not finite:
        # the first failing entry in tape order; raised only if it reaches an output
        for i in range(L):
            op = P.ops[i]
            if op >= OP_FIRST_RULE and not isfinite(v[i]):
                x = v[P.arg0[i]] if P.arg0[i] >= 0 else P.partial0[i]
                y = v[P.arg1[i]] if P.arg1[i] >= 0 else P.partial1[i]
                if easyad_rule_status(op, x, y, v[i]):
                    return _live_error(P, v, i, status_entry)
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _reverse_row(const _Schedule* S, const double* p0, const double* p1,
                       double* adj) noexcept nogil:
    # the reverse sweep in reverse run order: independent entries back to back, so their
    # updates overlap instead of waiting on each other. adj has a slot per operand slot
    # (constant slots take contributions and are never read).
    cdef Py_ssize_t k, i, ia, ib, last_a = -1, last_b = -1
    cdef double g, p, t, sum_a = 0.0, sum_b = 0.0
    for k in range(S.n_instr - 1, -1, -1):
        i = S.dst[k]
        # an adjoint the previous entry just updated (a chain s = s + t) comes from a
        # register, not through memory (b first: if a == b, its sum is the later one)
        if i == last_b:
            g = sum_b
        elif i == last_a:
            g = sum_a
        else:
            g = adj[i]
        if g == 0.0:
            continue  # nothing flows from here: entries after the output, unselected sides
        ia = S.a[k]
        ib = S.b[k]
        p = p0[i]
        t = p * g
        if t != t and p == 0.0:
            t = 0.0  # the strong zero of mul0: 0 * inf contributes nothing
        sum_a = adj[ia] + t
        adj[ia] = sum_a
        p = p1[i]
        t = p * g
        if t != t and p == 0.0:
            t = 0.0
        sum_b = adj[ib] + t
        adj[ib] = sum_b
        last_a = ia
        last_b = ib


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
cdef int _replay_rows(const _Program* P, const _Schedule* S, _Rows* R, int what, Py_ssize_t r0,
                      Py_ssize_t r1, double* base) noexcept nogil:
    # base: a work buffer from _Replayer._take_work (values, adjoints, partials, set up)
    cdef Py_ssize_t L = P.length, n = P.n_inputs, m = P.n_outputs, K = R.K
    cdef Py_ssize_t row, j, k, o
    cdef int code
    cdef size_t width = L if L > 0 else 1
    cdef size_t slots = L + S.n_constants   # values and adjoints of entries and constants
    cdef size_t wide = width * (K if what == _WHAT_SECOND else 0)
    cdef double* v = base
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
        code = _forward_row(P, S, &R.X[row * n], v, p0, p1, &R.guard[row],
                            &R.status_entry[row])
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
            memset(adj, 0, slots * sizeof(double))
            adj[o] = 1.0
            _reverse_row(S, p0, p1, adj)
            if R.jac != NULL:
                for k in range(n):
                    R.jac[(row * m + j) * n + k] = adj[P.inputs[k]] if P.inputs[k] <= o else 0.0
        if what == _WHAT_SECOND:
            code = _second_order_row(P, v, p0, p1, adj, &R.seeds[row * R.seeds_stride], K,
                                     dv, dp0, dp1, dadj, P.outputs[0],
                                     &R.second[row * n * K], &R.status_entry[row])
            if code:
                R.status[row] = code
    free(dv)
    return 0


@cython.final
cdef class _Replayer:
    """A WengertList frozen as a program: inputs and outputs marked (used by replay.py)."""
    cdef WengertList tape
    cdef _Program program
    cdef _Schedule schedule
    cdef double* _spare        # a work buffer kept set up between calls (see _take_work)
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
        if _build_schedule(tape._ops, tape._arg0, tape._arg1, tape._partial0, tape._partial1,
                           tape._length, &self.schedule):
            raise MemoryError("cannot allocate the replay schedule")

    def __dealloc__(self):
        _free_schedule(&self.schedule)
        free(self._spare)

    cdef double* _take_work(self) except NULL:
        # (GIL held) the spare buffer, or a new one: values of the entries no row changes
        # and the constant slots in v, zero partials of entries that compute nothing. A
        # call keeps its buffer to itself (threads each take one) and gives it back after.
        cdef double* work = self._spare
        cdef Py_ssize_t L = self.program.length
        cdef size_t width = L if L > 0 else 1
        cdef size_t slots = L + self.schedule.n_constants
        if work != NULL:
            self._spare = NULL
            return work
        work = <double*>malloc((2 * slots + 2 * width) * sizeof(double))
        if work == NULL:
            raise MemoryError("cannot allocate the replay's work space")
        memcpy(work, self.tape._values, L * sizeof(double))
        memcpy(&work[L], self.schedule.constants, self.schedule.n_constants * sizeof(double))
        memset(&work[2 * slots], 0, 2 * width * sizeof(double))
        return work

    cdef void _give_work(self, double* work) noexcept:
        if self._spare == NULL:
            self._spare = work
        else:
            free(work)

    @property
    def length(self):
        return self.program.length

    def __reduce__(self):
        raise TypeError("pickle the Function, not its replayer")

    def point(self, cnp.ndarray x, bint gradient):
        """The common case in one call: ``(outputs (m,), gradient (n,) of output 0 or None)``
        at one point x, or None when the general path (run) must handle it: x not a
        float64 vector of n, a non-scalar gradient, user primitives, anomaly mode, an
        error or a changed branch at x (run then raises or re-records as asked)."""
        cdef WengertList tape = self.tape
        cdef Py_ssize_t n = self.n_inputs, m = self.n_outputs, k
        cdef int32_t guard = -1, status_entry = -1
        cdef int code = 0
        if (cnp.PyArray_TYPE(x) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(x) != 1
                or cnp.PyArray_DIM(x, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(x)
                or (gradient and m != 1) or tape._customs or _anomaly_mode
                or tape._length < self.program.length):
            return None
        self.program.values = tape._values  # the block may have moved if the list grew
        cdef cnp.npy_intp size = m
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef cnp.ndarray g = None
        size = n
        if gradient:
            g = cnp.PyArray_EMPTY(1, &size, cnp.NPY_DOUBLE, 0)
        cdef const double* X = <const double*>cnp.PyArray_DATA(x)
        cdef double* o = <double*>cnp.PyArray_DATA(out)
        cdef double* G = <double*>cnp.PyArray_DATA(g) if gradient else NULL
        cdef double* work = self._take_work()
        cdef Py_ssize_t L = self.program.length
        cdef double* v = work
        cdef double* adj = v + L + self.schedule.n_constants
        cdef double* p0 = adj + L + self.schedule.n_constants
        cdef double* p1 = p0 + (L if L > 0 else 1)
        with nogil:
            code = _forward_row(&self.program, &self.schedule, X, v, p0, p1, &guard,
                                &status_entry)
            if code == 0 and guard < 0:
                for k in range(m):
                    o[k] = v[self.program.outputs[k]]
                if gradient:
                    k = self.program.outputs[0]
                    memset(adj, 0, (L + self.schedule.n_constants) * sizeof(double))
                    adj[k] = 1.0
                    _reverse_row(&self.schedule, p0, p1, adj)
                    for k in range(n):
                        G[k] = adj[self.program.inputs[k]] \
                            if self.program.inputs[k] <= self.program.outputs[0] else 0.0
        self._give_work(work)
        if code or guard >= 0:
            return None
        return out, g

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
        cdef double* work = self._take_work()
        with nogil:
            rc = _replay_rows(&self.program, &self.schedule, &R, what, r0, r1, work)
            for row in range(r0, r1):
                if first_error < 0 and R.status[row]:
                    first_error = row
                if first_changed < 0 and R.changed[row]:
                    first_changed = row
        self._give_work(work)
        if rc:
            raise MemoryError("cannot allocate the replay's work space")
        # the first row that raised and the first that took another branch (-1: none)
        return first_error, first_changed

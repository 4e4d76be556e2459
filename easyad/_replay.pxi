# Replay: a recorded WengertList run as a program at new points, without Python in the loop.
# One row of X at a time: a forward sweep recomputes every value and partial from the
# opcodes, then reverse sweeps give gradients and Jacobians; forward-over-reverse (tangents
# of the partials, also rendered from the table) gives Hessian-vector products and
# Hessians. Rows run in C without the GIL, split over threads by easyad/replay.py.
#
# The list is laid out again once per Function (_build_program): the entries that compute
# nothing (inputs) first, then the computing ones reordered, dependencies kept, into runs
# of one opcode. The forward sweep dispatches once per run and loops over contiguous
# entries (easyad_rule_eval_run, rendered from the table); the reverse sweep walks entries
# that do not depend on each other back to back. A loop in the user's code (the terms of a
# sum) becomes a few long runs instead of one switch per entry.

cdef enum:
    _WHAT_VALUE = 0
    _WHAT_GRADIENT = 1      # reverse sweep from each output: Jacobian rows
    _WHAT_SECOND = 2        # H @ S for K seed directions (first output)
    _STATUS_NO_SECOND = 5   # a user primitive without d2f met a second-order sweep
    _STATUS_PYTHON = 6      # a user primitive raised
    _RUN_ONE_BY_ONE = 0     # run_op of a run of structural entries (select, comparison, custom)


cdef struct _Program:
    # The recorded list laid out again (positions, not the list's indices); owns its arrays
    Py_ssize_t length
    uint8_t* ops
    int32_t* arg0            # operand positions; -1: none, or a constant held in partial0/1
    int32_t* arg1
    double* values           # recorded values (variables that are not inputs keep theirs)
    double* partial0
    double* partial1
    int32_t* slot0           # operand slots for the sweeps: a position, or length + c for
    int32_t* slot1           # constants[c] (slot length: 0.0, the absent operand of unary rules)
    Py_ssize_t n_constants
    double* constants
    int32_t* original        # position -> index in the recorded list (errors, guards, customs)
    int32_t* position        # index in the recorded list -> position
    Py_ssize_t first         # positions first.. compute (before: inputs and other variables)
    Py_ssize_t n_runs
    int32_t* run_start       # run r: positions run_start[r] .. run_start[r + 1]
    uint8_t* run_op          # the run's opcode, or _RUN_ONE_BY_ONE
    uint8_t* run_need        # bit 0: operand 0 is recorded (its partial is needed), bit 1: operand 1
    uint8_t* run_affine      # 0: operands by slot; else operand k of entry start + j is at
    int32_t* run_base0       # run_base_k + j * stride_k, stride_k = bit k+1 (1, or 0 for one slot)
    int32_t* run_base1
    int32_t* inputs          # positions
    Py_ssize_t n_inputs
    int32_t* outputs
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
    int32_t* guard           # per row: the first guard that differs (-1: none), list index
    int32_t* status          # per row: an error code (0: none)
    int32_t* status_entry    # per row: the list index of the entry that raised


cdef void _free_program(_Program* P) noexcept nogil:
    free(P.ops)
    free(P.arg0)
    free(P.arg1)
    free(P.values)
    free(P.partial0)
    free(P.partial1)
    free(P.slot0)
    free(P.slot1)
    free(P.constants)
    free(P.original)
    free(P.position)
    free(P.run_start)
    free(P.run_op)
    free(P.run_need)
    free(P.run_affine)
    free(P.run_base0)
    free(P.run_base1)
    free(P.inputs)
    free(P.outputs)
    memset(P, 0, sizeof(_Program))


cdef inline int _key(const uint8_t* ops, const int32_t* arg0, const int32_t* arg1,
                     Py_ssize_t e) noexcept nogil:
    # entries of one key share a run: a rule with the same operands recorded, or structural
    if ops[e] < OP_FIRST_RULE:
        return _RUN_ONE_BY_ONE
    return ops[e] * 4 + (arg0[e] >= 0) + 2 * (arg1[e] >= 0)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _schedule(const uint8_t* ops, const int32_t* arg0, const int32_t* arg1,
                          Py_ssize_t L, int32_t* order, int32_t* run_start,
                          uint8_t* run_key) noexcept nogil:
    # List scheduling by key: take the key with the most entries ready, emit every ready
    # entry of it, including those that become ready during the run (a chain of adds is one
    # run), then pick again; O(L + runs * keys in use). A select reads the entry just
    # before it (its condition), so that entry is emitted with it, right before it.
    # order: entries that compute nothing (recorded order), then the rest. Returns the
    # number of runs, or -1 when out of memory.
    cdef Py_ssize_t e, c, d, k, pos = 0, r = 0, edges = 0
    cdef int key, best, n_active = 0, j
    cdef int32_t u, w
    cdef int32_t deps[4]
    cdef uint8_t* attached = <uint8_t*>calloc(L + 1, 1)    # emitted with the select after it
    cdef int32_t* indeg = <int32_t*>calloc(L + 1, sizeof(int32_t))
    cdef int32_t* first_use = <int32_t*>calloc(L + 2, sizeof(int32_t))
    cdef int32_t* next_ready = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    cdef int32_t* head = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* tail = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* count = <int32_t*>calloc(1024, sizeof(int32_t))
    cdef int32_t* active = <int32_t*>malloc(1024 * sizeof(int32_t))
    cdef int32_t* users = NULL
    cdef int32_t* fill = NULL
    if (attached == NULL or indeg == NULL or first_use == NULL or next_ready == NULL
            or head == NULL or tail == NULL or count == NULL or active == NULL):
        r = -1
    if r == 0:
        for e in range(1, L):
            c = _select_condition(e)
            if ops[e] == OP_SELECT and _computes(ops[c]) and ops[c] != OP_SELECT:
                attached[c] = 1
        # edges d -> e per operand use, between units (an attached entry is its select)
        for j in range(2):
            for e in range(L):
                if not _computes(ops[e]) or attached[e]:
                    continue
                deps[0] = arg0[e]
                deps[1] = arg1[e]
                deps[2] = -1
                deps[3] = -1
                if ops[e] == OP_SELECT and e > 0:
                    c = _select_condition(e)
                    if attached[c]:
                        deps[2] = arg0[c]
                        deps[3] = arg1[c]
                    else:
                        deps[2] = <int32_t>c
                for k in range(4):
                    d = deps[k]
                    if d < 0 or not _computes(ops[d]):
                        continue
                    if attached[d]:
                        d += 1
                    if d == e:
                        continue
                    if j == 0:
                        first_use[d + 1] += 1
                        indeg[e] += 1
                        edges += 1
                    else:
                        users[fill[d]] = <int32_t>e
                        fill[d] += 1
            if j == 0:
                for e in range(L):
                    first_use[e + 1] += first_use[e]
                users = <int32_t*>malloc((edges + 1) * sizeof(int32_t))
                fill = <int32_t*>malloc((L + 1) * sizeof(int32_t))
                if users == NULL or fill == NULL:
                    r = -1
                    break
                memcpy(fill, first_use, L * sizeof(int32_t))
    if r == 0:
        for e in range(L):
            if not _computes(ops[e]):
                order[pos] = <int32_t>e
                pos += 1
        # ready queues: FIFO lists per key; keys with entries ready are listed in active
        for e in range(L):
            if _computes(ops[e]) and not attached[e] and indeg[e] == 0:
                key = _key(ops, arg0, arg1, e)
                if count[key] == 0:
                    head[key] = <int32_t>e
                    active[n_active] = key
                    n_active += 1
                else:
                    next_ready[tail[key]] = <int32_t>e
                tail[key] = <int32_t>e
                count[key] += 1
        while n_active > 0:
            best = 0
            for j in range(1, n_active):
                if count[active[j]] > count[active[best]]:
                    best = j
            key = active[best]
            n_active -= 1
            active[best] = active[n_active]
            run_start[r] = <int32_t>pos
            run_key[r] = <uint8_t>(key >> 2)
            r += 1
            while count[key] > 0:
                u = head[key]
                count[key] -= 1
                if count[key] > 0:
                    head[key] = next_ready[u]
                if u > 0 and attached[u - 1]:
                    order[pos] = u - 1
                    pos += 1
                order[pos] = u
                pos += 1
                for k in range(first_use[u], first_use[u + 1]):
                    w = users[k]
                    indeg[w] -= 1
                    if indeg[w] == 0:
                        j = _key(ops, arg0, arg1, w)
                        if count[j] == 0:
                            head[j] = w
                            if j != key:
                                active[n_active] = j
                                n_active += 1
                        else:
                            next_ready[tail[j]] = w
                        tail[j] = w
                        count[j] += 1
        run_start[r] = <int32_t>pos
    free(attached)
    free(indeg)
    free(first_use)
    free(next_ready)
    free(head)
    free(tail)
    free(count)
    free(active)
    free(users)
    free(fill)
    return r


cdef enum:
    _AFFINE_MIN = 8     # shorter stretches stay with the slot-by-slot loop


cdef inline int _stride(const int32_t* slot, Py_ssize_t i, Py_ssize_t start, bint needed) noexcept nogil:
    # stride of operand slots from entry i - 1 to i: 1, or 0 for one slot that is not
    # recorded (a constant); -1 if neither, or a recorded operand at or after start
    cdef int32_t d = slot[i] - slot[i - 1]
    if needed:
        return 1 if d == 1 and slot[i] < start else -1
    return d if d == 0 or d == 1 else -1


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _split_affine(_Program* P) noexcept nogil:
    # Split each rule run into affine segments (operands at base + j * stride, stride 1 or
    # 0, none inside the segment: vectorisable loops without slot arrays) and the rest.
    # Returns -1 when out of memory.
    cdef Py_ssize_t r, n = 0, i, j, lo, hi, pending
    cdef int s0, s1, need0, need1
    cdef int32_t* start = <int32_t*>malloc((P.length + 2) * sizeof(int32_t))
    cdef uint8_t* op = <uint8_t*>malloc(P.length + 1)
    cdef uint8_t* need = <uint8_t*>malloc(P.length + 1)
    if start == NULL or op == NULL or need == NULL:
        free(start)
        free(op)
        free(need)
        return -1
    for r in range(P.n_runs):
        lo = P.run_start[r]
        hi = P.run_start[r + 1]
        need0 = P.run_need[r] & 1
        need1 = P.run_need[r] >> 1
        pending = lo          # entries lo.. not yet in a segment
        i = lo
        while P.run_op[r] != _RUN_ONE_BY_ONE and i + 1 < hi:
            s0 = _stride(P.slot0, i + 1, i, need0)
            s1 = _stride(P.slot1, i + 1, i, need1)
            j = i + 1
            if s0 >= 0 and s1 >= 0 and (not need0 or P.slot0[i] < i) and (not need1 or P.slot1[i] < i):
                while (j < hi and _stride(P.slot0, j, i, need0) == s0
                       and _stride(P.slot1, j, i, need1) == s1):
                    j += 1
            if j - i < _AFFINE_MIN:
                i += 1
                continue
            if i > pending:     # the stretch before, slot by slot
                start[n] = <int32_t>pending
                op[n] = P.run_op[r]
                need[n] = P.run_need[r]
                P.run_affine[n] = 0
                n += 1
            start[n] = <int32_t>i
            op[n] = P.run_op[r]
            need[n] = P.run_need[r]
            P.run_affine[n] = <uint8_t>(1 | (s0 << 1) | (s1 << 2))
            P.run_base0[n] = P.slot0[i]
            P.run_base1[n] = P.slot1[i]
            n += 1
            pending = j
            i = j
        if pending < hi:
            start[n] = <int32_t>pending
            op[n] = P.run_op[r]
            need[n] = P.run_need[r]
            P.run_affine[n] = 0
            n += 1
    start[n] = P.run_start[P.n_runs]
    memcpy(P.run_start, start, (n + 1) * sizeof(int32_t))
    memcpy(P.run_op, op, n)
    memcpy(P.run_need, need, n)
    P.n_runs = n
    free(start)
    free(op)
    free(need)
    return 0


cdef Py_ssize_t _constant_slot(double value, _Program* P, int32_t* table,
                               Py_ssize_t mask) noexcept nogil:
    # the index in P.constants of value, added if new (table: open addressing, -1 empty)
    cdef uint64_t bits
    memcpy(&bits, &value, sizeof(double))
    cdef Py_ssize_t h = <Py_ssize_t>((bits * <uint64_t>0x9E3779B97F4A7C15) >> 20) & mask
    cdef double known
    while table[h] >= 0:
        known = P.constants[table[h]]
        if memcmp(&known, &value, sizeof(double)) == 0:
            return table[h]
        h = (h + 1) & mask
    table[h] = <int32_t>P.n_constants
    P.constants[P.n_constants] = value
    P.n_constants += 1
    return table[h]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _build_program(const uint8_t* ops, const int32_t* arg0, const int32_t* arg1,
                        const double* values, const double* partial0, const double* partial1,
                        Py_ssize_t L, const int32_t* inputs, Py_ssize_t n_inputs,
                        const int32_t* outputs, Py_ssize_t n_outputs,
                        _Program* P) noexcept nogil:
    # P: the list laid out in run order (see _schedule); returns -1 when out of memory
    cdef Py_ssize_t e, i, r, mask
    cdef int op
    cdef int32_t* table
    memset(P, 0, sizeof(_Program))
    P.length = L
    P.ops = <uint8_t*>malloc(L + 1)
    P.arg0 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.arg1 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.values = <double*>malloc((L + 1) * sizeof(double))
    P.partial0 = <double*>malloc((L + 1) * sizeof(double))
    P.partial1 = <double*>malloc((L + 1) * sizeof(double))
    P.slot0 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.slot1 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.constants = <double*>malloc((2 * L + 1) * sizeof(double))
    P.original = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.position = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.run_start = <int32_t*>malloc((L + 2) * sizeof(int32_t))
    P.run_op = <uint8_t*>malloc(L + 1)
    P.run_need = <uint8_t*>malloc(L + 1)
    P.run_affine = <uint8_t*>malloc(L + 1)
    P.run_base0 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.run_base1 = <int32_t*>malloc((L + 1) * sizeof(int32_t))
    P.inputs = <int32_t*>malloc((n_inputs + 1) * sizeof(int32_t))
    P.outputs = <int32_t*>malloc((n_outputs + 1) * sizeof(int32_t))
    if (P.ops == NULL or P.arg0 == NULL or P.arg1 == NULL or P.values == NULL
            or P.partial0 == NULL or P.partial1 == NULL or P.slot0 == NULL or P.slot1 == NULL
            or P.constants == NULL or P.original == NULL or P.position == NULL
            or P.run_start == NULL or P.run_op == NULL or P.run_need == NULL
            or P.run_affine == NULL or P.run_base0 == NULL or P.run_base1 == NULL
            or P.inputs == NULL or P.outputs == NULL):
        _free_program(P)
        return -1
    P.n_runs = _schedule(ops, arg0, arg1, L, P.original, P.run_start, P.run_op)
    if P.n_runs < 0:
        _free_program(P)
        return -1
    for i in range(L):
        P.position[P.original[i]] = <int32_t>i
    P.first = P.run_start[0] if P.n_runs > 0 else L
    # constant operands: one slot per distinct value (by bits), slot 0 is 0.0
    mask = 1
    while mask < 4 * L + 4:
        mask *= 2
    table = <int32_t*>malloc(mask * sizeof(int32_t))
    if table == NULL:
        _free_program(P)
        return -1
    memset(table, 0xff, mask * sizeof(int32_t))
    mask -= 1
    P.constants[0] = 0.0
    P.n_constants = 1
    for i in range(L):
        e = P.original[i]
        op = ops[e]
        P.ops[i] = <uint8_t>op
        P.arg0[i] = P.position[arg0[e]] if arg0[e] >= 0 else -1
        P.arg1[i] = P.position[arg1[e]] if arg1[e] >= 0 else -1
        P.values[i] = values[e]
        P.partial0[i] = partial0[e]
        P.partial1[i] = partial1[e]
        P.slot0[i] = P.arg0[i]
        P.slot1[i] = P.arg1[i]
        if not _computes(op):
            P.slot0[i] = <int32_t>L
            P.slot1[i] = <int32_t>L
            continue
        if P.arg0[i] < 0:
            P.slot0[i] = <int32_t>(L + _constant_slot(partial0[e], P, table, mask))
        if P.arg1[i] < 0:
            if op >= OP_FIRST_RULE and easyad_rule_arity(op) == 1:
                P.slot1[i] = <int32_t>L
            else:
                P.slot1[i] = <int32_t>(L + _constant_slot(partial1[e], P, table, mask))
    free(table)
    for r in range(P.n_runs):
        i = P.run_start[r]
        P.run_need[r] = <uint8_t>((P.arg0[i] >= 0) + 2 * (P.arg1[i] >= 0))
    if _split_affine(P):
        _free_program(P)
        return -1
    for i in range(P.first, L):
        # the layout keeps a select's condition right before it (_schedule attaches it)
        if P.ops[i] == OP_SELECT and (P.original[_select_condition(i)]
                                      != _select_condition(P.original[i])):
            _free_program(P)
            return -2  # a select whose condition is not the entry before it (never recorded)
    for i in range(n_inputs):
        P.inputs[i] = P.position[inputs[i]]
    P.n_inputs = n_inputs
    for i in range(n_outputs):
        P.outputs[i] = P.position[outputs[i]]
    P.n_outputs = n_outputs
    return 0


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
                      double* p1, int32_t* guard, int32_t* status_entry) noexcept nogil:
    # values and partials of every entry at one point, run by run; returns an error status
    # (0: none). v holds the recorded values of the variables that are not inputs and the
    # constant slots; p0/p1 are 0 where nothing writes them (both set up by _take_work).
    cdef Py_ssize_t r, i, lo
    cdef int op, code, finite = 1
    cdef int32_t e
    cdef double x, y, z = 0.0, c
    for i in range(P.n_inputs):
        v[P.inputs[i]] = x_row[i]
    guard[0] = -1
    for r in range(P.n_runs):
        op = P.run_op[r]
        lo = P.run_start[r]
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


cdef extern from *:
    """
    static inline int64_t easyad_claim(int64_t* counter, int64_t n) {
        return __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
    }
    """
    int64_t easyad_claim(int64_t* counter, int64_t n) nogil


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
        cdef Py_ssize_t L = self.program.length
        cdef size_t width = L if L > 0 else 1
        cdef size_t slots = L + self.program.n_constants
        if work != NULL:
            self._spare = NULL
            return work
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

    def point(self, cnp.ndarray x, bint gradient):
        """The common case in one call: ``(outputs (m,), gradient (n,) of output 0 or None)``
        at one point x, or None when the general path (run) must handle it: x not a
        float64 vector of n, a non-scalar gradient, user primitives, anomaly mode, an
        error or a changed branch at x (run then raises or re-records as asked)."""
        cdef WengertList tape = self.tape
        cdef const _Program* P = &self.program
        cdef Py_ssize_t n = self.n_inputs, m = self.n_outputs, k
        cdef int32_t guard = -1, status_entry = -1
        cdef int code = 0
        if (cnp.PyArray_TYPE(x) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(x) != 1
                or cnp.PyArray_DIM(x, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(x)
                or (gradient and m != 1) or tape._customs or _anomaly_mode
                or tape._length < P.length):
            return None
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
        cdef size_t slots = P.length + P.n_constants
        cdef double* v = work
        cdef double* adj = v + slots
        cdef double* p0 = adj + slots
        cdef double* p1 = p0 + (P.length if P.length > 0 else 1)
        with nogil:
            code = _forward_row(P, X, v, p0, p1, &guard, &status_entry)
            if code == 0 and guard < 0:
                for k in range(m):
                    o[k] = v[P.outputs[k]]
                if gradient:
                    _reverse_row(P, p0, p1, adj, P.outputs[0], G, False)
        self._give_work(work)
        if code or guard >= 0:
            return None
        return out, g

    def hessian_point(self, cnp.ndarray x, cnp.ndarray seeds, cnp.ndarray target,
                      cnp.ndarray source):
        """The Hessian (n, n) at one point in one call, from the sweep in the seed
        directions (n, K) of a column colouring: H.flat[target] = (H @ seeds).flat[source]
        (int64 indices), other entries 0. None when the general path must handle it (as
        point)."""
        cdef WengertList tape = self.tape
        cdef const _Program* P = &self.program
        cdef Py_ssize_t n = self.n_inputs, K, k, count
        cdef int32_t guard = -1, status_entry = -1
        cdef int code = 0
        if (cnp.PyArray_TYPE(x) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(x) != 1
                or cnp.PyArray_DIM(x, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(x)
                or self.n_outputs != 1 or tape._customs or _anomaly_mode
                or tape._length < P.length):
            return None
        if (cnp.PyArray_TYPE(seeds) != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(seeds) != 2
                or cnp.PyArray_DIM(seeds, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(seeds)
                or cnp.PyArray_TYPE(target) != cnp.NPY_INT64
                or cnp.PyArray_TYPE(source) != cnp.NPY_INT64
                or cnp.PyArray_SIZE(target) != cnp.PyArray_SIZE(source)):
            raise ValueError("hessian_point: seeds (n, K) float64, target/source int64")
        K = cnp.PyArray_DIM(seeds, 1)
        count = cnp.PyArray_SIZE(target)
        cdef cnp.npy_intp dims[2]
        dims[0] = n
        dims[1] = n
        cdef cnp.ndarray H = cnp.PyArray_ZEROS(2, dims, cnp.NPY_DOUBLE, 0)
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
                if code == 0:
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
        for array in (X, out, jac, second, seeds, changed, guard, status, status_entry):
            if array is not None and not cnp.PyArray_IS_C_CONTIGUOUS(array):
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

# Program building: runs cut into affine segments (vectorisable loops), constants
# deduplicated into slots, and _build_program, which lays a tape out as a _Program.

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
    P.run_special = <uint8_t*>calloc(L + 1, 1)
    P.run_dead = <uint8_t*>calloc(L + 1, 1)
    P.inputs = <int32_t*>malloc((n_inputs + 1) * sizeof(int32_t))
    P.outputs = <int32_t*>malloc((n_outputs + 1) * sizeof(int32_t))
    if (P.ops == NULL or P.arg0 == NULL or P.arg1 == NULL or P.values == NULL
            or P.partial0 == NULL or P.partial1 == NULL or P.slot0 == NULL or P.slot1 == NULL
            or P.constants == NULL or P.original == NULL or P.position == NULL
            or P.run_start == NULL or P.run_op == NULL or P.run_need == NULL
            or P.run_affine == NULL or P.run_base0 == NULL or P.run_base1 == NULL
            or P.run_special == NULL or P.run_dead == NULL
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
    for r in range(P.n_runs):
        # x ** 2.0 with the exponent a constant: its own loop, which vectorises (the
        # table's pow tests the exponent per entry); the same numbers (see _square_affine)
        if (P.run_affine[r] and P.run_op[r] == OP_POW and (P.run_affine[r] >> 2) == 0
                and P.run_base1[r] >= L and P.constants[P.run_base1[r] - L] == 2.0):
            P.run_special[r] = _SPECIAL_SQUARE
    if _dead_runs(P):
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


cdef inline bint _free_value(int op) noexcept nogil:
    # rules whose value no error policy checks and whose partials are constants of the
    # table: their value is needed only by whoever reads it
    return op == OP_ADD or op == OP_SUB or op == OP_NEG


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _dead_runs(_Program* P) noexcept nogil:
    # P.run_dead: runs a gradient alone (no output value asked for) may skip in the
    # forward sweep: every entry a sum, difference or negation whose value nothing reads
    # but other such entries (no partial, guard, select, comparison or user primitive,
    # and no output: the caller asks for none). Their values are then left as they were
    # (stale); nothing reads them, and their rules raise no errors. -1: out of memory.
    cdef Py_ssize_t L = P.length, i, r
    cdef int op
    cdef bint dead
    cdef uint8_t* wanted = <uint8_t*>calloc(L + 1, 1)
    if wanted == NULL:
        return -1
    for i in range(L - 1, P.first - 1, -1):
        op = P.ops[i]
        if wanted[i] or not _free_value(op):
            if P.arg0[i] >= 0:
                wanted[P.arg0[i]] = 1
            if P.arg1[i] >= 0:
                wanted[P.arg1[i]] = 1
            if op == OP_SELECT:
                wanted[_select_condition(i)] = 1
    for r in range(P.n_runs):
        dead = P.run_op[r] != _RUN_ONE_BY_ONE and P.run_special[r] == 0
        i = P.run_start[r]
        while dead and i < P.run_start[r + 1]:
            dead = _free_value(P.ops[i]) and not wanted[i]
            i += 1
        P.run_dead[r] = dead
    free(wanted)
    return 0

# ---- the Hessian's second-order program, written in C (compiler/tape/second_order_arrays.py) ----
#
# Forward over reverse done once, symbolically, over the tape, as
# compiler/tape/second_order.py's ``_Emitter`` does it in Python: the same expressions of
# the rule table (flattened into node arrays by the Python side), the same folding of
# constants and strong zeros, equal entries shared through a hash table, so the program
# does the sweeps' operations in the sweeps' order. Only the optional rewrites that shrink
# a program without changing a bit ((-u) * c, (u * c1) * c2, u + (-w)) are left out. In
# Python the emitter cost ~30 us per program entry, which capped the program at 60,000
# colours x entries; here it is about a microsecond or less.

from libc.stdlib cimport realloc as _so_realloc
from libc.stdint cimport int8_t
from libc.math cimport frexp, fabs

cdef struct _SRef:
    int64_t id       # an entry of the program, or -1: the constant c
    double c

# tree node kinds (the Python side's ``_NUM``... in second_order_arrays.py)
cdef enum:
    _N_NUM = 0
    _N_VAR = 1
    _N_NEG = 2
    _N_BIN = 3
    _N_MUL0 = 4
    _N_DIV0 = 5
    _N_RULE = 6
    _N_DECLINE = 7


cdef inline bint _rescales_exactly(double c1, double c2) noexcept:
    """Whether (u * c1) * c2 is u * (c1 * c2) bit for bit at every u (see
    second_order._rescales_exactly: c1 a power of two, |c1|, |c2| >= 1, c1 c2 finite)."""
    cdef int exponent
    cdef double mantissa = frexp(c1, &exponent)
    return fabs(mantissa) == 0.5 and fabs(c1) >= 1.0 and fabs(c2) >= 1.0 \
        and isfinite(c1 * c2)


cdef inline _SRef _sconst(double c) noexcept:
    cdef _SRef r
    r.id = -1
    r.c = c
    return r


cdef inline bint _szero(_SRef r) noexcept:
    return r.id < 0 and r.c == 0.0


cdef inline uint64_t _sbits(double c) noexcept:
    cdef uint64_t b
    memcpy(&b, &c, 8)
    return b


cdef inline uint64_t _smix(uint64_t h) noexcept:
    """splitmix64's finaliser: every input bit reaches the low bits the table uses."""
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL
    return h ^ (h >> 31)


@cython.cdivision(True)
cdef inline double _sfold(int which, double x, double y) noexcept:
    """add, sub, mul, div, neg on constants, as IEEE (and the VM) computes them."""
    if which == 0:
        return x + y
    if which == 1:
        return x - y
    if which == 2:
        return x * y
    if which == 3:
        return x / y
    return -x


@cython.auto_pickle(False)       # C pointers: nothing to pickle (and no stub entries)
cdef class _SecondWriter:
    """The program being written: entries in growing C arrays, a hash table of the
    shared ones, and the rule table's partials and tangents as node arrays."""
    cdef uint8_t* ops
    cdef int64_t* a0
    cdef int64_t* a1
    cdef double* c0
    cdef double* c1
    cdef double* v
    cdef Py_ssize_t used, capacity
    cdef uint64_t* table
    cdef Py_ssize_t slots, filled
    cdef int op_add, op_sub, op_mul, op_div, op_neg, op_pow, op_var
    cdef const int32_t[::1] n_kind
    cdef const int32_t[::1] n_arg
    cdef const int32_t[::1] n_left
    cdef const int32_t[::1] n_right
    cdef const double[::1] n_num
    cdef const int8_t[::1] arity
    cdef public bint declined

    def __dealloc__(self):
        free(self.ops)
        free(self.a0)
        free(self.a1)
        free(self.c0)
        free(self.c1)
        free(self.v)
        free(self.table)

    cdef int grow(self) except -1:
        cdef Py_ssize_t size = self.capacity * 2 + 4096
        self.ops = <uint8_t*>_so_realloc(self.ops, size)
        self.a0 = <int64_t*>_so_realloc(self.a0, size * 8)
        self.a1 = <int64_t*>_so_realloc(self.a1, size * 8)
        self.c0 = <double*>_so_realloc(self.c0, size * 8)
        self.c1 = <double*>_so_realloc(self.c1, size * 8)
        self.v = <double*>_so_realloc(self.v, size * 8)
        if self.ops == NULL or self.a0 == NULL or self.a1 == NULL or self.c0 == NULL \
                or self.c1 == NULL or self.v == NULL:
            raise MemoryError("the Hessian's second-order program does not fit in memory")
        self.capacity = size
        return 0

    cdef int64_t raw(self, int op, _SRef a, _SRef b, double value) except -1:
        if self.used == self.capacity:
            self.grow()
        cdef Py_ssize_t at = self.used
        self.ops[at] = <uint8_t>op
        self.a0[at] = a.id if a.id >= 0 else -1
        self.a1[at] = b.id if b.id >= 0 else -1
        self.c0[at] = 0.0 if a.id >= 0 else a.c
        self.c1[at] = 0.0 if b.id >= 0 else b.c
        self.v[at] = value
        self.used += 1
        return at

    cdef inline uint64_t key_hash(self, int op, int64_t a, uint64_t abits, int64_t b,
                                  uint64_t bbits) noexcept:
        cdef uint64_t h = _smix(<uint64_t>op)
        h = _smix(h ^ <uint64_t>a)
        h = _smix(h ^ abits)
        h = _smix(h ^ <uint64_t>b)
        return _smix(h ^ bbits)

    cdef inline bint same(self, int64_t e, int op, int64_t a, uint64_t abits, int64_t b,
                          uint64_t bbits) noexcept:
        """Whether entry e (one the table holds) has this key."""
        if self.ops[e] != op or self.a0[e] != a or self.a1[e] != b:
            return False
        if op == self.op_var:
            return _sbits(self.v[e]) == abits
        return (a >= 0 or _sbits(self.c0[e]) == abits) \
            and (b >= 0 or _sbits(self.c1[e]) == bbits)

    cdef int rehash(self) except -1:
        """Twice the slots (each: 32 bits of the key's hash, then entry + 1; 0 empty)."""
        cdef uint64_t* old = self.table
        cdef Py_ssize_t count = self.slots, i, s, mask
        cdef int64_t e
        cdef uint64_t h
        self.slots = count * 2 if count else 1 << 16
        self.table = <uint64_t*>calloc(self.slots, sizeof(uint64_t))
        if self.table == NULL:
            self.table = old
            raise MemoryError("the Hessian's second-order program does not fit in memory")
        mask = self.slots - 1
        for i in range(count):
            if old[i]:
                e = <int64_t>(old[i] & 0xFFFFFFFFULL) - 1
                h = old[i] >> 32
                s = <Py_ssize_t>(self.rehome(old[i], e) & <uint64_t>mask)
                while self.table[s]:
                    s = (s + 1) & mask
                self.table[s] = old[i]
        free(old)
        return 0

    cdef uint64_t rehome(self, uint64_t slot, int64_t e) noexcept:
        """The full hash of entry e's key (the slot keeps 32 bits of it)."""
        cdef int op = self.ops[e]
        cdef int64_t a = self.a0[e], b = self.a1[e]
        cdef uint64_t abits = 0, bbits = 0
        if op == self.op_var:
            abits = _sbits(self.v[e])
        else:
            if a < 0:
                abits = _sbits(self.c0[e])
            if b < 0:
                bbits = _sbits(self.c1[e])
        return self.key_hash(op, a, abits, b, bbits)

    cdef _SRef shared(self, int op, _SRef a, _SRef b, double value) except *:
        """The entry op(a, b) (a fixed variable holding ``value`` for op_var), made once."""
        if 2 * (self.filled + 1) > self.slots:
            self.rehash()
        cdef uint64_t abits = _sbits(a.c) if a.id < 0 else 0
        cdef uint64_t bbits = _sbits(b.c) if b.id < 0 else 0
        cdef int64_t ka = a.id if a.id >= 0 else -1, kb = b.id if b.id >= 0 else -1
        if op == self.op_var:
            abits, ka, kb, bbits = _sbits(value), -1, -1, 0
        cdef uint64_t h = self.key_hash(op, ka, abits, kb, bbits), tag = h >> 32, got
        cdef Py_ssize_t mask = self.slots - 1, s = <Py_ssize_t>(h & <uint64_t>mask)
        cdef int64_t e
        cdef _SRef r
        r.c = 0.0
        while True:
            got = self.table[s]
            if not got:
                break
            e = <int64_t>(got & 0xFFFFFFFFULL) - 1
            if (got >> 32) == tag and self.same(e, op, ka, abits, kb, bbits):
                r.id = e
                return r
            s = (s + 1) & mask
        if self.used >= 0xFFFFFFF0:
            raise MemoryError("the Hessian's second-order program is past 2^32 entries")
        e = self.raw(op, a, b, value)
        self.table[s] = (tag << 32) | <uint64_t>(e + 1)
        self.filled += 1
        r.id = e
        return r

    cdef _SRef entry(self, _SRef r) except *:
        """r as an entry: a constant becomes a fixed variable holding it."""
        if r.id >= 0:
            return r
        return self.shared(self.op_var, _sconst(0.0), _sconst(0.0), r.c)

    cdef _SRef neg(self, _SRef a) except *:
        if a.id < 0:
            return _sconst(-a.c)
        if self.ops[a.id] == self.op_neg and self.a0[a.id] >= 0:
            return _SRef(self.a0[a.id], 0.0)
        return self.rule(self.op_neg, 1, a, _sconst(0.0), False)

    cdef _SRef rule(self, int op, int arity, _SRef a, _SRef b, bint exact) except *:
        """The rule op of a (and b), folded on constants, shared when seen before (see
        ``_Emitter.rule``: the same rewrites, each exact, less the optional ones)."""
        cdef _SRef t
        cdef int which = -1
        if arity == 1:
            b = _sconst(0.0)
        if a.id < 0 and b.id < 0:
            if op == self.op_add:
                which = 0
            elif op == self.op_sub:
                which = 1
            elif op == self.op_mul:
                which = 2
            elif op == self.op_div:
                which = 3
            elif op == self.op_neg:
                which = 4
            if which >= 0:
                return _sconst(_sfold(which, a.c, b.c))
            a = self.entry(a)        # computed at run time, by the VM's function
        if not exact:
            if (op == self.op_add or op == self.op_sub) and _szero(b):
                return a
            if op == self.op_add and _szero(a):
                return b
            if op == self.op_sub and _szero(a) and b.id >= 0:
                return self.neg(b)
        if op == self.op_pow and b.id < 0 and a.id >= 0:
            if b.c == 1.0:
                return a
            if b.c == 0.0:
                return _sconst(1.0)
        if (op == self.op_add or op == self.op_mul) and b.id >= 0 \
                and (a.id < 0 or b.id < a.id):
            t = a
            a = b
            b = t
        if op == self.op_mul and a.id >= 0 and b.id < 0:
            if b.c == 1.0:
                return a
            if b.c == -1.0:
                return self.neg(a)
            if self.negated(a) >= 0:             # (-u) * c = u * (-c), exactly
                return self.rule(op, 2, _SRef(self.negated(a), 0.0), _sconst(-b.c), exact)
            if self.ops[a.id] == self.op_mul and self.a1[a.id] < 0 \
                    and _rescales_exactly(self.c1[a.id], b.c):
                # (u * c1) * c2 = u * (c1 * c2), here bit for bit
                return self.rule(op, 2, _SRef(self.a0[a.id], 0.0),
                                 _sconst(self.c1[a.id] * b.c), exact)
        if op == self.op_add and a.id >= 0 and b.id >= 0:
            if self.negated(b) >= 0:              # u + (-w) = u - w, exactly
                return self.rule(self.op_sub, 2, a, _SRef(self.negated(b), 0.0), exact)
            if self.negated(a) >= 0:
                return self.rule(self.op_sub, 2, b, _SRef(self.negated(a), 0.0), exact)
        if op == self.op_sub and b.id >= 0 and self.negated(b) >= 0:
            # u - (-w) = u + w, exactly
            return self.rule(self.op_add, 2, a, _SRef(self.negated(b), 0.0), exact)
        return self.shared(op, a, b, 0.0)

    cdef inline int64_t negated(self, _SRef r) noexcept:
        """u where r is the entry -u, else -1."""
        if r.id >= 0 and self.ops[r.id] == self.op_neg and self.a0[r.id] >= 0:
            return self.a0[r.id]
        return -1

    cdef _SRef add(self, _SRef a, _SRef b) except *:
        if _szero(a):
            return b
        if _szero(b):
            return a
        return self.rule(self.op_add, 2, a, b, False)

    cdef _SRef mul0(self, _SRef a, _SRef b) except *:
        """A product of derivative code: the strong zero folded here."""
        if _szero(a) or _szero(b):
            return _sconst(0.0)
        if a.id < 0 and a.c == 1.0:
            return b
        if a.id < 0 and a.c == -1.0:
            return self.neg(b)
        if b.id < 0 and b.c == 1.0:
            return a
        if b.id < 0 and b.c == -1.0:
            return self.neg(a)
        return self.rule(self.op_mul, 2, a, b, False)

    cdef _SRef expr(self, int32_t node, _SRef* env) except *:
        """The tree at ``node`` over env (x, y, z, dx, dy, dz), as ``_Emitter.expression``."""
        cdef int kind = self.n_kind[node], arg = self.n_arg[node]
        cdef _SRef a, b
        if kind == _N_NUM:
            return _sconst(self.n_num[node])
        if kind == _N_VAR:
            return env[arg]
        if kind == _N_NEG:
            return self.neg(self.expr(self.n_left[node], env))
        if kind == _N_BIN:
            a = self.expr(self.n_left[node], env)
            b = self.expr(self.n_right[node], env)
            if arg == 0:
                return self.rule(self.op_add, 2, a, b, False)
            if arg == 1:
                return self.rule(self.op_sub, 2, a, b, False)
            if arg == 2:
                return self.rule(self.op_mul, 2, a, b, False)
            return self.rule(self.op_div, 2, a, b, False)
        if kind == _N_MUL0 or kind == _N_DIV0:
            a = self.expr(self.n_left[node], env)
            if _szero(a):           # lazy, as the C macro: the factor is not computed
                return _sconst(0.0)
            b = self.expr(self.n_right[node], env)
            if kind == _N_MUL0:
                return self.mul0(a, b)
            return self.rule(self.op_div, 2, a, b, False)
        if kind == _N_RULE:
            a = self.expr(self.n_left[node], env)
            b = self.expr(self.n_right[node], env) if self.n_right[node] >= 0 \
                else _sconst(0.0)
            return self.rule(arg, self.arity[arg], a, b, False)
        self.declined = True        # a helper with no entry (sign, heaviside)
        return _sconst(0.0)


cdef inline _SRef _soperand(const int32_t[::1] arg, const double[::1] partial, _SRef* val,
                            Py_ssize_t e) noexcept:
    return val[arg[e]] if arg[e] >= 0 else _sconst(partial[e])


def _second_order_arrays(const uint8_t[::1] ops, const uint8_t[::1] kind,
                         const int32_t[::1] arg0, const int32_t[::1] arg1,
                         const double[::1] partial0, const double[::1] partial1,
                         const double[::1] recorded, const int64_t[::1] position,
                         Py_ssize_t output, const int64_t[::1] inputs,
                         const int64_t[::1] colour, Py_ssize_t K,
                         const int64_t[::1] backward, const int8_t[::1] arity,
                         const int32_t[:, ::1] partial_root, const int32_t[:, ::1] tangent_root,
                         const int32_t[::1] n_kind, const int32_t[::1] n_arg,
                         const int32_t[::1] n_left, const int32_t[::1] n_right,
                         const double[::1] n_num, opcodes):
    """The second-order program's entries (see ``second_order_arrays.program``): kind per
    tape entry 1 a variable or constant, 2 a guard, 3 a rule (anything else is refused by
    the caller); ``position``: the input number of an entry or -1; ``backward``: the
    output's ancestors that are rules, in the sweeps' reverse order. Returns (ops, arg0,
    arg1, constant0, constant1, values, ins, result ids (K, n), result constants (K, n),
    value ids of the tape's entries, live rules), or None where a rule's partial or
    tangent calls a helper with no entry."""
    cdef Py_ssize_t size = ops.shape[0], n = inputs.shape[0], e, k, c, j, t
    cdef _SecondWriter W = _SecondWriter()
    W.op_add, W.op_sub, W.op_mul, W.op_div, W.op_neg, W.op_pow, W.op_var = opcodes
    W.n_kind, W.n_arg, W.n_left, W.n_right, W.n_num = n_kind, n_arg, n_left, n_right, n_num
    W.arity = arity
    W.rehash()
    ins_array = np.full(n, -1, dtype=np.int64)
    cdef int64_t[::1] ins = ins_array
    cdef _SRef* val = <_SRef*>malloc((size + 1) * sizeof(_SRef))
    cdef _SRef* parts = <_SRef*>malloc(2 * (output + 1) * sizeof(_SRef))
    cdef _SRef* dparts = <_SRef*>malloc(2 * (output + 1) * sizeof(_SRef))
    cdef _SRef* adj = <_SRef*>malloc((output + 1) * sizeof(_SRef))
    cdef _SRef* tangent = <_SRef*>malloc((output + 1) * sizeof(_SRef))
    cdef _SRef* dadj = <_SRef*>malloc((output + 1) * sizeof(_SRef))
    cdef int64_t* stamp = <int64_t*>malloc((output + 1) * sizeof(int64_t))
    cdef uint8_t* live = <uint8_t*>calloc(output + 1, 1)
    cdef uint8_t* has = <uint8_t*>calloc(2 * (output + 1), 1)
    cdef _SRef env[6]
    cdef _SRef r0, r1, g, q, d0, d1, dz, term
    cdef int op, ar
    result_id = np.full((K, n), -1, dtype=np.int64)
    result_c = np.zeros((K, n))
    value_id = np.full(size, -1, dtype=np.int64)
    live_array = np.zeros(output + 1, dtype=np.uint8)
    cdef int64_t[:, ::1] rid = result_id
    cdef double[:, ::1] rc = result_c
    cdef int64_t[::1] vid = value_id
    cdef uint8_t[::1] lv = live_array
    try:
        if val == NULL or parts == NULL or dparts == NULL or adj == NULL or tangent == NULL \
                or dadj == NULL or stamp == NULL or live == NULL or has == NULL:
            raise MemoryError("the Hessian's second-order program does not fit in memory")
        # the recorded program's values (guards kept wherever recorded)
        for e in range(size):
            op = ops[e]
            if kind[e] == 1:
                if position[e] >= 0:
                    val[e] = _SRef(W.raw(op, _sconst(0.0), _sconst(0.0), recorded[e]), 0.0)
                    ins[position[e]] = val[e].id
                else:
                    val[e] = _sconst(recorded[e])
                continue
            r0 = _soperand(arg0, partial0, val, e)
            r1 = _soperand(arg1, partial1, val, e)
            if kind[e] == 2:
                if r0.id >= 0 or r1.id >= 0:      # else it never changes
                    W.raw(op, W.entry(r0), r1, recorded[e])
                val[e] = _sconst(recorded[e])
                continue
            ar = arity[op]
            if r0.id < 0 and (ar < 2 or r1.id < 0):
                val[e] = _sconst(recorded[e])
            else:
                val[e] = W.rule(op, ar, r0, r1, True)
            vid[e] = val[e].id
        # partials of the output's ancestors, and the adjoints
        live[output] = 1
        for e in range(output, -1, -1):
            if live[e] and kind[e] == 3:
                if arg0[e] >= 0:
                    live[arg0[e]] = 1
                if arg1[e] >= 0:
                    live[arg1[e]] = 1
        for e in range(output + 1):
            if not (live[e] and kind[e] == 3):
                continue
            lv[e] = 1
            op = ops[e]
            ar = arity[op]
            env[0] = _soperand(arg0, partial0, val, e)
            env[1] = _soperand(arg1, partial1, val, e) if ar > 1 else _sconst(0.0)
            env[2] = val[e]
            for k in range(2):
                parts[2 * e + k] = _sconst(0.0)
                if k < ar and (arg0[e] if k == 0 else arg1[e]) >= 0:
                    has[2 * e + k] = 1
                    parts[2 * e + k] = W.expr(partial_root[op, k], env)
        for e in range(output + 1):
            adj[e] = _sconst(0.0)
        adj[output] = _sconst(1.0)
        for t in range(backward.shape[0]):
            e = backward[t]
            g = adj[e]
            if _szero(g):
                continue
            for k in range(2):
                if has[2 * e + k]:
                    j = arg0[e] if k == 0 else arg1[e]
                    adj[j] = W.add(adj[j], W.mul0(parts[2 * e + k], g))
        # per colour: the tangents forward, then the adjoints' tangents
        for e in range(output + 1):
            stamp[e] = -1
        for c in range(K):
            for e in range(output + 1):
                tangent[e] = _sconst(0.0)
                dadj[e] = _sconst(0.0)
            for j in range(n):
                if inputs[j] <= output and colour[j] == c:
                    tangent[inputs[j]] = _sconst(1.0)
            for e in range(output + 1):
                if not lv[e]:
                    continue
                d0 = tangent[arg0[e]] if arg0[e] >= 0 else _sconst(0.0)
                d1 = tangent[arg1[e]] if arg1[e] >= 0 else _sconst(0.0)
                if _szero(d0) and _szero(d1):
                    continue
                dz = W.add(W.mul0(parts[2 * e], d0), W.mul0(parts[2 * e + 1], d1))
                tangent[e] = dz
                op = ops[e]
                ar = arity[op]
                env[0] = _soperand(arg0, partial0, val, e)
                env[1] = _soperand(arg1, partial1, val, e) if ar > 1 else _sconst(0.0)
                env[2] = val[e]
                env[3], env[4], env[5] = d0, d1, dz
                stamp[e] = c
                for k in range(2):
                    dparts[2 * e + k] = W.expr(tangent_root[op, k], env) \
                        if has[2 * e + k] else _sconst(0.0)
            for t in range(backward.shape[0]):
                e = backward[t]
                g, q = adj[e], dadj[e]
                if _szero(q) and stamp[e] != c:
                    continue
                for k in range(2):
                    if not has[2 * e + k]:
                        continue
                    term = W.add(W.mul0(dparts[2 * e + k], g) if stamp[e] == c
                                 else _sconst(0.0), W.mul0(parts[2 * e + k], q))
                    j = arg0[e] if k == 0 else arg1[e]
                    dadj[j] = W.add(dadj[j], term)
            for j in range(n):
                if inputs[j] <= output:
                    rid[c, j], rc[c, j] = dadj[inputs[j]].id, dadj[inputs[j]].c
            if W.declined:
                return None
        if W.declined:
            return None
        used = W.used
        P_ops = np.empty(used, dtype=np.uint8)
        P_a0 = np.empty(used, dtype=np.int64)
        P_a1 = np.empty(used, dtype=np.int64)
        P_c0 = np.empty(used)
        P_c1 = np.empty(used)
        P_v = np.empty(used)
        if used:
            memcpy(cnp.PyArray_DATA(P_ops), W.ops, used)
            memcpy(cnp.PyArray_DATA(P_a0), W.a0, used * 8)
            memcpy(cnp.PyArray_DATA(P_a1), W.a1, used * 8)
            memcpy(cnp.PyArray_DATA(P_c0), W.c0, used * 8)
            memcpy(cnp.PyArray_DATA(P_c1), W.c1, used * 8)
            memcpy(cnp.PyArray_DATA(P_v), W.v, used * 8)
        return (P_ops, P_a0, P_a1, P_c0, P_c1, P_v, ins_array, result_id, result_c,
                value_id, live_array)
    finally:
        free(val)
        free(parts)
        free(dparts)
        free(adj)
        free(tangent)
        free(dadj)
        free(stamp)
        free(live)
        free(has)

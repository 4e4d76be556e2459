# ---- sparsity: the sequential loops of sparse Jacobians and Hessians in C ----
# (easyad/_sparsity.py and compiler/tape/sparse_jacobian.py do the rest with numpy)
#
# Each loop here visits a tape entry, a column or a vertex once, in an order that only a
# sequential pass can follow (operands before results, a greedy colouring's order): in
# Python they cost a microsecond or more per entry and made building a sparse Jacobian
# of 10^5 unknowns take a minute. Sets are sorted int32 runs in one pool (CSR): an
# entry whose set equals an operand's shares that run instead of copying it.

from libc.stdlib cimport realloc


def _sparse_live(const int32_t[::1] arg0, const int32_t[::1] arg1,
                 const uint8_t[::1] select, const int64_t[::1] roots, Py_ssize_t size):
    """live[i] = 1 for the entries the roots read, directly or not (the roots included):
    both operands, and a select's condition (the entry before it)."""
    out = np.zeros(size, dtype=np.uint8)
    cdef uint8_t[::1] live = out
    cdef Py_ssize_t i, r
    cdef int32_t j
    for r in range(roots.shape[0]):
        if 0 <= roots[r] < size:
            live[roots[r]] = 1
    for i in range(size - 1, -1, -1):
        if not live[i]:
            continue
        j = arg0[i]
        if j >= 0:
            live[j] = 1
        j = arg1[i]
        if j >= 0:
            live[j] = 1
        if select[i] and i > 0:
            live[i - 1] = 1
    return out


cdef int32_t* _grow_pool(int32_t* pool, Py_ssize_t* capacity, Py_ssize_t need) except NULL:
    cdef Py_ssize_t size = capacity[0]
    cdef int32_t* grown
    if need <= size:
        return pool
    while size < need:
        size = size * 2 + 1024
    grown = <int32_t*>realloc(pool, size * sizeof(int32_t))
    if grown == NULL:
        free(pool)
        raise MemoryError("the sparsity pattern's index sets do not fit in memory")
    capacity[0] = size
    return grown


def _sparse_deps(const uint8_t[::1] kind, const int32_t[::1] arg0,
                 const int32_t[::1] arg1, const int32_t[::1] column):
    """The columns each entry depends on, as sorted runs: (start int64, length int32,
    pool int32). kind 0: none (a comparison, a guard, a fixed value, a dead entry);
    1: the input of ``column[i]``; 2: the union of its operands' sets."""
    cdef Py_ssize_t size = kind.shape[0], i, p, q, na, nb, at, capacity = 0, used = 0
    start_array = np.zeros(size, dtype=np.int64)
    length_array = np.zeros(size, dtype=np.int32)
    cdef int64_t[::1] start = start_array
    cdef int32_t[::1] length = length_array
    cdef int32_t* pool = NULL
    cdef int32_t a, b, va, vb
    try:
        for i in range(size):
            if kind[i] == 1:
                pool = _grow_pool(pool, &capacity, used + 1)
                pool[used] = column[i]
                start[i] = used
                length[i] = 1
                used += 1
            elif kind[i] == 2:
                a, b = arg0[i], arg1[i]
                na = length[a] if a >= 0 else 0
                nb = length[b] if b >= 0 else 0
                if nb == 0 or a == b or (na > 0 and start[a] == start[b] and na == nb):
                    if na:
                        start[i], length[i] = start[a], na
                    continue
                if na == 0:
                    start[i], length[i] = start[b], nb
                    continue
                pool = _grow_pool(pool, &capacity, used + na + nb)
                p = start[a]
                q = start[b]
                at = used
                while p < start[a] + na or q < start[b] + nb:   # a sorted merge
                    va = pool[p] if p < start[a] + na else 2147483647
                    vb = pool[q] if q < start[b] + nb else 2147483647
                    if va <= vb:
                        pool[at] = va
                        p += 1
                        if va == vb:
                            q += 1
                    else:
                        pool[at] = vb
                        q += 1
                    at += 1
                if at - used == na:          # b's set within a's: share a's run
                    start[i], length[i] = start[a], na
                elif at - used == nb:
                    start[i], length[i] = start[b], nb
                else:
                    start[i], length[i] = used, at - used
                    used = at
        pool_array = np.empty(used, dtype=np.int32)
        if used:
            memcpy(cnp.PyArray_DATA(pool_array), pool, used * sizeof(int32_t))
    finally:
        free(pool)
    return start_array, length_array, pool_array


def _sparse_partition(const int64_t[::1] col_ptr, const int32_t[::1] col_rows,
                      const int64_t[::1] row_ptr, const int32_t[::1] row_cols,
                      const int64_t[::1] order, Py_ssize_t limit):
    """A greedy distance-2 colouring of columns (no row holds two columns of one colour):
    each column of ``order`` takes the smallest colour the columns sharing its rows leave
    free; -1 once more than ``limit`` colours (limit >= 0) would be needed."""
    cdef Py_ssize_t n = col_ptr.shape[0] - 1, t, p, q, k
    cdef int64_t c, c2
    cdef int32_t r
    colour_array = np.full(n, -1, dtype=np.intp)
    cdef Py_ssize_t[::1] colour = colour_array
    mark_array = np.full(n + 1, -1, dtype=np.int64)
    cdef int64_t[::1] mark = mark_array
    for t in range(order.shape[0]):
        c = order[t]
        for p in range(col_ptr[c], col_ptr[c + 1]):
            r = col_rows[p]
            for q in range(row_ptr[r], row_ptr[r + 1]):
                c2 = row_cols[q]
                if colour[c2] >= 0:
                    mark[colour[c2]] = c
        k = 0
        while mark[k] == c:
            k += 1
        if 0 <= limit <= k:
            return None
        colour[c] = k
    return colour_array


def _star_colour(const int64_t[::1] ptr, const int32_t[::1] adj, const int64_t[::1] order):
    """A greedy star colouring of a graph (neighbour lists ``adj[ptr[v]:ptr[v + 1]]``, no
    self loops): neighbours differ, and no path on four vertices has two colours. Per
    vertex of ``order``: forbid its neighbours' colours; of a neighbour w's neighbour x,
    forbid x's colour where w is uncoloured (v and x are at distance 2) or where x has
    another neighbour of w's colour (v-w-x-y would be two-coloured)."""
    cdef Py_ssize_t n = ptr.shape[0] - 1, t, p, q, s, k
    cdef int64_t v, w, x, y, cw, cx
    colour_array = np.full(n, -1, dtype=np.intp)
    cdef Py_ssize_t[::1] colour = colour_array
    mark_array = np.full(n + 1, -1, dtype=np.int64)
    cdef int64_t[::1] mark = mark_array
    for t in range(order.shape[0]):
        v = order[t]
        for p in range(ptr[v], ptr[v + 1]):
            w = adj[p]
            cw = colour[w]
            if cw >= 0:
                mark[cw] = v
            for q in range(ptr[w], ptr[w + 1]):
                x = adj[q]
                cx = colour[x]
                if x == v or cx < 0 or mark[cx] == v:
                    continue
                if cw < 0:
                    mark[cx] = v
                    continue
                for s in range(ptr[x], ptr[x + 1]):
                    y = adj[s]
                    if y != w and colour[y] == cw:
                        mark[cx] = v
                        break
        k = 0
        while mark[k] == v:
            k += 1
        colour[v] = k
    return colour_array


# ---- the sparse Jacobian's tangents, forward mode over the nonzeros ----

cdef struct _Ref:
    int64_t id      # an entry of the program, or -1: the constant ``scale``
    double scale    # the tangent is scale * value(id); (-1, 0.0) is no tangent


cdef class _TangentWriter:
    """The entries a Jacobian's tangents add to its program, written into arrays."""
    cdef uint8_t[::1] ops
    cdef int32_t[::1] a0, a1
    cdef double[::1] c0, c1
    cdef Py_ssize_t used, base
    cdef int op_mul, op_add, op_sub

    cdef int64_t emit(self, int op, int64_t x, double cx, int64_t y, double cy):
        cdef Py_ssize_t at = self.used
        self.ops[at] = op
        self.a0[at] = <int32_t>x
        self.a1[at] = <int32_t>y
        self.c0[at] = cx if x < 0 else 0.0
        self.c1[at] = cy if y < 0 else 0.0
        self.used += 1
        return self.base + at

    cdef _Ref term(self, int64_t pid, double pc, _Ref t):
        """partial * tangent, constants folded into the scale."""
        cdef _Ref out
        if pid < 0:
            out.id, out.scale = t.id, pc * t.scale
            if out.scale == 0.0:
                out.id = -1
        elif t.id < 0:
            out.id, out.scale = pid, t.scale
        else:
            out.id = self.emit(self.op_mul, pid, 0.0, t.id, 0.0)
            out.scale = t.scale
        return out

    cdef _Ref total(self, _Ref u, _Ref w):
        """u + w, with one scale factored out where both are entries."""
        cdef _Ref out, swap
        if u.id < 0 and u.scale == 0.0:
            return w
        if w.id < 0 and w.scale == 0.0:
            return u
        if u.id < 0 and w.id < 0:
            out.id, out.scale = -1, u.scale + w.scale
            return out
        if u.id < 0:
            swap = u
            u = w
            w = swap
        out.scale = u.scale
        if w.id < 0:                  # s v + c = s (v + c / s)
            out.id = self.emit(self.op_add, u.id, 0.0, -1, w.scale / u.scale)
        elif u.id == w.id and u.scale != w.scale:
            out.id, out.scale = u.id, u.scale + w.scale
            if out.scale == 0.0:
                out.id = -1
        elif w.scale == u.scale:    # also v + v: an entry now keeps later scales at 1
            out.id = self.emit(self.op_add, u.id, 0.0, w.id, 0.0)
        elif w.scale == -u.scale:
            out.id = self.emit(self.op_sub, u.id, 0.0, w.id, 0.0)
        else:                          # s v + t w = s (v + (t / s) w)
            out.id = self.emit(self.op_mul, w.id, 0.0, -1, w.scale / u.scale)
            out.id = self.emit(self.op_add, u.id, 0.0, out.id, 0.0)
        return out


def _sparse_tangents(const uint8_t[::1] kind, const int32_t[::1] arg0,
                     const int32_t[::1] arg1, const int64_t[::1] start,
                     const int32_t[::1] length, const int32_t[::1] pool,
                     const int64_t[::1] pairs, const int64_t[::1] pid0,
                     const int64_t[::1] pid1, const double[::1] pc0, const double[::1] pc1,
                     Py_ssize_t base, int op_mul, int op_add, int op_sub):
    """Forward mode over the columns each entry depends on, symbolically: the tangent of
    entry i along column pool[start[i] + j] is pair pairs[i] + j, as (id int64, scale
    float64) arrays, scale * value(id) (id -1: the constant scale). kind 1: an input (its
    tangent 1); 2: partial_0 t_a + partial_1 t_b, a partial being an entry pid_k >= 0 of
    the program or the constant pc_k. Returns (id, scale, ops, arg0, arg1, constant0,
    constant1): the entries written, numbered from ``base``, with their constant operands
    (an operand -1 reads the constant)."""
    cdef Py_ssize_t size = kind.shape[0], i, j, q, k, total_pairs = 0
    cdef int32_t a, col
    cdef int64_t pid
    cdef double pc
    cdef _Ref t, acc, here
    for i in range(size):
        if kind[i] == 2:
            total_pairs += length[i]
    n_pairs = pairs[size] if size else 0
    ids = np.full(n_pairs, -1, dtype=np.int64)
    scales = np.zeros(n_pairs, dtype=np.float64)
    cdef int64_t[::1] tid = ids
    cdef double[::1] ts = scales
    cdef _TangentWriter W = _TangentWriter()
    W.ops = np.zeros(4 * total_pairs + 1, dtype=np.uint8)
    W.a0 = np.zeros(4 * total_pairs + 1, dtype=np.int32)
    W.a1 = np.zeros(4 * total_pairs + 1, dtype=np.int32)
    W.c0 = np.zeros(4 * total_pairs + 1, dtype=np.float64)
    W.c1 = np.zeros(4 * total_pairs + 1, dtype=np.float64)
    W.used, W.base = 0, base
    W.op_mul, W.op_add, W.op_sub = op_mul, op_add, op_sub
    for i in range(size):
        if kind[i] == 1 and length[i]:
            tid[pairs[i]] = -1
            ts[pairs[i]] = 1.0
            continue
        if kind[i] != 2:
            continue
        for j in range(length[i]):
            tid[pairs[i] + j] = -1
            ts[pairs[i] + j] = 0.0
        for k in range(2):
            a = arg0[i] if k == 0 else arg1[i]
            if a < 0 or length[a] == 0 or kind[a] == 0:
                continue
            pid = pid0[i] if k == 0 else pid1[i]
            pc = pc0[i] if k == 0 else pc1[i]
            if pid < 0 and pc == 0.0:
                continue
            q = 0
            for j in range(length[i]):       # a's columns are among i's, both sorted
                col = pool[start[i] + j]
                while q < length[a] and pool[start[a] + q] < col:
                    q += 1
                if q == length[a]:
                    break
                if pool[start[a] + q] != col:
                    continue
                t.id, t.scale = tid[pairs[a] + q], ts[pairs[a] + q]
                here = W.term(pid, pc, t)
                acc.id, acc.scale = tid[pairs[i] + j], ts[pairs[i] + j]
                acc = W.total(acc, here)
                tid[pairs[i] + j], ts[pairs[i] + j] = acc.id, acc.scale
    used = W.used
    return (ids, scales, np.asarray(W.ops)[:used].copy(), np.asarray(W.a0)[:used].copy(),
            np.asarray(W.a1)[:used].copy(), np.asarray(W.c0)[:used].copy(),
            np.asarray(W.c1)[:used].copy())

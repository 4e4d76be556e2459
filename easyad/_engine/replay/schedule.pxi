# Scheduling: the computing entries reordered, dependencies kept, into runs of one
# opcode (list scheduling by key), each select's condition kept right before it.

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

# ---- recorded tensor programs: calling their generated C (compiler/program/fused_c.py) ----
# A segment is `void easyad_segment_k(void** P)`: P holds one pointer per slot of the
# program (then the index arrays it reads). These two helpers are what a replayed call
# costs in Python around the C: ~50 ns each, where ctypes takes ~1 us.

ctypedef void (*_segment_fn)(void** P) noexcept nogil


cdef void** _pointer_table(cnp.ndarray pointers, Py_ssize_t need) except NULL:
    if pointers.dtype.num != cnp.NPY_UINT64 or not cnp.PyArray_IS_C_CONTIGUOUS(pointers) \
            or pointers.ndim != 1 or pointers.shape[0] < need:
        raise ValueError("a program's pointer table is a C-contiguous uint64 array of "
                         "one entry per slot")
    return <void**>cnp.PyArray_DATA(pointers)


def _segment_call(size_t fn, cnp.ndarray pointers, bint release_gil):
    """Run the segment at address ``fn`` over the pointer table (without the GIL when
    ``release_gil``: large loops)."""
    cdef void** P = _pointer_table(pointers, 0)
    cdef _segment_fn f = <_segment_fn>fn
    if fn == 0:
        raise ValueError("no segment at address 0")
    if release_gil:
        with nogil:
            f(P)
    else:
        f(P)


def _point_at(cnp.ndarray pointers, Py_ssize_t k, cnp.ndarray a):
    """pointers[k] = the address of ``a``'s data (C-contiguous)."""
    cdef void** P = _pointer_table(pointers, k + 1)
    if k < 0:
        raise IndexError("slot number below 0")
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError("a program's buffers are C-contiguous")
    P[k] = cnp.PyArray_DATA(a)


def _segments_batch(cnp.ndarray fns, cnp.ndarray pointers, cnp.ndarray slots,
                    cnp.ndarray bases, cnp.ndarray strides, Py_ssize_t count):
    """Run a program's segments (addresses ``fns``, in order) at ``count`` points, without
    the GIL: before point b, slot ``slots[k]`` points at ``bases[k] + b * strides[k]``
    (batched inputs and outputs; stride 0 for what every point shares)."""
    cdef void** P = _pointer_table(pointers, 0)
    for a, dtype in ((fns, cnp.NPY_UINT64), (slots, cnp.NPY_INT64), (bases, cnp.NPY_UINT64),
                     (strides, cnp.NPY_INT64)):
        if a.dtype.num != dtype or not cnp.PyArray_IS_C_CONTIGUOUS(a) or a.ndim != 1:
            raise ValueError("a batch's tables are C-contiguous 1-D arrays of 64-bit ints")
    cdef Py_ssize_t n_fns = fns.shape[0], n = slots.shape[0], b, k
    if bases.shape[0] != n or strides.shape[0] != n:
        raise ValueError("one base and one stride per slot")
    cdef uint64_t* F = <uint64_t*>cnp.PyArray_DATA(fns)
    cdef int64_t* S = <int64_t*>cnp.PyArray_DATA(slots)
    cdef uint64_t* B0 = <uint64_t*>cnp.PyArray_DATA(bases)
    cdef int64_t* D = <int64_t*>cnp.PyArray_DATA(strides)
    for k in range(n):
        if not 0 <= S[k] < pointers.shape[0]:
            raise IndexError(f"slot {S[k]} is not in the pointer table")
    for k in range(n_fns):
        if F[k] == 0:
            raise ValueError("no segment at address 0")
    with nogil:
        for b in range(count):
            for k in range(n):
                P[S[k]] = <void*>(<char*><size_t>B0[k] + b * D[k])
            for k in range(n_fns):
                (<_segment_fn><size_t>F[k])(P)

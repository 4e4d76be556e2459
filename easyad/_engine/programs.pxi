# ---- recorded tensor programs: calling their generated C (tensor/_program_c.py) ----
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

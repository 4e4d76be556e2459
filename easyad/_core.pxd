# Declarations of the compiled core's classes, so later Cython modules can cimport them.
from libc.stdint cimport uint8_t, int32_t


cdef class Trace:
    cdef readonly double number
    cdef readonly double derivative


cdef class NestedTrace:
    # a Trace of Numerics (_nested.pxi): the parts, and their kind (2 * depth + over Records)
    cdef object _primal
    cdef object _tangent
    cdef int _kind

    cdef int _init(self, object number, object derivative) except -1


cdef class Derivatives
cdef class Record


cdef class WengertList:
    # Struct of arrays, one allocation each (see _tape.pxi: malloc, then mappings)
    cdef double* _values
    cdef double* _partial0   # d entry / d arg0, or the constant when arg0 < 0
    cdef double* _partial1   # d entry / d arg1, or the constant when arg1 < 0
    cdef int32_t* _arg0      # operand indices; -1: none or a constant
    cdef int32_t* _arg1
    cdef uint8_t* _ops       # opcodes (_rules.OPCODES)
    cdef Py_ssize_t _length
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _written     # the most entries held before a clear() (pages written)
    cdef Py_ssize_t _max_entries
    cdef readonly unsigned long long generation
    cdef int _active_sweeps  # sweeps running without the GIL read the block
    cdef list _retired       # (address, bytes, mapped) of arrays replaced while sweeps ran
    cdef dict _nodes         # entry index -> Python node (OP_NODE: tensor operations)
    cdef list _node_order    # indices of OP_NODE entries, ascending
    cdef dict _customs       # entry index -> user primitive (OP_CUSTOM)
    cdef dict _names         # entry index -> name
    cdef readonly dict _lines  # entry index -> "file:line" that recorded it (anomaly mode)
    cdef dict _indices       # name -> entry index
    cdef readonly Py_ssize_t serial
    cdef bint _frozen        # owned by a Function: clear() is refused
    cdef dict _pending       # entry index -> PendingNumber: values still on a device
    cdef bint _strict        # recorded by ad.record(..., strict=True): user code may not
                             # read its values (per list, so threads record independently)

    cdef int _grow(self) except -1
    cdef int _resize(self, Py_ssize_t capacity) except -1
    cdef void _point(self, char** arrays) noexcept
    cdef int _take_spare(self, char** arrays, bint keep) except -1
    cdef void _free_retired(self) noexcept
    cdef Py_ssize_t _append(self, uint8_t op, Py_ssize_t a, Py_ssize_t b, double z,
                            double pa, double pb) except -1
    cdef Record _push(self, uint8_t op, Py_ssize_t a, Py_ssize_t b, double z,
                      double pa, double pb)
    cdef Py_ssize_t _push_node_entry(self, object node, double number) except -1
    cdef int _settle_all(self) except -1
    cdef Derivatives _backward(self, Py_ssize_t output, object seed=*)
    cdef int _sweep_range(self, double* adjoints, Py_ssize_t lo, Py_ssize_t hi) except -1
    cdef int _mixed_sweep(self, Derivatives d, Py_ssize_t output, object seed) except -1


cdef class Record:
    cdef double _number      # the value; Python reads it through the number property
    cdef object _pending     # a PendingNumber while the value is still on a device, else None
    cdef readonly WengertList tape
    cdef readonly Py_ssize_t index
    cdef unsigned long long generation


cdef class Derivatives:
    cdef double* _adjoints
    cdef dict _node_adjoints  # adjoints of tensor entries (OP_NODE), by index
    cdef Py_ssize_t _length
    cdef readonly WengertList tape
    cdef unsigned long long generation

    cdef WengertList _checked_tape(self)


cdef class Comparison:
    cdef readonly WengertList tape
    cdef readonly Py_ssize_t index
    cdef unsigned long long generation
    cdef bint _outcome       # read through the outcome property, which marks a guard

    cdef bint _branch(self)

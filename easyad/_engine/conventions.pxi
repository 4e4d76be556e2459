# The structural conventions of the tape, stated once for the compiled core: which
# entries compute a value, which are comparisons and guards, where a select finds its
# condition. Every C loop (sweeps, replay, the validator, branches) asks these; the Python
# interpreters read the same conventions through easyad/_tapeview.py, and
# tests/test_tapeview.py checks the two agree opcode by opcode (_conventions_table).

cdef enum:
    _GUARD_OFFSET = OP_GUARD_LT - OP_COMPARE_LT   # guard_<c> = compare_<c> + this


cdef inline bint _computes(int op) noexcept nogil:
    # an input's value is set, not computed (constant: reserved, never recorded)
    return op != OP_VARIABLE and op != OP_CONSTANT


cdef inline bint _is_rule(int op) noexcept nogil:
    return op >= OP_FIRST_RULE


cdef inline bint _is_comparison(int op) noexcept nogil:
    # compare_<c> (read by a select) or guard_<c> (a branch Python took)
    return OP_COMPARE_LT <= op <= OP_GUARD_NE


cdef inline bint _is_guard(int op) noexcept nogil:
    return OP_GUARD_LT <= op <= OP_GUARD_NE


cdef inline bint _passes_derivative(int op) noexcept nogil:
    # a comparison's outcome is piecewise constant: no adjoint flows through it
    return _computes(op) and not _is_comparison(op)


cdef inline Py_ssize_t _select_condition(Py_ssize_t e) noexcept nogil:
    # a select reads its condition from the comparison entry just before it
    return e - 1


cdef inline bint _compare_values(int op, double x, double y) noexcept nogil:
    # op is a compare_ or guard_ opcode; NaN compares false except with !=, as in Python
    if op >= OP_GUARD_LT:
        op -= _GUARD_OFFSET
    if op == OP_COMPARE_LT:
        return x < y
    if op == OP_COMPARE_LE:
        return x <= y
    if op == OP_COMPARE_GT:
        return x > y
    if op == OP_COMPARE_GE:
        return x >= y
    if op == OP_COMPARE_EQ:
        return x == y
    return x != y


def _conventions_table():
    """Per opcode: (computes, is_comparison, is_guard, passes_derivative, is_rule)."""
    return [(bool(_computes(op)), bool(_is_comparison(op)), bool(_is_guard(op)),
             bool(_passes_derivative(op)), bool(_is_rule(op))) for op in range(OP_COUNT)]

# Branches on Records: comparisons, guards and selects.
# A comparison of Records appends an entry (opcode compare_<op>, the operands, the outcome
# as its value) and returns a Comparison. Python branching on it (bool(), `if`, `and`) turns
# the entry into a guard: replay at a new point checks that the outcome is still the same.
# ad.where(cond, a, b) with a Comparison appends a select instead, whose condition replay
# evaluates again, so it follows the new branch without raising.

_SYMBOLS = {OP_COMPARE_LT: "<", OP_COMPARE_LE: "<=", OP_COMPARE_GT: ">",
            OP_COMPARE_GE: ">=", OP_COMPARE_EQ: "==", OP_COMPARE_NE: "!="}


cdef object _record_compare(Record a, object other, int op):
    cdef double y
    cdef Py_ssize_t ib = -1
    cdef WengertList tape
    if type(other) is Record:
        tape = _common_tape(a, <Record>other)
        y = (<Record>other)._number
        ib = (<Record>other).index
    elif _coerce_real(other, &y, Record):
        tape = _live_tape(a)
    else:
        return NotImplemented
    cdef double x = a._number     # (after _live_tape/_common_tape above, as they require)
    cdef bint outcome = _compare_values(op, x, y)
    if tape is None:  # constants only: nothing to record
        return outcome
    cdef Py_ssize_t ia = a.index
    cdef Py_ssize_t n = tape._append(op, ia, ib, 1.0 if outcome else 0.0,
                                     x if ia < 0 else 0.0, y if ib < 0 else 0.0)
    cdef Comparison c = Comparison.__new__(Comparison)
    c.tape = tape
    c.index = n
    c.generation = tape.generation
    c._outcome = outcome
    return c


@cython.final
@cython.freelist(64)
cdef class Comparison:
    """The outcome of comparing Records, recorded on their WengertList.

    It behaves as the bool outcome. Branching on it (``if x > 0:``), or reading the outcome
    any other way (``c.outcome``, ``int(c)``, ``repr(c)``, ``hash(c)``...), makes the
    comparison a *guard*: a Function replayed at a point where the outcome differs reports the changed
    branch. Passed to ``ad.where(x > 0, a, b)`` it makes a *select*, which replay evaluates
    again at every point.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(2.0)
    >>> c = x > 1.0
    >>> bool(c), c.is_guard          # branching on it made it a guard
    (True, True)
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("Comparisons come from comparing Records (x < y)")

    cdef bint _branch(self):
        # Python looked at the outcome: the tape must check it on replay
        cdef WengertList tape = self.tape
        cdef uint8_t op
        if tape is not None and self.generation == tape.generation:
            op = tape._ops[self.index]
            if op < OP_GUARD_LT:
                tape._ops[self.index] = op + _GUARD_OFFSET
        return self._outcome

    def __bool__(self):
        return self._branch()

    def __index__(self):
        return 1 if self._branch() else 0

    def __int__(self):
        return 1 if self._branch() else 0

    def __float__(self):
        return 1.0 if self._branch() else 0.0

    def __eq__(self, other):
        return self._branch() == other

    def __ne__(self, other):
        return self._branch() != other

    def __hash__(self):
        return hash(self._branch())

    def __invert__(self):
        return not self._branch()

    def __and__(self, other):
        return self._branch() & bool(other)

    def __rand__(self, other):
        return bool(other) & self._branch()

    def __or__(self, other):
        return self._branch() | bool(other)

    def __ror__(self, other):
        return bool(other) | self._branch()

    def __xor__(self, other):
        return self._branch() ^ bool(other)

    def __rxor__(self, other):
        return bool(other) ^ self._branch()

    def __add__(self, other):
        return int(self) + other

    def __radd__(self, other):
        return other + int(self)

    @property
    def is_guard(self):
        """Whether Python branched on this comparison (replay then checks it)."""
        cdef WengertList tape = self.tape
        return (tape is not None and self.generation == tape.generation
                and tape._ops[self.index] >= OP_GUARD_LT)

    @property
    def outcome(self):
        """The bool outcome; reading it marks a guard, as branching on it does."""
        return self._branch()

    # Every other way of reading the outcome marks a guard too: the text of repr/str, a
    # hash or a pickle can steer the program as well as an ``if`` can.
    def __repr__(self):
        return repr(self._branch())

    def __reduce__(self):
        # the tape entry it names does not travel: pickle the outcome, bool(c)
        return (bool, (self._branch(),))


cdef inline int _select_operand(object v, WengertList tape, Py_ssize_t* index,
                                double* number) except -1:
    if type(v) is Record:
        if _live_tape(<Record>v) is not None and (<Record>v).tape is not tape:
            _raise_tape_mismatch(tape, (<Record>v).tape, "where()")
        index[0] = (<Record>v).index
        number[0] = (<Record>v)._number
        return 0
    if _coerce_real(v, number, Record):
        index[0] = -1
        return 0
    raise TypeError(f"where() on Records selects between numbers or Records, "
                    f"got {type(v).__name__}")


cdef Record _record_select(Comparison condition, object a, object b):
    cdef WengertList tape = condition.tape
    cdef Py_ssize_t ia, ib, c = condition.index, n
    cdef double x, y
    cdef uint8_t op
    if condition.generation != tape.generation:
        raise StaleRecordError(f"this comparison was made on {tape!r} before it was "
                               f"cleared; compare the new records")
    _select_operand(a, tape, &ia, &x)
    _select_operand(b, tape, &ib, &y)
    cdef bint chosen = condition._outcome   # a select is no guard: replay re-evaluates it
    if c != _select_condition(tape._length):
        # the select will read its condition from the entry just before it: copy it there
        op = tape._ops[c]
        if op >= OP_GUARD_LT:
            op -= _GUARD_OFFSET
        c = tape._append(op, tape._arg0[c], tape._arg1[c], tape._values[c],
                         tape._partial0[c], tape._partial1[c])
    # partials: 1 for the chosen operand, 0 (a strong zero) for the other; a constant
    # operand's slot holds the constant instead
    return tape._push(OP_SELECT, ia, ib, x if chosen else y,
                      (1.0 if chosen else 0.0) if ia >= 0 else x,
                      (0.0 if chosen else 1.0) if ib >= 0 else y)

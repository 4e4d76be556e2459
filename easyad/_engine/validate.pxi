# The one gate for tapes that come from outside (ad.load, unpickling a WengertList or a
# Function): every entry is checked in C, without the GIL, before any sweep or
# _build_program reads it, since those index arrays by operand without bounds checks.
# A failure raises TapeFormatError naming the field, the entry and the bad value.

cdef enum:
    _FAULT_NONE = 0
    _FAULT_OPCODE = 1         # not an opcode of this easyad
    _FAULT_RESERVED = 2       # an opcode never written to a file or pickle (constant, node)
    _FAULT_ARG0 = 3           # operand 0 outside [-1, e) (or [0, e) where required)
    _FAULT_ARG1 = 4
    _FAULT_UNARY_ARG1 = 5     # a one-operand rule with a second operand
    _FAULT_VARIABLE_ARGS = 6  # a variable with operands
    _FAULT_SELECT_FIRST = 7   # a select at entry 0 (it reads entry e - 1)
    _FAULT_SELECT_CONDITION = 8  # the entry before a select is not a comparison
    _FAULT_COMPARISON_VALUE = 9  # a comparison's recorded outcome is not 0.0 or 1.0
    _FAULT_CUSTOM_PAYLOAD = 10   # a custom entry without its primitive, or the reverse
    _FAULT_NO_OPERAND = 11    # a binary rule with neither operand recorded


cdef Py_ssize_t _check_entries(const uint8_t* ops, const int32_t* arg0, const int32_t* arg1,
                               const double* values, const uint8_t* payload, Py_ssize_t n,
                               int* fault) noexcept nogil:
    # The first bad entry (fault[0] says why), or -1. payload[e] is 1 where a user
    # primitive was pickled with the list (NULL: none).
    cdef Py_ssize_t e
    cdef int op, lo0, arity
    cdef int32_t a, b
    for e in range(n):
        op = ops[e]
        a = arg0[e]
        b = arg1[e]
        if op >= OP_COUNT:
            fault[0] = _FAULT_OPCODE
            return e
        if op == OP_CONSTANT or op == OP_NODE:
            fault[0] = _FAULT_RESERVED
            return e
        if (op == OP_CUSTOM) != (payload != NULL and payload[e] != 0):
            fault[0] = _FAULT_CUSTOM_PAYLOAD
            return e
        if op == OP_VARIABLE:
            if a != -1 or b != -1:
                fault[0] = _FAULT_VARIABLE_ARGS
                return e
            continue
        # rules of one operand and comparisons read a recorded entry first; the rest may
        # read a constant (-1) in either place
        arity = easyad_rule_arity(op) if op >= OP_FIRST_RULE else 2
        lo0 = 0 if (op >= OP_FIRST_RULE and arity == 1) or _is_comparison(op) else -1
        if a < lo0 or a >= e:
            fault[0] = _FAULT_ARG0
            return e
        if op >= OP_FIRST_RULE and arity == 1:
            if b != -1:
                fault[0] = _FAULT_UNARY_ARG1
                return e
        elif b < -1 or b >= e:
            fault[0] = _FAULT_ARG1
            return e
        if op >= OP_FIRST_RULE and arity == 2 and a < 0 and b < 0:
            fault[0] = _FAULT_NO_OPERAND
            return e
        if op == OP_SELECT:
            if e == 0:
                fault[0] = _FAULT_SELECT_FIRST
                return e
            if not _is_comparison(ops[_select_condition(e)]):
                fault[0] = _FAULT_SELECT_CONDITION
                return e
        if _is_comparison(op) and values[e] != 0.0 and values[e] != 1.0:
            fault[0] = _FAULT_COMPARISON_VALUE
            return e
    fault[0] = _FAULT_NONE
    return -1


cdef str _fault_text(int fault, Py_ssize_t e, const uint8_t* ops, const int32_t* arg0,
                     const int32_t* arg1, const double* values):
    cdef int op = ops[e]
    name = OPCODE_NAMES[op] if op < OP_COUNT else None
    if fault == _FAULT_OPCODE:
        return (f"entry {e}: ops[{e}] = {op} is not an opcode of this easyad "
                f"(0 to {OP_COUNT - 1})")
    if fault == _FAULT_RESERVED:
        return (f"entry {e}: ops[{e}] = {op} ({name}) is never saved or pickled "
                f"(tensor operations and reserved opcodes do not travel)")
    if fault == _FAULT_ARG0:
        lowest = "0" if op >= OP_FIRST_RULE and easyad_rule_arity(op) == 1 \
            or _is_comparison(op) else "-1"
        return (f"entry {e} ({name}): arg0[{e}] = {arg0[e]} is not an earlier entry "
                f"(it must be in [{lowest}, {e}))")
    if fault == _FAULT_ARG1:
        return (f"entry {e} ({name}): arg1[{e}] = {arg1[e]} is not an earlier entry "
                f"(it must be in [-1, {e}))")
    if fault == _FAULT_UNARY_ARG1:
        return f"entry {e} ({name}) takes one operand, but arg1[{e}] = {arg1[e]} (not -1)"
    if fault == _FAULT_VARIABLE_ARGS:
        return (f"entry {e} (variable) has operands arg0 = {arg0[e]}, arg1 = {arg1[e]} "
                f"(a variable has none: -1, -1)")
    if fault == _FAULT_SELECT_FIRST:
        return "entry 0 is a select, which reads its condition from the entry before it"
    if fault == _FAULT_SELECT_CONDITION:
        return (f"entry {e} (select) reads its condition from entry {e - 1}, which is "
                f"{OPCODE_NAMES[ops[e - 1]]}, not a comparison")
    if fault == _FAULT_COMPARISON_VALUE:
        return (f"entry {e} ({name}) holds the outcome {values[e]!r} (a comparison "
                f"records 0.0 or 1.0)")
    if fault == _FAULT_CUSTOM_PAYLOAD:
        if op == OP_CUSTOM:
            return f"entry {e} (custom) has no user primitive with it"
        return f"a user primitive is given for entry {e}, which is {name}, not custom"
    if fault == _FAULT_NO_OPERAND:
        return f"entry {e} ({name}) has no recorded operand (arg0 = arg1 = -1)"
    return f"entry {e}: fault {fault}"


cdef int _raise_tape_format(str source, str problem) except -1:
    raise TapeFormatError(f"{source}: {problem}. The data is damaged, or is not a saved "
                          f"easyad Function or a tape pickled by easyad")


cdef uint32_t _digest_bytes(object parts, uint32_t crc) except? 0xFFFFFFFF:
    # CRC-32 (zlib) of the parts, chained: the checksum a file or pickle carries
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def _tape_digest(parts, extra=()):
    """CRC-32 of the six entry arrays' bytes and ``repr(extra)`` (the rest of the data):
    the checksum saved files and pickles carry, so damage that still passes the
    structural checks (an operand index changed within range) is caught too."""
    cdef uint32_t crc = _digest_bytes(parts, 0)
    return int(zlib.crc32(repr(extra).encode(), crc))


def _validate_entries(Py_ssize_t n, tuple parts, customs, str source):
    """Check the six parts (bytes of values, partial0, partial1, arg0, arg1, ops, as
    WengertList.__reduce__ writes them) of an n-entry tape; raise TapeFormatError."""
    cdef Py_ssize_t k, bad, index
    cdef int fault = 0
    cdef const uint8_t[::1] payload_view
    cdef const uint8_t* payload = NULL
    sizes = (8 * n, 8 * n, 8 * n, 4 * n, 4 * n, n)
    fields = ("values", "partial0", "partial1", "arg0", "arg1", "ops")
    if len(parts) != 6:
        _raise_tape_format(source, f"6 entry arrays expected, got {len(parts)}")
    for k in range(6):
        if type(parts[k]) is not bytes:
            _raise_tape_format(source, f"{fields[k]} is a {type(parts[k]).__name__}, "
                                       f"not bytes")
        if len(parts[k]) != sizes[k]:
            _raise_tape_format(source, f"{fields[k]} holds {len(parts[k])} bytes; "
                                       f"{n} entries need {sizes[k]}")
    payload_array = None
    if customs:
        payload_array = np.zeros(n, dtype=np.uint8)
        for index in customs:
            if not 0 <= index < n:
                _raise_tape_format(source, f"a user primitive is given for entry {index}, "
                                           f"which is not an entry (0 to {n - 1})")
            payload_array[index] = 1
        payload_view = payload_array
        payload = &payload_view[0]
    cdef const char* ops = parts[5]
    cdef const char* arg0 = parts[3]
    cdef const char* arg1 = parts[4]
    cdef const char* values = parts[0]
    with nogil:
        bad = _check_entries(<const uint8_t*>ops, <const int32_t*>arg0,
                             <const int32_t*>arg1, <const double*>values, payload, n, &fault)
    if bad >= 0:
        _raise_tape_format(source, _fault_text(fault, bad, <const uint8_t*>ops,
                                               <const int32_t*>arg0, <const int32_t*>arg1,
                                               <const double*>values))


cdef Py_ssize_t _index_field(object value, str what, str source) except? -2:
    # an int (not a bool, float or str) that fits an entry index
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _raise_tape_format(source, f"{what} is {value!r} ({type(value).__name__}), not an int")
    if not -1 <= value <= _INDEX_LIMIT:
        _raise_tape_format(source, f"{what} = {value} is out of range")
    return value


def _validate_ends(WengertList tape, inputs, outputs, str source):
    """Inputs (distinct variables) and outputs (entries, at least one) of a Function made
    from outside data; returns them as lists of ints, or raises TapeFormatError."""
    cdef Py_ssize_t n = tape._length, i, index
    checked = []
    for what, sequence in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(sequence, (list, tuple)):
            _raise_tape_format(source, f"{what} is a {type(sequence).__name__}, not a "
                                       f"sequence of entry indices")
        out = []
        for i, value in enumerate(sequence):
            index = _index_field(value, f"{what}[{i}]", source)
            if not 0 <= index < n:
                _raise_tape_format(source, f"{what}[{i}] = {index} is not an entry "
                                           f"(0 to {n - 1})")
            if what == "inputs" and tape._ops[index] != OP_VARIABLE:
                _raise_tape_format(source, f"inputs[{i}] = {index} is entry {index} "
                                           f"({OPCODE_NAMES[tape._ops[index]]}), "
                                           f"not a variable")
            out.append(index)
        checked.append(out)
    if len(set(checked[0])) != len(checked[0]):
        _raise_tape_format(source, f"inputs {checked[0]} name one variable twice")
    if not checked[1]:
        _raise_tape_format(source, "no outputs")
    return checked

# Pickles of the tape (included after sweep.pxi): the rebuilders a WengertList's and a
# Record's __reduce__ name, every field validated first (validate.pxi) so that a damaged
# or hostile pickle raises TapeFormatError instead of building a list the C loops trust.

def _rebuild_wengert_list(*state, source="pickled WengertList"):
    """A WengertList from the data of __reduce__ (or ad.load): (n, parts, names,
    max_entries[, customs[, checksum]]), every field validated first (TapeFormatError).
    Pickles of easyad before the checksum have 4 or 5 fields: only the checksum is skipped."""
    cdef WengertList lst
    cdef Py_ssize_t k, size
    cdef char* destinations[6]
    if not 4 <= len(state) <= 6:
        _raise_tape_format(source, f"4 to 6 fields expected, got {len(state)}")
    n, parts, names, max_entries = state[:4]
    customs = state[4] if len(state) > 4 else None
    checksum = state[5] if len(state) > 5 else None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= _INDEX_LIMIT:
        _raise_tape_format(source, f"the length {n!r} is not an int from 0 to {_INDEX_LIMIT}")
    if not isinstance(parts, tuple):
        _raise_tape_format(source, f"the entries are a {type(parts).__name__}, not a tuple")
    if n == 0 and parts == ():
        parts = (b"",) * 6
    if customs is None:
        customs = {}
    if not isinstance(names, dict) or not isinstance(customs, dict):
        _raise_tape_format(source, "names and user primitives must be dicts")
    if max_entries is not None and (isinstance(max_entries, bool)
                                    or not isinstance(max_entries, int)
                                    or not max(n, 1) <= max_entries <= _INDEX_LIMIT):
        _raise_tape_format(source, f"max_entries {max_entries!r} is not an int from "
                                   f"{max(n, 1)} to {_INDEX_LIMIT}")
    for index in customs:
        _index_field(index, "a user primitive's entry", source)
    Primitive = _service("primitives.Primitive")
    for index, primitive in customs.items():
        if not isinstance(primitive, Primitive):
            _raise_tape_format(source, f"the user primitive of entry {index} is a "
                                       f"{type(primitive).__name__}, not an ad.Primitive")
    _validate_entries(n, parts, customs, source)
    for index, name in names.items():
        _index_field(index, f"the index of variable {name!r}", source)
        if not 0 <= index < n or (<const uint8_t*><const char*>parts[5])[index] != OP_VARIABLE:
            _raise_tape_format(source, f"the name {name!r} is given to entry {index}, "
                                       f"which is not a variable")
        if type(name) is not str:
            _raise_tape_format(source, f"the name of entry {index} is a "
                                       f"{type(name).__name__}, not a str")
    if len(set(names.values())) != len(names):
        _raise_tape_format(source, "two variables have the same name")
    if checksum is not None:
        expected = _tape_digest(parts if n else (),
                                (n, sorted(names.items()), max_entries, sorted(customs)))
        if type(checksum) is not int or checksum != expected:
            _raise_tape_format(source, f"the checksum {checksum!r} does not match the "
                                       f"data (expected {expected})")
    lst = WengertList(max_entries)
    if n:
        # never above max_entries: the capacity is what enforces it (_grow)
        lst._resize(min(max(n, _MIN_CAPACITY), lst._max_entries))
        destinations[:] = [<char*>lst._values, <char*>lst._partial0, <char*>lst._partial1,
                           <char*>lst._arg0, <char*>lst._arg1, <char*>lst._ops]
        for k in range(6):
            size = len(parts[k])
            memcpy(destinations[k], <const char*>parts[k], size)
        lst._length = n
    for index, name in names.items():
        lst._names[index] = name
        lst._indices[name] = index
    lst._customs.update(customs)
    return lst


def _rebuild_record(WengertList tape not None, Py_ssize_t index):
    if not 0 <= index < tape._length:
        _raise_tape_format("pickled Record", f"index {index} is not an entry of {tape!r}")
    cdef Record r = Record.__new__(Record)
    r._number = tape._values[index]
    r.tape = tape
    r.index = index
    r.generation = tape.generation
    return r


def _rebuild_constant_record(double number):
    return _new_constant_record(number)

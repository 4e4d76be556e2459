# The tape: WengertList, the backward sweep and Derivatives.
# Entries live in one C block as a struct of arrays (33 bytes an entry), growing
# geometrically. The sweep reads only partials and operand indices, so it is one reversed
# multiply-add loop, run without the GIL.

cdef enum:
    _ENTRY_BYTES = 3 * 8 + 2 * 4 + 1
    _MIN_CAPACITY = 64
    # Below this many entries a sweep takes less time than releasing the GIL costs.
    _NOGIL_MIN_ENTRIES = 2048
    _INDEX_LIMIT = 2147483647   # operand indices are int32

cdef Py_ssize_t _next_serial = 0


cdef inline void _point_into(char* block, Py_ssize_t capacity, double** values,
                             double** partial0, double** partial1, int32_t** arg0,
                             int32_t** arg1, uint8_t** ops) noexcept:
    values[0] = <double*>block
    partial0[0] = values[0] + capacity
    partial1[0] = partial0[0] + capacity
    arg0[0] = <int32_t*>(partial1[0] + capacity)
    arg1[0] = arg0[0] + capacity
    ops[0] = <uint8_t*>(arg1[0] + capacity)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _reverse_sweep(const double* partial0, const double* partial1, const int32_t* arg0,
                         const int32_t* arg1, double* adjoints, Py_ssize_t lo,
                         Py_ssize_t hi) noexcept nogil:
    # entries hi down to lo; an absent or constant operand (index -1) receives nothing (its
    # partial slot holds the constant instead)
    cdef Py_ssize_t i
    cdef int32_t j
    cdef double g, p, t
    for i in range(hi, lo - 1, -1):
        g = adjoints[i]
        if g == 0.0:
            continue  # nothing flows from here: skips unselected branches and dead code
        j = arg0[i]
        if j >= 0:
            p = partial0[i]
            t = p * g
            if t != t and p == 0.0:
                t = 0.0  # the strong zero of mul0: 0 * inf contributes nothing
            adjoints[j] += t
        j = arg1[i]
        if j >= 0:
            p = partial1[i]
            t = p * g
            if t != t and p == 0.0:
                t = 0.0
            adjoints[j] += t


@cython.final
cdef class WengertList:
    """The tape of reverse mode: a Wengert list of operations in C memory.

    Parameters
    ----------
    max_entries : int, optional
        Refuse to grow beyond this many entries (MemoryError). Defaults to the index range,
        2**31 - 1 entries.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(2.0)
    >>> y = x * x * 3.0        # constants take no entry
    >>> len(lst)
    3
    >>> y.derivatives()[x]
    12.0
    """

    def __cinit__(self, max_entries=None):
        global _next_serial
        _next_serial += 1
        self.serial = _next_serial
        self._max_entries = _INDEX_LIMIT
        if max_entries is not None:
            if max_entries < 1 or max_entries > _INDEX_LIMIT:
                raise ValueError(f"max_entries must be between 1 and {_INDEX_LIMIT}, "
                                 f"got {max_entries!r}")
            self._max_entries = max_entries
        self._retired = []
        self._nodes = {}
        self._node_order = []
        self._customs = {}
        self._lines = {}
        self._names = {}
        self._indices = {}

    def __dealloc__(self):
        free(self._block)
        if self._retired is not None:  # None when __cinit__ raised
            for address in self._retired:
                free(<void*><size_t>address)

    cdef int _grow(self) except -1:
        cdef Py_ssize_t capacity, n = self._length
        cdef char* block
        cdef double* values
        cdef double* partial0
        cdef double* partial1
        cdef int32_t* arg0
        cdef int32_t* arg1
        cdef uint8_t* ops
        if n >= self._max_entries:
            raise MemoryError(
                f"{self!r} is full ({self._max_entries} entries): clear() it, record less, "
                f"or raise max_entries")
        capacity = self._capacity * 2 if self._capacity >= _MIN_CAPACITY else _MIN_CAPACITY
        if capacity > self._max_entries:
            capacity = self._max_entries
        block = <char*>malloc(capacity * _ENTRY_BYTES)
        if block == NULL:
            raise MemoryError(f"cannot grow {self!r} to {capacity} entries "
                              f"({capacity * _ENTRY_BYTES} bytes)")
        _point_into(block, capacity, &values, &partial0, &partial1, &arg0, &arg1, &ops)
        if n:
            memcpy(values, self._values, n * sizeof(double))
            memcpy(partial0, self._partial0, n * sizeof(double))
            memcpy(partial1, self._partial1, n * sizeof(double))
            memcpy(arg0, self._arg0, n * sizeof(int32_t))
            memcpy(arg1, self._arg1, n * sizeof(int32_t))
            memcpy(ops, self._ops, n * sizeof(uint8_t))
        if self._active_sweeps:
            self._retired.append(<size_t>self._block)  # a sweep still reads it
        else:
            free(self._block)
        self._block = block
        self._capacity = capacity
        self._values, self._partial0, self._partial1 = values, partial0, partial1
        self._arg0, self._arg1, self._ops = arg0, arg1, ops
        return 0

    cdef Py_ssize_t _append(self, uint8_t op, Py_ssize_t a, Py_ssize_t b, double z,
                            double pa, double pb) except -1:
        cdef Py_ssize_t n = self._length
        if n == self._capacity:
            self._grow()
        self._ops[n] = op
        self._arg0[n] = <int32_t>a
        self._arg1[n] = <int32_t>b
        self._values[n] = z
        self._partial0[n] = pa
        self._partial1[n] = pb
        self._length = n + 1
        return n

    cdef Record _push(self, uint8_t op, Py_ssize_t a, Py_ssize_t b, double z,
                      double pa, double pb):
        cdef Py_ssize_t n = self._append(op, a, b, z, pa, pb)
        cdef Record r = Record.__new__(Record)
        r.number = z
        r.tape = self
        r.index = n
        r.generation = self.generation
        return r

    def variable(self, x, name=None):
        """A new input Record on this list, optionally named (see Derivatives.by_name)."""
        cdef double value = _real_argument(x, "x")
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"name must be a str, got {type(name).__name__}")
            if name in self._indices:
                raise ValueError(f"name {name!r} is already used on {self!r}; "
                                 f"names identify variables, so each must be unique")
        cdef Record r = self._push(OP_VARIABLE, -1, -1, value, 0.0, 0.0)
        if name is not None:
            self._names[r.index] = name
            self._indices[name] = r.index
        return r

    def clear(self):
        """Empty the list for reuse, keeping its memory. Records made before become stale.

        The tape of a Function (``F.tape``, or a list given to ``ad.Function``) cannot be
        cleared: the Function replays, saves and draws it (RuntimeError)."""
        if self._frozen:
            raise RuntimeError(
                f"{self!r} is the tape of a Function (ad.record), which replays, saves and "
                f"draws it, so it cannot be cleared; record on a new WengertList instead")
        if self._active_sweeps:
            raise RuntimeError(f"cannot clear {self!r} while a backward sweep reads it")
        self._length = 0
        self.generation += 1
        self._nodes.clear()  # releases the tensors (and device buffers) nodes hold
        self._node_order.clear()
        self._customs.clear()
        self._lines.clear()
        self._names.clear()
        self._indices.clear()

    def __len__(self):
        return self._length

    def _freeze(self):
        """Refuse clear() from now on (a Function owns this list)."""
        self._frozen = True

    @property
    def capacity(self):
        """Entries the list holds before it next grows."""
        return self._capacity

    @property
    def max_entries(self):
        return self._max_entries

    @property
    def nbytes(self):
        """Bytes of C memory the tape holds (its capacity times ``bytes_per_entry``)."""
        return self._capacity * _ENTRY_BYTES

    @property
    def bytes_per_entry(self):
        """Bytes one entry takes (value, two partials, two int32 operands, a byte opcode)."""
        return _ENTRY_BYTES

    def __repr__(self):
        return f"WengertList(#{self.serial}, {self._length} entries)"

    cdef Derivatives _backward(self, Py_ssize_t output, object seed=None):
        cdef Py_ssize_t n = output + 1
        cdef double* adjoints = <double*>calloc(n, sizeof(double))
        if adjoints == NULL:
            raise MemoryError(f"cannot allocate {n} adjoints for a backward sweep")
        cdef Derivatives d = Derivatives.__new__(Derivatives)
        d._adjoints = adjoints
        d._length = n
        d.tape = self
        d.generation = self.generation
        if self._node_order and self._node_order[0] <= output:
            self._mixed_sweep(d, output, seed)
            return d
        adjoints[output] = 1.0
        self._sweep_range(adjoints, 0, output)
        return d

    cdef int _sweep_range(self, double* adjoints, Py_ssize_t lo, Py_ssize_t hi) except -1:
        # the scalar entries lo..hi, without the GIL when that pays for itself
        cdef const double* partial0 = self._partial0
        cdef const double* partial1 = self._partial1
        cdef const int32_t* arg0 = self._arg0
        cdef const int32_t* arg1 = self._arg1
        if hi - lo < _NOGIL_MIN_ENTRIES:
            _reverse_sweep(partial0, partial1, arg0, arg1, adjoints, lo, hi)
            return 0
        self._active_sweeps += 1
        try:
            with nogil:
                _reverse_sweep(partial0, partial1, arg0, arg1, adjoints, lo, hi)
        finally:
            self._active_sweeps -= 1
            if self._active_sweeps == 0 and self._retired:
                for address in self._retired:
                    free(<void*><size_t>address)
                self._retired.clear()
        return 0

    cdef int _mixed_sweep(self, Derivatives d, Py_ssize_t output, object seed) except -1:
        # Scalar runs between nodes sweep in C; each node (a tensor operation) passes its
        # adjoint on through node.vjp(). Tensor adjoints live in d._node_adjoints.
        cdef double* adjoints = d._adjoints
        cdef dict tensor_adjoints = {}
        cdef Py_ssize_t k, hi = output, inp
        d._node_adjoints = tensor_adjoints
        node = self._nodes.get(output)
        if node is not None and not node.scalar_output:
            if seed is None:
                raise ValueError("the backward sweep from a tensor needs a seed (an array of "
                                 "its shape); take the derivatives of a scalar, e.g. t.sum()")
            tensor_adjoints[output] = seed
        else:
            adjoints[output] = 1.0 if seed is None else float(seed)
        for k in reversed(self._node_order):
            if k > output:
                continue
            if k < hi:
                self._sweep_range(adjoints, k + 1, hi)
            hi = k - 1
            node = self._nodes[k]
            if node.scalar_output:
                g = adjoints[k]
                if g == 0.0:
                    continue
            else:
                # inputs (nodes without inputs) keep their adjoint for d[t]; intermediate
                # tensors give theirs up once passed on, so memory stays bounded
                g = (tensor_adjoints.get(k) if not node.inputs or getattr(node, "retain", False)
                     else tensor_adjoints.pop(k, None))
                if g is None:
                    continue
            contributions = node.vjp(g)
            for inp, c in zip(node.inputs, contributions):
                if c is None or inp < 0:
                    continue
                other = self._nodes.get(inp) if self._ops[inp] == OP_NODE else None
                if other is not None and not other.scalar_output:
                    previous = tensor_adjoints.get(inp)
                    tensor_adjoints[inp] = c if previous is None else previous + c
                else:
                    adjoints[inp] += <double>c
        if hi >= 0:
            self._sweep_range(adjoints, 0, hi)
        return 0

    def _arrays(self):
        """Copies of the entries as numpy arrays: a dict of ``ops`` (uint8 opcodes, see
        OPCODE_NAMES), ``arg0``/``arg1`` (int32 operand indices, -1 for none or a constant),
        ``values`` and ``partial0``/``partial1`` (float64; for a constant operand its
        partial slot holds the constant). What code generators (OpenCL replay) read."""
        cdef Py_ssize_t n = self._length
        out = {}
        for key, address, dtype in (("values", <size_t>self._values, np.float64),
                                    ("partial0", <size_t>self._partial0, np.float64),
                                    ("partial1", <size_t>self._partial1, np.float64),
                                    ("arg0", <size_t>self._arg0, np.int32),
                                    ("arg1", <size_t>self._arg1, np.int32),
                                    ("ops", <size_t>self._ops, np.uint8)):
            size = n * np.dtype(dtype).itemsize
            out[key] = np.frombuffer((<char*><size_t>address)[:size], dtype=dtype).copy()
        return out

    # ---- hooks for Python operations recorded as single entries (tensors) ----
    def _push_node(self, node, double number=0.0):
        """Append an entry for a Python node; return its Record (the entry's handle).

        ``node.inputs`` are entry indices of this list (-1: none), ``node.scalar_output``
        says whether the entry's adjoint is a float (``number`` is then its value) or an
        array, and ``node.vjp(g)`` returns one adjoint contribution per input (None: none).
        After a sweep, ``Derivatives._node_adjoint(i)`` holds the adjoint of every node
        without inputs (a tensor variable) and of nodes with a true ``retain`` attribute.
        """
        cdef Py_ssize_t i
        for i in node.inputs:
            if i >= self._length:
                raise ValueError(f"node input {i} is not an entry of {self!r}")
        cdef Record r = self._push(OP_NODE, -1, -1, number, 0.0, 0.0)
        self._nodes[r.index] = node
        self._node_order.append(r.index)
        return r

    def _push_custom(self, primitive, Py_ssize_t a, Py_ssize_t b, double z, double p0,
                     double p1):
        """Append an entry for a user primitive (ad.primitive) with its cached partials;
        an operand index of -1 is a constant, whose value goes in its partial slot."""
        cdef Py_ssize_t i
        for i in (a, b):
            if i >= self._length:
                raise ValueError(f"operand {i} is not an entry of {self!r}")
        cdef Record r = self._push(OP_CUSTOM, a, b, z, p0, p1)
        self._customs[r.index] = primitive
        return r

    def _customs_count(self):
        return len(self._customs)

    def _names_dict(self):
        """{entry index: name} of the named variables."""
        return dict(self._names)

    def _custom(self, Py_ssize_t index):
        """The user primitive of an OP_CUSTOM entry."""
        return self._customs[index]

    def _record_at(self, Py_ssize_t index):
        """A Record for an existing entry (higher-order sweeps build on the entries)."""
        if not 0 <= index < self._length:
            raise IndexError(f"no entry {index} on {self!r}")
        return _rebuild_record(self, index)

    def to_dot(self, derivatives=None, **options):
        """A Graphviz DOT picture of the tape: operations, values and, given the
        Derivatives of a sweep, adjoints (see easyad.dot.to_dot)."""
        from easyad.dot import to_dot
        return to_dot(self, derivatives=derivatives, **options)

    def _node(self, Py_ssize_t index):
        """The Python node of an OP_NODE entry."""
        return self._nodes[index]

    def _backward_from(self, Record handle not None, seed=None):
        """One backward sweep from any entry (a tensor's handle) with an adjoint seed."""
        _live_tape(handle)
        if handle.tape is not self:
            _raise_tape_mismatch(self, handle.tape, "backward sweep")
        return self._backward(handle.index, seed)

    # ---- pickling: the entries as bytes, in the block's layout, with a checksum ----
    def __reduce__(self):
        cdef Py_ssize_t n = self._length
        if self._nodes:
            raise TypeError(f"{self!r} holds tensor operations, which do not pickle; "
                            f"pickle a tape of scalar operations")
        parts = (
            (<char*>self._values)[:n * sizeof(double)],
            (<char*>self._partial0)[:n * sizeof(double)],
            (<char*>self._partial1)[:n * sizeof(double)],
            (<char*>self._arg0)[:n * sizeof(int32_t)],
            (<char*>self._arg1)[:n * sizeof(int32_t)],
            (<char*>self._ops)[:n],
        ) if n else ()
        max_entries = None if self._max_entries == _INDEX_LIMIT else self._max_entries
        names = dict(self._names)
        # user primitives pickle by reference (importable module-level functions)
        customs = dict(self._customs)
        checksum = _tape_digest(parts, (n, sorted(names.items()), max_entries, sorted(customs)))
        return (_rebuild_wengert_list, (n, parts, names, max_entries, customs, checksum))


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
    from easyad.primitives import Primitive
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
        while lst._capacity < n:
            lst._grow()
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
    r.number = tape._values[index]
    r.tape = tape
    r.index = index
    r.generation = tape.generation
    return r


def _rebuild_constant_record(double number):
    return _new_constant_record(number)


@cython.final
@cython.no_gc
@cython.freelist(16)
cdef class Derivatives:
    """The result of one backward sweep: d output / d entry for every entry of a list.

    Index it with a Record of the same list: ``d[x]`` (or ``d.wrt(x)``), by variable name
    with ``d.by_name("x")``, or take every named variable with ``d.as_dict()``.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x, y = lst.variable(3.0, name="x"), lst.variable(4.0, name="y")
    >>> d = (x * y + y).derivatives()
    >>> d[x], d.wrt(y), d.by_name("y"), d.as_dict()
    (4.0, 4.0, 4.0, {'x': 4.0, 'y': 4.0})
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("Derivatives come from Record.derivatives()")

    def __dealloc__(self):
        free(self._adjoints)

    cdef WengertList _checked_tape(self):
        if self.tape is not None and self.generation != self.tape.generation:
            raise StaleRecordError(
                f"these Derivatives were computed on {self.tape!r} before it was cleared; "
                f"run the backward sweep again on the new records")
        return self.tape

    def _adjoint_array(self):
        """Every entry's adjoint, as a numpy array (index = entry)."""
        self._checked_tape()
        cdef Py_ssize_t n = self._length
        if n == 0:
            return np.zeros(0)
        return np.frombuffer((<char*>self._adjoints)[:n * sizeof(double)], dtype=np.float64).copy()

    def _node_adjoint(self, Py_ssize_t index):
        """The adjoint of a tensor entry (None when nothing flowed into it)."""
        self._checked_tape()
        return None if self._node_adjoints is None else self._node_adjoints.get(index)

    def __getitem__(self, x):
        if type(x) is not Record:
            hook = getattr(x, "_derivative_from", None)  # tensors read their own adjoint
            if hook is not None:
                return hook(self)
            raise TypeError(f"index Derivatives with a Record of the same WengertList "
                            f"(or use by_name), not {type(x).__name__}")
        cdef Record r = <Record>x
        if r.tape is None:
            return 0.0  # a constant: nothing depends on it
        if r.tape is not self.tape:
            if self.tape is None:
                return 0.0  # the output was a constant: it depends on nothing
            _raise_tape_mismatch(self.tape, r.tape, "Derivatives")
        self._checked_tape()
        if r.generation != self.generation:
            _raise_stale(r)
        if r.index < self._length:
            return self._adjoints[r.index]
        return 0.0  # recorded after the output

    def wrt(self, x):
        """Same as ``d[x]``: the derivative of the output with respect to ``x``."""
        return self[x]

    def by_name(self, name):
        """The derivative with respect to the variable created with ``name=name``."""
        cdef WengertList tape = self._checked_tape()
        if tape is None:
            raise KeyError(f"no variable named {name!r}: the output is a constant, on no "
                           f"WengertList")
        index = tape._indices.get(name)
        if index is None:
            known = ", ".join(repr(k) for k in tape._indices) or "none"
            raise KeyError(f"no variable named {name!r} on {tape!r} (named: {known})")
        return self._adjoints[index] if index < self._length else 0.0

    def as_dict(self):
        """``{name: derivative}`` for every named variable of the list."""
        cdef WengertList tape = self._checked_tape()
        if tape is None:
            return {}
        return {name: (self._adjoints[index] if index < self._length else 0.0)
                for name, index in tape._indices.items()}

    def __repr__(self):
        return f"<Derivatives of entry {self._length - 1} on {self.tape!r}>"

    def __reduce__(self):
        data = (<char*>self._adjoints)[:self._length * sizeof(double)] if self._length else b""
        return (_rebuild_derivatives, (self.tape, data))


cdef Derivatives _empty_derivatives():
    cdef Derivatives d = Derivatives.__new__(Derivatives)
    return d


def _rebuild_derivatives(WengertList tape, bytes data):
    cdef Derivatives d = Derivatives.__new__(Derivatives)
    cdef Py_ssize_t n = len(data) // sizeof(double)
    if len(data) % sizeof(double) or (tape is not None and n > tape._length):
        _raise_tape_format("pickled Derivatives", f"{len(data)} bytes of adjoints do not "
                                                  f"fit {tape!r}")
    if n:
        d._adjoints = <double*>malloc(n * sizeof(double))
        if d._adjoints == NULL:
            raise MemoryError()
        memcpy(d._adjoints, <char*>data, n * sizeof(double))
    d._length = n
    d.tape = tape
    d.generation = tape.generation if tape is not None else 0
    return d

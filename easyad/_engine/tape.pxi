# The tape: WengertList (entries appended by Trace/Record operations, tensor nodes, user
# primitives; clear, pickling) and the Records whose number is still on a device
# (PendingNumber). Its storage and the scalar sweep loop are tape_storage.pxi (included
# before it); the backward sweep over nodes is sweep.pxi, the rebuilders of pickles
# rebuild.pxi, the sweep's result Derivatives derivatives.pxi (included after it).

# ---- numbers still on a device ----

@cython.final
@cython.auto_pickle(False)
cdef class PendingNumber:
    """A single-number result of a tensor operation still in a device's memory (a loss on
    OpenCL, made by ``record_scalar``). Its entry and Records hold NaN and this handle until
    the number is first used (``.number``, arithmetic, a comparison, ``_arrays``): then it
    is read once. So a training step queues its kernels and returns without waiting for
    the device unless the loss is asked for. The Records own the handle (a list's clear()
    only drops its own reference), so a Record kept past clear() can still read it."""
    cdef object _backend, _buffer   # None once read: the device buffer is released
    cdef double _number
    cdef unsigned long long generation   # its Records' own (they hold _PENDING_GENERATION)

    cdef double value(self) except? -1.0:
        if self._backend is not None:
            self._number = <double>_service("tensor.read_number")(self._backend,
                                                                 self._buffer)
            self._backend = self._buffer = None
        return self._number


# The generation of a Record whose number is still on a device: no list reaches it, so
# _live_tape's check (every operation makes it) sends such a Record to _pending_or_stale.
cdef unsigned long long _PENDING_GENERATION = 0xFFFFFFFFFFFFFFFFULL


cdef int _settle(Record r) except -1:
    # r's number was still on a device: read it into r and, while current, into its entry.
    # A failed read raises and leaves r pending, to be read at its next use.
    cdef PendingNumber pending = <PendingNumber>r._pending
    cdef double number = pending.value()
    r._number = number
    r.generation = pending.generation
    r._pending = None
    cdef WengertList tape = r.tape
    if r.generation == tape.generation and r.index < tape._length:
        tape._values[r.index] = number
        tape._pending.pop(r.index, None)
    return 0


cdef int _pending_or_stale(Record a) except -1:
    # _live_tape's slow path: a number still on a device is read, a stale Record raises
    if a._pending is None:
        _raise_stale(a)
    _settle(a)
    if a.generation != a.tape.generation:
        _raise_stale(a)
    return 0


cdef inline int _ready(Record r) except -1:
    # before reading r._number in C: a number still on a device is read first (rare)
    if r._pending is not None:
        return _settle(r)
    return 0


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
        self._pending = {}
        self._node_order = []
        self._customs = {}
        self._lines = {}
        self._names = {}
        self._indices = {}

    def __dealloc__(self):
        global _spare_capacity
        cdef int k
        cdef Py_ssize_t written
        cdef char* arrays[6]
        arrays[:] = [<char*>self._values, <char*>self._partial0, <char*>self._partial1,
                     <char*>self._arg0, <char*>self._arg1, <char*>self._ops]
        if _mapped(self._capacity) and _spare_capacity == 0:
            written = max(self._written, self._length)
            for k in range(6):
                if written > _SPARE_PAGES_ENTRIES:
                    easyad_array_trim(arrays[k], _SPARE_PAGES_ENTRIES * _ITEM_BYTES[k],
                                      written * _ITEM_BYTES[k])
                _spare[k] = arrays[k]
            _spare_capacity = self._capacity
        else:
            for k in range(6):
                easyad_array_free(arrays[k], self._capacity * _ITEM_BYTES[k],
                                  _mapped(self._capacity))
        if self._retired is not None:  # None when __cinit__ raised
            self._free_retired()

    cdef void _free_retired(self) noexcept:
        for address, size, mapped in self._retired:
            easyad_array_free(<void*><size_t>address, size, mapped)
        self._retired.clear()

    cdef int _grow(self) except -1:
        if self._length >= self._max_entries:
            raise MemoryError(
                f"{self!r} is full ({self._max_entries} entries): clear() it, record less, "
                f"or raise max_entries")
        try:
            return self._resize(min(_next_capacity(self._capacity, False), self._max_entries))
        except MemoryError:
            if not _mapped(_next_capacity(self._capacity, False)):
                raise
        return self._resize(min(_next_capacity(self._capacity, True), self._max_entries))

    cdef int _resize(self, Py_ssize_t capacity) except -1:
        # Every array to capacity entries, keeping the entries; on failure the list is as
        # it was. While a sweep without the GIL reads the arrays (keep), they are copied
        # and freed when the last sweep ends.
        cdef Py_ssize_t n = self._length, old = self._capacity
        cdef int k, j, failed = -1
        cdef bint keep = self._active_sweeps > 0
        cdef bint old_mapped = _mapped(old), new_mapped = _mapped(capacity)
        cdef void* back
        cdef char* arrays[6]
        cdef char* fresh[6]
        arrays[:] = [<char*>self._values, <char*>self._partial0, <char*>self._partial1,
                     <char*>self._arg0, <char*>self._arg1, <char*>self._ops]
        # (max_entries is enforced by the capacity never exceeding it: _append grows, and
        # _grow refuses, only when the capacity is reached; so no larger spare is taken)
        if (new_mapped and not old_mapped and _spare_capacity >= capacity
                and _spare_capacity <= self._max_entries):
            return self._take_spare(arrays, keep)
        for k in range(6):
            fresh[k] = <char*>easyad_array_resize(
                arrays[k], n * _ITEM_BYTES[k], old * _ITEM_BYTES[k], old_mapped,
                capacity * _ITEM_BYTES[k], new_mapped, keep or arrays[k] == NULL)
            if fresh[k] == NULL:
                failed = k
                break
        if failed >= 0:
            for j in range(failed):
                if keep or arrays[j] == NULL:     # the old array is untouched
                    easyad_array_free(fresh[j], capacity * _ITEM_BYTES[j], new_mapped)
                    continue
                back = easyad_array_resize(fresh[j], n * _ITEM_BYTES[j],
                                           capacity * _ITEM_BYTES[j], new_mapped,
                                           old * _ITEM_BYTES[j], old_mapped, 0)
                # a shrink does not fail in practice; if it did, keep the larger array
                arrays[j] = <char*>back if back != NULL else fresh[j]
            self._point(arrays)
            raise MemoryError(f"cannot grow {self!r} to {capacity} entries "
                              f"({capacity * _ENTRY_BYTES} bytes)")
        if keep:
            for k in range(6):
                if arrays[k] != NULL:
                    self._retired.append((<size_t>arrays[k], old * _ITEM_BYTES[k], old_mapped))
        self._point(fresh)
        self._capacity = capacity
        return 0

    cdef int _take_spare(self, char** arrays, bint keep) except -1:
        # the kept mappings of a freed list (larger than asked: they stay reserved)
        global _spare_capacity
        cdef int k
        for k in range(6):
            if self._length:
                memcpy(_spare[k], arrays[k], self._length * _ITEM_BYTES[k])
            if keep:
                self._retired.append((<size_t>arrays[k], self._capacity * _ITEM_BYTES[k], 0))
            else:
                easyad_array_free(arrays[k], self._capacity * _ITEM_BYTES[k], 0)
        self._point(_spare)
        self._capacity = _spare_capacity
        _spare_capacity = 0
        return 0

    cdef void _point(self, char** arrays) noexcept:
        self._values = <double*>arrays[0]
        self._partial0 = <double*>arrays[1]
        self._partial1 = <double*>arrays[2]
        self._arg0 = <int32_t*>arrays[3]
        self._arg1 = <int32_t*>arrays[4]
        self._ops = <uint8_t*>arrays[5]

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
        r._number = z
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
        self._written = max(self._written, self._length)   # those pages stay
        self._length = 0
        self.generation += 1
        self._nodes.clear()  # releases the tensors (and device buffers) nodes hold
        self._pending.clear()  # numbers still on a device: their Records hold them
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
        """Entries the list holds before it next grows (reserved address space, once the
        arrays are mappings: see nbytes for the memory)."""
        return self._capacity

    @property
    def max_entries(self):
        return self._max_entries

    @property
    def nbytes(self):
        """Bytes of C memory the tape holds: its capacity while small; once its arrays are
        mappings, the pages written (the most entries it has held; a mapping reserves
        address space beyond them, which takes no memory)."""
        cdef int k
        cdef size_t total = 0
        cdef Py_ssize_t held = self._capacity
        if self._values == NULL:
            return 0
        if _mapped(self._capacity):
            held = max(self._written, self._length)
        for k in range(6):
            total += easyad_array_bytes(held * _ITEM_BYTES[k], _mapped(self._capacity))
        return total

    @property
    def bytes_per_entry(self):
        """Bytes of C memory per used entry: ``nbytes / len(lst)`` (at most 40 from 64
        entries on; an entry itself is 33 bytes, the rest is room to grow). ``nbytes`` when
        the list is empty."""
        return self.nbytes / self._length if self._length else float(self.nbytes)

    def __repr__(self):
        return f"WengertList(#{self.serial}, {self._length} entries)"

    cdef Derivatives _backward(self, Py_ssize_t output, object seed=None):
        return _sweep_from(self, output, seed, False)

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
                self._free_retired()
        return 0

    cdef int _mixed_sweep(self, Derivatives d, Py_ssize_t output, object seed) except -1:
        return _sweep_nodes(self, d, output, seed, False)

    def _arrays(self):
        """Copies of the entries as numpy arrays: a dict of ``ops`` (uint8 opcodes, see
        OPCODE_NAMES), ``arg0``/``arg1`` (int32 operand indices, -1 for none or a constant),
        ``values`` and ``partial0``/``partial1`` (float64; for a constant operand its
        partial slot holds the constant). What code generators (OpenCL replay) read."""
        self._settle_all()
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

    def _entry(self, Py_ssize_t i):
        """One entry as (op, arg0, arg1, value, partial0, partial1), without copying the
        arrays (error messages name one entry; _tapeview.entry reads it)."""
        if not 0 <= i < self._length:
            raise IndexError(f"entry {i} of a tape of {self._length}")
        self._settle_all()
        return (self._ops[i], self._arg0[i], self._arg1[i], self._values[i],
                self._partial0[i], self._partial1[i])

    # ---- hooks for Python operations recorded as single entries (tensors) ----
    def _push_node(self, Node node not None, double number=0.0):
        """Append an entry for a Python node; return its Record (the entry's handle).

        ``node.inputs`` are entry indices of this list (-1: none), ``node.scalar_output``
        says whether the entry's adjoint is a float (``number`` is then its value) or an
        array, and ``node.vjp(g)`` returns one adjoint contribution per input (None: none).
        After a sweep, ``Derivatives._node_adjoint(i)`` holds the adjoint of every node
        without inputs (a tensor variable) and of nodes with a true ``retain`` attribute.
        """
        cdef Py_ssize_t index = self._push_node_entry(node, number)
        cdef Record r = Record.__new__(Record)
        r._number = number
        r.tape = self
        r.index = index
        r.generation = self.generation
        return r

    def _push_pending_node(self, Node node not None, backend, buffer):
        """_push_node for a single number still in ``backend``'s memory (``buffer``, 0-d):
        it is read (``backend.to_numpy``) when first used, so a training step on a device
        sends back nothing the user does not ask for (see PendingNumber)."""
        cdef PendingNumber pending = PendingNumber.__new__(PendingNumber)
        pending._backend, pending._buffer = backend, buffer
        pending.generation = self.generation
        cdef Py_ssize_t index = self._push_node_entry(node, NAN)
        self._pending[index] = pending
        cdef Record r = Record.__new__(Record)
        r._number = NAN
        r._pending = pending
        r.tape = self
        r.index = index
        r.generation = _PENDING_GENERATION
        return r

    cdef int _settle_all(self) except -1:
        # every number still on a device, read into its entry (the arrays are read whole)
        cdef Py_ssize_t i
        for i, pending in list(self._pending.items()):
            self._values[i] = (<PendingNumber>pending).value()
            del self._pending[i]
        return 0

    cdef Py_ssize_t _push_node_entry(self, object node, double number) except -1:
        # _push_node without the Record: the tensor dispatch makes handles only on demand
        cdef Py_ssize_t i
        for i in (<Node>node).inputs:     # a few ints: checked in C
            if i >= self._length:
                raise ValueError(f"node input {i} is not an entry of {self!r}")
        if _anomaly_mode:
            self._lines[self._length] = _service("anomaly.user_line")()
        cdef Py_ssize_t n = self._append(OP_NODE, -1, -1, number, 0.0, 0.0)
        self._nodes[n] = node
        self._node_order.append(n)
        return n

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
        return _service("dot.to_dot")(self, derivatives=derivatives, **options)

    def _node(self, Py_ssize_t index):
        """The Python node of an OP_NODE entry."""
        return self._nodes[index]

    def _backward_from(self, Record handle not None, seed=None, bint release=False):
        """One backward sweep from any entry (a tensor's handle) with an adjoint seed.

        ``release``: each tensor operation the sweep passes drops its vjp, and so the values
        it saved for it, once its adjoint has gone on (memory of intermediates is given
        back during the sweep, not at ``clear()``). For a list swept once (the transforms'
        own lists); a later sweep that reaches a released operation raises RuntimeError.
        """
        _sweep_tape(handle)
        if handle.tape is not self:
            _raise_tape_mismatch(self, handle.tape, "backward sweep")
        d = _sweep_from(self, handle.index, seed, release)
        if _anomaly_mode:
            _service("anomaly.check_backward")(self, d, handle.index)
        return d

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

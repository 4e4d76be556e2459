# The tape: WengertList, the backward sweep and Derivatives.
# Entries live in C as a struct of arrays (33 bytes an entry: value, two partials, two
# int32 operands, a byte opcode), one allocation per array. Small lists grow by 1.2x
# (realloc). From _MAP_ENTRIES on (Linux) each array is an anonymous mapping that reserves
# address space for many more entries: the kernel gives it memory page by page as entries
# are written, and a larger reservation is made by mremap, which moves pages without
# copying them. So memory is at most 40 bytes per used entry from 64 entries on (nbytes
# counts the pages written), and growing never copies a large tape. The sweep reads only
# partials and operand indices, so it is one reversed multiply-add loop, run without the
# GIL.

cdef extern from *:
    """
    #include <stdlib.h>
    #include <string.h>
    #if defined(__linux__)
    #include <unistd.h>
    #include <sys/mman.h>
    #define EASYAD_MAPPED_ARRAYS 1
    #else
    #define EASYAD_MAPPED_ARRAYS 0
    #endif

    /* bytes an array of `bytes` takes: whole pages when it is a mapping */
    static size_t easyad_array_bytes(size_t bytes, int mapped) {
    #if EASYAD_MAPPED_ARRAYS
        if (mapped) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            return (bytes + page - 1) / page * page;
        }
    #endif
        return bytes;
    }

    /* give back the pages of a mapping from byte `keep` on (it stays reserved) */
    static void easyad_array_trim(void* p, size_t keep, size_t bytes) {
    #if EASYAD_MAPPED_ARRAYS
        size_t from = easyad_array_bytes(keep, 1), to = easyad_array_bytes(bytes, 1);
        if (to > from) madvise((char*)p + from, to - from, MADV_DONTNEED);
    #endif
    }

    static void easyad_array_free(void* p, size_t bytes, int mapped) {
        if (p == NULL) return;
    #if EASYAD_MAPPED_ARRAYS
        if (mapped) { munmap(p, easyad_array_bytes(bytes, 1)); return; }
    #endif
        free(p);
    }

    /* The array `old` (old_bytes, of which `used` hold entries) resized to new_bytes;
       NULL when out of memory (old is then untouched). With keep_old (a sweep without the
       GIL still reads it) the old array is copied and left for the caller to free. A
       mapping reserves address space only (MAP_NORESERVE): pages come when written. */
    static void* easyad_array_resize(void* old, size_t used, size_t old_bytes,
                                     int old_mapped, size_t new_bytes, int new_mapped,
                                     int keep_old) {
        void* p;
    #if EASYAD_MAPPED_ARRAYS
        if (old != NULL && old_mapped && new_mapped && !keep_old) {
            /* the kernel moves the pages: nothing is copied */
            p = mremap(old, easyad_array_bytes(old_bytes, 1),
                       easyad_array_bytes(new_bytes, 1), MREMAP_MAYMOVE);
            return p == MAP_FAILED ? NULL : p;
        }
        if (new_mapped) {
            p = mmap(NULL, easyad_array_bytes(new_bytes, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return NULL;
            if (used) memcpy(p, old, used);
            if (!keep_old) easyad_array_free(old, old_bytes, old_mapped);
            return p;
        }
    #endif
        if (!keep_old && !old_mapped)
            return realloc(old, new_bytes ? new_bytes : 1);   /* in place when it can */
        p = malloc(new_bytes ? new_bytes : 1);
        if (p == NULL) return NULL;
        if (used) memcpy(p, old, used);
        if (!keep_old) easyad_array_free(old, old_bytes, old_mapped);
        return p;
    }
    """
    bint EASYAD_MAPPED_ARRAYS
    size_t easyad_array_bytes(size_t bytes, int mapped) nogil
    void easyad_array_free(void* p, size_t bytes, int mapped) nogil
    void easyad_array_trim(void* p, size_t keep, size_t bytes) nogil
    void* easyad_array_resize(void* old, size_t used, size_t old_bytes, int old_mapped,
                              size_t new_bytes, int new_mapped, int keep_old) nogil


cdef enum:
    _ENTRY_BYTES = 3 * 8 + 2 * 4 + 1
    _MIN_CAPACITY = 64
    # From this capacity on the arrays are mappings; a mapping reserves _RESERVE times the
    # entries it replaces (address space only). Memory is the pages written: at most six
    # partly written pages, 6 bytes an entry here, are not entries.
    _MAP_ENTRIES = 4096
    _RESERVE = 64
    # Below this many entries a sweep takes less time than releasing the GIL costs.
    _NOGIL_MIN_ENTRIES = 2048
    _INDEX_LIMIT = 2147483647   # operand indices are int32

cdef Py_ssize_t _next_serial = 0
# One freed list's mappings, kept for the next list that grows into mappings: its pages
# are already there (a fresh mapping takes a page fault per page written, which made
# recording a new 100,000-entry list in a loop 1.6x slower). At most _SPARE_PAGES_ENTRIES
# entries' pages are kept.
cdef char* _spare[6]
cdef Py_ssize_t _spare_capacity = 0
cdef enum:
    _SPARE_PAGES_ENTRIES = 1 << 20
cdef size_t _ITEM_BYTES[6]
_ITEM_BYTES[:] = [8, 8, 8, 4, 4, 1]   # values, partial0, partial1, arg0, arg1, ops


cdef inline bint _mapped(Py_ssize_t capacity) noexcept nogil:
    return EASYAD_MAPPED_ARRAYS and capacity >= _MAP_ENTRIES


cdef Py_ssize_t _next_capacity(Py_ssize_t capacity, bint modest) noexcept nogil:
    # modest: when a large reservation failed (strict overcommit), grow by 1/8 instead
    cdef Py_ssize_t larger
    if capacity < _MIN_CAPACITY:
        return _MIN_CAPACITY
    larger = capacity + capacity // 5
    if larger < _MAP_ENTRIES or not EASYAD_MAPPED_ARRAYS:
        return larger
    if modest:
        return capacity + capacity // 8
    return max(capacity, _MAP_ENTRIES) * _RESERVE


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _reverse_sweep(const double* partial0, const double* partial1, const int32_t* arg0,
                         const int32_t* arg1, double* adjoints, Py_ssize_t lo,
                         Py_ssize_t hi) noexcept nogil:
    # entries hi down to lo; an absent or constant operand (index -1) receives nothing (its
    # partial slot holds the constant instead). Each contribution is _helpers.h's mul0
    # (the one strong zero, bit for bit: 0 * inf contributes +0.0, as a zero partial does)
    cdef Py_ssize_t i
    cdef int32_t j
    cdef double g
    for i in range(hi, lo - 1, -1):
        g = adjoints[i]
        if g == 0.0:
            continue  # nothing flows from here: skips unselected branches and dead code
        j = arg0[i]
        if j >= 0:
            adjoints[j] += mul0(partial0[i], g)
        j = arg1[i]
        if j >= 0:
            adjoints[j] += mul0(partial1[i], g)


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


# ---- the backward sweep (module-level: WengertList's cdef methods are declared in
# _core.pxd; these take the extra ``release`` switch) ----

cdef Derivatives _sweep_from(WengertList lst, Py_ssize_t output, object seed, bint release):
    cdef Py_ssize_t n = output + 1
    cdef double* adjoints = <double*>calloc(n, sizeof(double))
    if adjoints == NULL:
        raise MemoryError(f"cannot allocate {n} adjoints for a backward sweep")
    cdef Derivatives d = Derivatives.__new__(Derivatives)
    d._adjoints = adjoints
    d._length = n
    d.tape = lst
    d.generation = lst.generation
    if lst._node_order and lst._node_order[0] <= output:
        _sweep_nodes(lst, d, output, seed, release)
        return d
    adjoints[output] = 1.0 if seed is None else <double>seed
    lst._sweep_range(adjoints, 0, output)
    return d


def _released_vjp(*args):
    """What a released node's vjp and graph become (a sweep with release=True passed it)."""
    raise RuntimeError(_RELEASED)


_RELEASED = ("this tensor operation's saved values were released by an earlier backward "
             "sweep that released them as it passed (release=True, as ad.grad, "
             "ad.value_and_grad and ad.vjp sweep their own lists), so the list cannot be "
             "swept through it again; record the computation again for another sweep")


cdef int _sweep_nodes(WengertList lst, Derivatives d, Py_ssize_t output, object seed,
                      bint release) except -1:
    # Scalar runs between nodes sweep in C; each node (a tensor operation) passes its
    # adjoint on through node.vjp(). Tensor adjoints live in d._node_adjoints.
    # ``release``: every node with inputs the sweep passes gives up its vjp and graph (and
    # so the values they saved) once passed; a later sweep that reaches it raises.
    cdef double* adjoints = d._adjoints
    cdef dict tensor_adjoints = {}
    cdef dict nodes = lst._nodes
    cdef list order = lst._node_order
    cdef Py_ssize_t k, hi = output, inp, j, m
    cdef Node node, other
    cdef tuple inputs
    cdef object g, c, previous, contributions, vjp
    d._node_adjoints = tensor_adjoints
    found = nodes.get(output)
    if found is not None and not (<Node>found).scalar_output:
        if seed is None:
            raise ValueError("the backward sweep from a tensor needs a seed (an array of "
                             "its shape); take the derivatives of a scalar, e.g. t.sum()")
        tensor_adjoints[output] = seed
    else:
        adjoints[output] = 1.0 if seed is None else float(seed)
    for j in range(len(order) - 1, -1, -1):
        k = order[j]
        if k > output:
            continue
        if k < hi:
            lst._sweep_range(adjoints, k + 1, hi)
        hi = k - 1
        node = <Node>nodes[k]
        inputs = node.inputs
        if node.scalar_output:
            g = adjoints[k] if adjoints[k] != 0.0 else None
        elif not inputs or node.retain:
            # inputs (nodes without inputs) keep their adjoint for d[t]; intermediate
            # tensors give theirs up once passed on, so memory stays bounded
            g = tensor_adjoints.get(k)
        else:
            g = tensor_adjoints.pop(k, None)
        if g is not None:
            vjp = node.vjp
            if vjp is _released_vjp:
                raise RuntimeError(f"entry {k} of {lst!r} ({node.label}): {_RELEASED}")
            if type(vjp) is ElementwiseStep:     # the commonest node: its kernels from C
                contributions = (<ElementwiseStep>vjp).adjoints(g)
            elif isinstance(vjp, _CoreStep):     # sum, getitem, matmul...: from C too
                contributions = (<_CoreStep>vjp).adjoints(g)
            else:
                contributions = vjp(g)
            vjp = None
            g = None
            if _anomaly_mode:
                _service("anomaly.check_node")(lst, k, node, contributions)
            m = 0
            for c in contributions:
                if m >= len(inputs):
                    break
                inp = <Py_ssize_t>inputs[m]
                m += 1
                if c is None or inp < 0:
                    continue
                if lst._ops[inp] == OP_NODE:
                    other = <Node>nodes[inp]
                    if not other.scalar_output:
                        previous = tensor_adjoints.get(inp)
                        tensor_adjoints[inp] = c if previous is None else previous + c
                        previous = None     # the partial sum is dropped, not held here
                        continue
                adjoints[inp] += <double>c
            contributions = None
        if release and inputs:
            node.vjp = _released_vjp
            node.graph = _released_vjp
    if hi >= 0:
        lst._sweep_range(adjoints, 0, hi)
    return 0


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

    def _take_node_adjoint(self, Py_ssize_t index):
        """The adjoint of a tensor entry, handed over: these Derivatives no longer hold it
        (``d[t]`` then reads nothing for it). None when nothing flowed into it. A
        transform that owns the sweep takes its inputs' gradients this way, uncopied."""
        self._checked_tape()
        return None if self._node_adjoints is None else self._node_adjoints.pop(index, None)

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
        if self.tape._strict:   # a float computed from the values: a read like .number
            _strict_read("a derivative (d[x])")
        if r.generation != self.generation and not (
                r._pending is not None
                and (<PendingNumber>r._pending).generation == self.generation):
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
        if tape._strict:
            _strict_read("a derivative (d.by_name)")
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
        if tape._strict:
            _strict_read("derivatives (d.as_dict)")
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

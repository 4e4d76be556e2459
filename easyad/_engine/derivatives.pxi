# Derivatives (included after rebuild.pxi): the result of one backward sweep, d output /
# d entry for every entry, read by Record, name or as a dict; and its pickle.

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

    def tensor(self, x):
        """The derivative with respect to the tensor ``x`` as a constant tensor on x's
        device: ``d[x]`` without the copy to the host (on an OpenCL device the gradient
        stays there, as torch's ``.grad`` does). To be read, not written: it may be the
        sweep's own buffer."""
        hook = getattr(x, "_derivative_tensor", None)
        if hook is None:
            raise TypeError(f"d.tensor(x) takes a Tensor or a Parameter of this sweep's "
                            f"list, not {type(x).__name__}; use d[x] for a Record")
        return hook(self)

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

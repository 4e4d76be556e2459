# ---- tensors in the core: storage, elementwise dispatch and its vjp ----
# (included after nodes.pxi and before the tape's parts, whose mixed sweep (sweep.pxi) calls an
# ElementwiseStep's adjoints in C)
#
# A tensor operation's common path runs here in C: the operand checks, the rule's kernel,
# the tape entry and the result object, and, in the backward sweep, the adjoint kernels.
# What is rare stays in Python (easyad/tensor/_elementwise.py, reached through services):
# broadcasting, dtype promotion, operands that are arrays or Records, error messages.

from cpython.contextvars cimport PyContextVar_Set, PyContextVar_Reset

cdef object _FLOAT64 = np.dtype(np.float64)
cdef object _FLOAT32 = np.dtype(np.float32)
cdef type _NDARRAY = np.ndarray
# numpy's floating-point error state and its "ignore all" value (the numpy backend's
# kernels run under it: IEEE results, no warnings); None where numpy has no such variable
cdef object _errstate_var = None
cdef object _errstate_ignore = None


def _register_numpy_errstate(var, ignore):
    """The numpy backend hands over numpy's error-state context variable and its "ignore"
    state, so the core can run the backend's plain functions quietly (about 0.1 us)."""
    global _errstate_var, _errstate_ignore
    _errstate_var, _errstate_ignore = var, ignore


@cython.auto_pickle(False)     # a tensor lives on a device and a list: save t.value
cdef class TensorCore:
    """A tensor's fields, read and written in C by the dispatch below; ``TensorBase``
    (easyad/tensor/_base.py) adds the Python API. ``_handle``, the Record of its tape
    entry, is made on first use (most intermediate tensors never need one)."""

    cdef public object _backend      # the device's backend
    cdef public object _data         # the backend's buffer
    cdef public tuple _shape
    cdef public object _dtype
    cdef public WengertList _tape    # None for a constant
    cdef public Py_ssize_t _index    # its entry (-1 for a constant)
    cdef public unsigned long long _generation   # the list's generation when recorded
    cdef public object _name
    cdef public object _elements     # a transform input's scalar elements (Elements)
    cdef public object _records      # a 1-D input's element Records once made
    cdef object _handle_record
    cdef object __weakref__

    @property
    def _handle(self):
        if self._handle_record is None and self._tape is not None and self._index >= 0:
            self._handle_record = _entry_record(self._tape, self._index, self._generation)
        return self._handle_record

    @_handle.setter
    def _handle(self, value):
        self._handle_record = value


cdef Record _entry_record(WengertList tape, Py_ssize_t index, unsigned long long generation):
    # the Record of an existing entry, stale where the list was cleared since
    cdef Record r = Record.__new__(Record)
    r._number = tape._values[index] if (generation == tape.generation
                                        and index < tape._length) else NAN
    r.tape = tape
    r.index = index
    r.generation = generation
    if tape._pending and generation == tape.generation:
        r._pending = tape._pending.get(index)   # a number still on a device
        if r._pending is not None:
            r.generation = _PENDING_GENERATION
    return r


cdef inline TensorCore _new_tensor(type cls, object backend, object data, tuple shape,
                                   object dtype, WengertList tape, Py_ssize_t index):
    cdef TensorCore t = <TensorCore>TensorCore.__new__(cls)
    t._backend = backend
    t._data = data
    t._shape = shape
    t._dtype = dtype
    if tape is not None:
        t._tape = tape
        t._index = index
        t._generation = tape.generation
    else:
        t._index = -1
    return t


cdef inline Node _new_node(object label, tuple inputs, object vjp, object graph):
    cdef Node node = Node.__new__(Node)
    node.label = label
    node.inputs = inputs
    node.vjp = vjp
    node.graph = graph
    return node


def wrap(type cls, backend, data, shape, dtype, WengertList tape=None, handle=None):
    """A new tensor of class ``cls`` (the caller's: operations make what they were given);
    ``handle``: the Record of its entry on ``tape``."""
    if dtype is not _FLOAT64 and dtype is not _FLOAT32:
        dtype = np.dtype(dtype)
    cdef TensorCore t = _new_tensor(cls, backend, data, shape if type(shape) is tuple
                                    else tuple(shape), dtype, tape,
                                    (<Record>handle).index if handle is not None else -1)
    t._handle_record = handle
    return t


def record(type cls, label, backend, data, shape, dtype, WengertList tape, tuple inputs,
           vjp, graph=None):
    """The result tensor of an operation: recorded as one node when ``tape`` is not None
    and an input is an entry (``graph``: its vjp in recorded operations, see ``Node``)."""
    if dtype is not _FLOAT64 and dtype is not _FLOAT32:
        dtype = np.dtype(dtype)
    if type(shape) is not tuple:
        shape = tuple(shape)
    if tape is None or not _any_entry(inputs):
        return _new_tensor(cls, backend, data, shape, dtype, None, -1)
    return _new_tensor(cls, backend, data, shape, dtype, tape,
                       tape._push_node_entry(_new_node(label, inputs, vjp, graph), 0.0))


cdef inline bint _any_entry(tuple inputs):
    for i in inputs:
        if <Py_ssize_t>i >= 0:
            return True
    return False


# ---- a rule's kernels ----

cdef inline object _quiet(object f, tuple args):
    # f(*args) under numpy's "ignore" error state
    cdef object token = PyContextVar_Set(_errstate_var, _errstate_ignore)
    try:
        return f(*args)
    finally:
        PyContextVar_Reset(_errstate_var, token)


cdef inline int _fit(object r, tuple shape, object dtype, tuple args):
    # 2: r is a new C-contiguous ndarray of exactly shape and dtype, none of args (it
    # becomes a tensor's buffer as it is); 1: an ndarray of that shape and dtype to copy
    # (an operand handed back, a view); 0: anything else (the backend's _fresh converts)
    if type(r) is not _NDARRAY:
        return 0
    cdef cnp.ndarray a = <cnp.ndarray>r
    if <object>cnp.PyArray_DESCR(a) is not dtype or cnp.PyArray_NDIM(a) != len(shape):
        return 0
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    cdef Py_ssize_t k
    for k in range(len(shape)):
        if dims[k] != <cnp.npy_intp>shape[k]:
            return 0
    if cnp.PyArray_BASE(a) != NULL or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        return 1
    for k in range(len(args)):
        if args[k] is r:
            return 1
    return 2


cdef object _own(object be, object r, tuple shape, object dtype, tuple args):
    # a kernel's result as a new buffer of the backend (copied only where it must be)
    cdef int fit = _fit(r, shape, dtype, args)
    if fit == 0:
        return be._fresh(r, shape, dtype, args)
    if fit == 1:
        r = cnp.PyArray_NewCopy(<cnp.ndarray>r, cnp.NPY_CORDER)
    if be.tracking:
        be._track(r)
    return r


@cython.final
@cython.auto_pickle(False)
cdef class RulePlan:
    """A rule's kernels for the operands that need an adjoint (``wanted``: of 0, 1): the
    value expression, and the adjoint expressions ``mul0(g, partial)`` (just ``g`` for a
    partial of 1) over the values they read (``saved``: of "x", "y", "z") and ``g``.
    Worked out once per rule and set of operands (easyad/tensor/_elementwise.py), prepared
    once per backend: ``on(be)`` gives its kernels; a backend whose kernels are plain
    functions (numpy's ``functions``) is called from C directly."""

    cdef readonly str name
    cdef readonly tuple value, exprs, saved, wanted
    cdef readonly int arity
    cdef readonly bint saves_x, saves_y, saves_z
    cdef object _functions_be   # the backend _functions was made for (numpy: one)
    cdef tuple _functions       # (value function, adjoint functions), or None

    def __init__(self, str name, str value, tuple exprs, tuple saved, tuple wanted,
                 int arity):
        self.name, self.value, self.exprs, self.saved, self.wanted, self.arity = \
            name, (value,), exprs, saved, wanted, arity
        self.saves_x, self.saves_y, self.saves_z = "x" in saved, "y" in saved, "z" in saved

    @property
    def label(self):
        return self.name + "_vjp"

    def on(self, be):
        """(value kernel, adjoint kernel) on backend ``be`` (``Backend.prepared_map``),
        kept by the backend (a dict here would keep every recording's backend alive: its
        program and device buffers, as long as the rule lives)."""
        kept = getattr(be, "_rule_kernels", None)
        if kept is None:
            kept = be._rule_kernels = {}
        found = kept.get(self)
        if found is None:
            found = kept[self] = (
                be.prepared_map(self.name, self.value, ("x", "y")[:self.arity]),
                be.prepared_map(self.label, self.exprs, self.saved + ("g",)))
        return found

    cdef tuple functions(self, object be):
        if be is not self._functions_be:
            make = getattr(type(be), "functions", None)
            self._functions = None if make is None or _errstate_var is None else (
                make(be, self.value[0], ("x", "y")[:self.arity]),
                tuple(make(be, e, self.saved + ("g",)) for e in self.exprs))
            self._functions_be = be
        return self._functions

    cdef object forward(self, object be, tuple args, tuple shape, object dtype):
        cdef tuple functions = self.functions(be)
        if functions is None:
            return self.on(be)[0](args, shape, (dtype,))[0]
        return _own(be, _quiet(functions[0], args), shape, dtype, args)

    cdef list backward(self, object be, tuple args, tuple shape, object dtype):
        cdef tuple functions = self.functions(be)
        if functions is None:
            return self.on(be)[1](args, shape, (dtype,) * len(self.wanted))
        return [_own(be, _quiet(f, args), shape, dtype, args) for f in functions[1]]


@cython.final
@cython.auto_pickle(False)
cdef class ElementwiseStep:
    """One recorded elementwise operation as data, its node's ``vjp`` (called from C by
    the sweep; ``graph`` is its method): the rule's plan, the backend, the values the
    adjoint expressions read (``plan.saved``), the output's shape and dtype, and per
    operand its shape (``target``), dtype (None: a scalar, whose adjoint is a float) and
    entry. No closure per operation."""

    cdef readonly RulePlan plan
    cdef readonly type cls
    cdef readonly object be, dtype
    cdef readonly tuple saved, shape, target, odtypes, indices

    def __init__(self, RulePlan plan not None, type cls, be, tuple saved, tuple shape, dtype,
                 tuple target, tuple odtypes, tuple indices):
        self.plan, self.cls, self.be, self.saved, self.shape, self.dtype = \
            plan, cls, be, saved, shape, dtype
        self.target, self.odtypes, self.indices = target, odtypes, indices

    def __call__(self, g):
        """The vjp: one adjoint contribution per operand (None where none is wanted)."""
        return self.adjoints(g)

    def graph(self, tape, Py_ssize_t index, g):
        """The vjp in recorded operations (``Node.graph``), for create_graph."""
        return _service("elementwise.step_graph")(self, tape, index, g)

    cdef tuple adjoints(self, object g):
        cdef RulePlan plan = self.plan
        cdef list outs = plan.backward(self.be, self.saved + (g,), self.shape, self.dtype)
        if plan.arity == 1:
            return (outs[0],)
        cdef list result = [None, None]
        cdef Py_ssize_t k, m = 0
        for k in plan.wanted:
            c = outs[m]
            m += 1
            if self.odtypes[k] is None or self.target[k] != self.shape:
                c = _service("tensor.fold")(self.be, c, self.shape, self.target[k],
                                            self.odtypes[k] is None)
            result[k] = c
        return (result[0], result[1])


# ---- dispatch: Tensor's rule-table hooks ----

cdef dict _rule_plans = {}      # rule name -> [plan for x, for y, for both]
cdef tuple _WANTED = ((0,), (1,), (0, 1))


cdef RulePlan _plan_of(object rule, int which):
    cdef str name = rule.name
    cdef list plans = _rule_plans.get(name)
    if plans is None:
        plans = _rule_plans[name] = [None, None, None]
    found = plans[which]
    if found is None:
        found = plans[which] = _service("elementwise.plan")(rule, _WANTED[which])
    return <RulePlan>found


cdef inline bint _is_float_dtype(object dtype):
    return dtype is _FLOAT64 or dtype is _FLOAT32


cdef inline bint _live(TensorCore t):
    return t._tape is None or t._tape.generation == t._generation


cdef object _step(TensorCore like, RulePlan plan, object x, object y, object z,
                  tuple shape, tuple target, tuple odtypes, tuple indices):
    # the node's vjp for an elementwise result z = rule(x, y) of shape and dtype like's
    cdef list saved = []
    if plan.saves_x:
        saved.append(x)
    if plan.saves_y:
        saved.append(y)
    if plan.saves_z:
        saved.append(z)
    cdef ElementwiseStep step = ElementwiseStep.__new__(ElementwiseStep)
    step.plan, step.cls, step.be, step.saved = plan, type(like), like._backend, tuple(saved)
    step.shape, step.dtype, step.target, step.odtypes, step.indices = \
        shape, like._dtype, target, odtypes, indices
    return step


def tensor_unary_rule(TensorCore self, rule):
    """``rule`` applied to every element (Tensor's ``_unary_rule`` hook)."""
    if not _is_float_dtype(self._dtype) or not _live(self):
        return _service("elementwise.unary")(rule, self)
    cdef RulePlan plan = _plan_of(rule, 0)
    cdef object be = self._backend, x = self._data
    cdef tuple shape = self._shape
    z = plan.forward(be, (x,), shape, self._dtype)
    cdef WengertList tape = self._tape
    if tape is None:
        return _new_tensor(type(self), be, z, shape, self._dtype, None, -1)
    step = _step(self, plan, x, None, z, shape, (shape, ()), (self._dtype, None),
                 (self._index, -1))
    return _new_tensor(type(self), be, z, shape, self._dtype, tape, tape._push_node_entry(
        _new_node(plan.name, (self._index,), step, None), 0.0))


def tensor_binary_rule(TensorCore self, rule, other, bint reflected):
    """``rule`` of self and other (swapped where ``reflected``), Tensor's
    ``_binary_rule`` hook: here a float tensor with a number, a scalar Record, or a tensor
    of the same backend and dtype (broadcasting); the rest (promotion, arrays, and the
    errors) in Python."""
    cdef TensorCore u
    cdef Record r
    cdef WengertList tape = self._tape
    cdef object x, y, number, operand_dtype = None
    cdef Py_ssize_t i_self = self._index, i_other = -1
    cdef tuple shape = self._shape, operand_shape = (), out_shape = self._shape
    if not _is_float_dtype(self._dtype) or not _live(self):
        return _slow_binary(self, rule, other, reflected)
    if type(other) is float or type(other) is int or isinstance(other, float):
        number = float(other)                       # (numpy's float64 is a float)
    elif type(other) is Record:
        r = <Record>other
        _ready(r)                     # a number still on a device: read (restores its generation)
        if r.tape is not None:
            if (r.generation != r.tape.generation or r.tape._strict
                    or (tape is not None and r.tape is not tape)):
                return _slow_binary(self, rule, other, reflected)
            i_other = r.index
            if tape is None:
                tape = r.tape
        number = r._number
    elif isinstance(other, TensorCore):
        u = <TensorCore>other
        if (u._backend is not self._backend or u._dtype is not self._dtype
                or not _live(u) or (u._tape is not tape and u._tape is not None
                                    and tape is not None)):
            return _slow_binary(self, rule, other, reflected)
        if not (u._shape == shape):
            out_shape = _broadcast(shape, u._shape)
            if out_shape is None:        # the Python path says why
                return _slow_binary(self, rule, other, reflected)
        number = u._data
        operand_shape, operand_dtype = u._shape, self._dtype
        i_other = u._index
        if tape is None:
            tape = u._tape
    else:
        return _slow_binary(self, rule, other, reflected)
    cdef bint needs_x = (i_other if reflected else i_self) >= 0
    cdef bint needs_y = (i_self if reflected else i_other) >= 0
    cdef RulePlan plan = _plan_of(rule, 2 if needs_x and needs_y else 1 if needs_y else 0)
    if reflected:
        x, y = number, self._data
    else:
        x, y = self._data, number
    cdef object be = self._backend
    z = plan.forward(be, (x, y), out_shape, self._dtype)
    if tape is None:
        return _new_tensor(type(self), be, z, out_shape, self._dtype, None, -1)
    cdef tuple target, odtypes, indices
    if reflected:
        target, odtypes, indices = ((operand_shape, shape), (operand_dtype, self._dtype),
                                    (i_other, i_self))
    else:
        target, odtypes, indices = ((shape, operand_shape), (self._dtype, operand_dtype),
                                    (i_self, i_other))
    step = _step(self, plan, x, y, z, out_shape, target, odtypes, indices)
    return _new_tensor(type(self), be, z, out_shape, self._dtype, tape,
                       tape._push_node_entry(_new_node(plan.name, indices, step, None), 0.0))


cdef tuple _broadcast(tuple a, tuple b):
    # numpy's broadcast of two shapes, or None where they do not broadcast
    cdef Py_ssize_t na = len(a), nb = len(b), n = max(na, nb), k, da, db
    cdef list out = []
    for k in range(n):
        da = <Py_ssize_t>a[k - n + na] if k >= n - na else 1
        db = <Py_ssize_t>b[k - n + nb] if k >= n - nb else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            return None
    return tuple(out)


cdef object _slow_binary(TensorCore self, object rule, object other, bint reflected):
    if reflected:
        return _service("elementwise.binary")(rule, other, self)
    return _service("elementwise.binary")(rule, self, other)

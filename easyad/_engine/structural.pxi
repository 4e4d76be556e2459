# ---- structural tensor operations in the core: sum, mean, max, min, basic getitem,
# matmul, transpose and reshape on the numpy device, and their steps ----
# (included after tensors.pxi and before tape.pxi, whose sweep calls a core step's
# adjoints in C)
#
# The common case of each runs here in C: the operand checks, the shapes, numpy's own
# kernel, the result object and the tape entry. Everything else (other devices, keepdims,
# tuple axes, fancy indices, batched matmul, mixed operands, every error) goes to the
# Python operation in easyad/tensor/_structural.py (through services), which stays the
# reference: the kernels called here are its kernels, called on the same operands, so
# the numbers are its numbers bit for bit (tests/test_structural_core.py).

from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF

cdef extern from "Python.h":
    ctypedef struct PySliceObject:
        PyObject* start
        PyObject* stop
        PyObject* step

cdef object _np_add_reduce = np.add.reduce
cdef object _np_maximum_reduce = np.maximum.reduce
cdef object _np_minimum_reduce = np.minimum.reduce
cdef object _np_matmul = np.matmul
cdef object _np_ascontiguousarray = np.ascontiguousarray
cdef object _np_equal = np.equal
cdef object _np_where = np.where
cdef object _np_true_divide = np.true_divide
cdef type _numpy_backend = None      # NumpyBackend: the only device the fast paths take
cdef object _blas_matmul = None      # tensor/_blas.matmul
cdef Py_ssize_t _own_kernels_from = 0   # m*k*n from which _blas.matmul may leave numpy
cdef bint _structural_on = True
cdef tuple _SWAP = (1, 0)
cdef object _ONE = 1


def _register_structural(type numpy_backend, blas_matmul, Py_ssize_t smallest):
    """The tensor layer hands over the numpy backend's class and its matrix product
    (``_blas.matmul``, which below ``smallest`` multiply-adds always calls np.matmul)."""
    global _numpy_backend, _blas_matmul, _own_kernels_from
    _numpy_backend, _blas_matmul, _own_kernels_from = numpy_backend, blas_matmul, smallest


def _structural_fast(bint on):
    """Switch the structural operations' C paths on or off (the tests compare them with
    the Python operations); returns the previous setting."""
    global _structural_on
    previous = _structural_on
    _structural_on = on
    return previous


# ---- steps ----

@cython.auto_pickle(False)
cdef class Step:
    """A node's vjp as data: ``step(g)`` gives one adjoint contribution per input (None:
    none), ``step.graph(tape, index, g)`` the same in recorded operations. The base of
    the tensor operations' steps (easyad/tensor/_steps.py); it has no fields, so a step
    written in Python is an ordinary object with slots."""

    def __call__(self, g):
        raise NotImplementedError

    def graph(self, tape, index, g):
        raise NotImplementedError


@cython.auto_pickle(False)
cdef class _CoreStep(Step):
    """A step of the core: the backward sweep calls its adjoints in C, and its node may
    leave ``graph`` None (the step's method is its graph, as an ElementwiseStep's)."""

    def __call__(self, g):
        return self.adjoints(g)

    cdef object adjoints(self, object g):
        raise NotImplementedError


cdef inline object _tracked(object be, object buf):
    if be.tracking:
        be._track(buf)
    return buf


cdef int _typenum(object dtype):
    return cnp.NPY_DOUBLE if dtype is _FLOAT64 else cnp.NPY_FLOAT if dtype is _FLOAT32 else -1


cdef int _dims(tuple shape, cnp.npy_intp* dims) except -1:
    # shape into dims (room for NPY_MAXDIMS); -1 raised by the conversion of a bad item
    cdef Py_ssize_t k, n = len(shape)
    if n > 64:
        raise ValueError(f"{n} axes: more than numpy takes")
    for k in range(n):
        dims[k] = <cnp.npy_intp>shape[k]
    return <int>n


cdef object _empty(tuple shape, object dtype, bint zeros):
    # a new C-contiguous array (np.empty or np.zeros)
    cdef cnp.npy_intp dims[64]
    cdef int typenum = _typenum(dtype)
    if typenum < 0:
        return (np.zeros if zeros else np.empty)(shape, dtype=dtype)
    cdef int n = _dims(shape, dims)
    if zeros:
        return cnp.PyArray_ZEROS(n, dims, typenum, 0)
    return cnp.PyArray_SimpleNew(n, dims, typenum)


cdef object _reshaped(object a, tuple shape):
    # a.reshape(shape) (a view where numpy can make one)
    cdef cnp.npy_intp dims[64]
    cdef cnp.PyArray_Dims d
    if type(a) is not _NDARRAY or len(shape) > 64:
        return a.reshape(shape)
    d.ptr = dims
    d.len = _dims(shape, dims)
    return cnp.PyArray_Newshape(<cnp.ndarray>a, &d, cnp.NPY_CORDER)


cdef object _permuted_copy(object a, tuple perm):
    # a.transpose(perm).copy(): a new C-contiguous array
    cdef cnp.npy_intp dims[64]
    cdef cnp.PyArray_Dims d
    d.ptr = dims
    d.len = _dims(perm, dims)
    return cnp.PyArray_NewCopy(<cnp.ndarray>cnp.PyArray_Transpose(<cnp.ndarray>a, &d),
                               cnp.NPY_CORDER)


cdef object _as_buffer(object be, object r, tuple shape, object dtype):
    # a map kernel's result as the backend's _fresh makes it: a new C-contiguous array of
    # shape and dtype (r itself where it is one)
    cdef object out
    if not (type(r) is _NDARRAY and cnp.PyArray_TYPE(<cnp.ndarray>r) == _typenum(dtype)
            and cnp.PyArray_BASE(<cnp.ndarray>r) == NULL
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>r) and _shape_of(r) == shape):
        out = _empty(shape, dtype, False)
        out[...] = r
        r = out
    return _tracked(be, r)


cdef object _product(object a, object b, Py_ssize_t mkn):
    # _blas.matmul(a, b): np.matmul below the size where it might choose other kernels
    if mkn < _own_kernels_from:
        return _np_matmul(a, b)
    return _blas_matmul(a, b)


@cython.final
@cython.auto_pickle(False)
cdef class SumStep(_CoreStep):
    """sum's vjp: the adjoint (of the reduced shape ``kept``, or a float) broadcast back to
    the operand's ``shape``."""

    cdef readonly type cls
    cdef readonly object be, dtype
    cdef readonly tuple kept, shape

    def __init__(self, type cls, be, tuple kept, tuple shape, dtype):
        self.cls, self.be, self.kept, self.shape, self.dtype = cls, be, kept, shape, dtype

    def __reduce__(self):     # pickles as its Python class did
        return SumStep, (self.cls, self.be, self.kept, self.shape, self.dtype)

    cdef object adjoints(self, object g):
        cdef object out
        if type(self.be) is _numpy_backend and (isinstance(g, float) or type(g) is _NDARRAY):
            out = _empty(self.shape, self.dtype, False)     # out[...] = g, as map's kernel
            if type(g) is _NDARRAY:
                cnp.PyArray_CopyInto(<cnp.ndarray>out, <cnp.ndarray>_reshaped(g, self.kept))
            else:
                cnp.PyArray_FillWithScalar(<cnp.ndarray>out, g)
            return (_tracked(self.be, out),)
        return _service("structural.sum_vjp")(self, g)

    def graph(self, tape, Py_ssize_t index, g):
        return _service("structural.sum_graph")(self, tape, index, g)


@cython.final
@cython.auto_pickle(False)
cdef class ExtremeStep(_CoreStep):
    """max's or min's vjp: the adjoint goes to the operand's elements ``x`` equal to the
    result ``m`` (of shape ``kept``), split evenly among ties (reduced over ``axes``)."""

    cdef readonly type cls
    cdef readonly object be, dtype, x, m
    cdef readonly tuple kept, shape, axes

    def __init__(self, type cls, be, tuple kept, tuple shape, dtype, x, m, tuple axes):
        self.cls, self.be, self.kept, self.shape, self.dtype = cls, be, kept, shape, dtype
        self.x, self.m, self.axes = x, m, axes

    def __reduce__(self):     # pickles as its Python class did
        return ExtremeStep, (self.cls, self.be, self.kept, self.shape, self.dtype, self.x,
                             self.m, self.axes)

    cdef object adjoints(self, object g):
        if (type(self.be) is not _numpy_backend or _errstate_var is None
                or not (type(g) is _NDARRAY or isinstance(g, float))):
            return _service("structural.extreme_vjp")(self, g)
        # the numpy backend's map and reduce kernels of _structural.extreme_vjp, called
        # directly: ties = choose(x == m, 1.0, 0.0), n = its sum over the axes,
        # choose(x == m, g / n, 0.0)
        cdef object be = self.be, token = PyContextVar_Set(_errstate_var, _errstate_ignore)
        try:
            chosen = _np_equal(self.x, self.m)
            ties = _as_buffer(be, _np_where(chosen, 1.0, 0.0), self.shape, self.dtype)
            n = _reshaped(_tracked(be, _contiguous(_np_add_reduce(ties, self.axes))),
                          self.kept)
            share = _np_true_divide(g if type(g) is not _NDARRAY else _reshaped(g, self.kept),
                                    n)
            return (_as_buffer(be, _np_where(chosen, share, 0.0), self.shape, self.dtype),)
        finally:
            PyContextVar_Reset(_errstate_var, token)

    def graph(self, tape, Py_ssize_t index, g):
        return _service("structural.extreme_graph")(self, tape, index, g)


@cython.final
@cython.auto_pickle(False)
cdef class ReshapeStep(_CoreStep):
    """reshape's vjp: the adjoint in the operand's shape ``old``."""

    cdef readonly object be
    cdef readonly tuple old

    def __init__(self, be, tuple old):
        self.be, self.old = be, old

    def __reduce__(self):     # pickles as its Python class did
        return ReshapeStep, (self.be, self.old)

    cdef object adjoints(self, object g):
        if type(self.be) is _numpy_backend:
            return (_reshaped(g, self.old),)
        return (self.be.reshape(g, self.old),)

    def graph(self, tape, Py_ssize_t index, g):
        return (g.reshape(self.old),)


@cython.final
@cython.auto_pickle(False)
cdef class TransposeStep(_CoreStep):
    """transpose's vjp: the adjoint (of shape ``out_shape``) permuted back by ``inverse``."""

    cdef readonly object be
    cdef readonly tuple out_shape, inverse

    def __init__(self, be, tuple out_shape, tuple inverse):
        self.be, self.out_shape, self.inverse = be, out_shape, inverse

    def __reduce__(self):     # pickles as its Python class did
        return TransposeStep, (self.be, self.out_shape, self.inverse)

    cdef object adjoints(self, object g):
        if type(self.be) is _numpy_backend and type(g) is _NDARRAY:
            # strided's contiguous copy of the permuted view
            return (_tracked(self.be, _permuted_copy(_reshaped(g, self.out_shape),
                                                     self.inverse)),)
        return _service("structural.transpose_vjp")(self, g)

    def graph(self, tape, Py_ssize_t index, g):
        return (g.transpose(self.inverse),)


@cython.final
@cython.auto_pickle(False)
cdef class KeySliceStep(_CoreStep):
    """getitem's vjp on the numpy device for an index ``key`` of ints and slices: the
    adjoint written into zeros of the operand's ``shape`` at ``key`` by numpy's basic
    indexing; recorded, that is ``put``."""

    cdef readonly type cls
    cdef readonly object be, dtype, key
    cdef readonly tuple shape

    def __init__(self, type cls, be, tuple shape, dtype, key):
        self.cls, self.be, self.shape, self.dtype, self.key = cls, be, shape, dtype, key

    def __reduce__(self):     # pickles as its Python class did
        return KeySliceStep, (self.cls, self.be, self.shape, self.dtype, self.key)

    cdef object adjoints(self, object g):
        out = _empty(self.shape, self.dtype, True)
        out[self.key] = g
        return (_tracked(self.be, out),)

    def graph(self, tape, Py_ssize_t index, g):
        return _service("structural.index_graph")(self, tape, index, g)


@cython.final
@cython.auto_pickle(False)
cdef class MatmulStep(_CoreStep):
    """matmul's vjp: two matmuls, batched over ``batch`` and folded back to the operands'
    shapes. ``a2``, ``b2``: the operands' shapes with a vector made a matrix; ``mkn``: the
    product's (m, k) @ (k, n); ``a3``: A's shape as the backend's matmul saw it;
    ``keep_a``/``keep_b``: A's and B's batched buffers, each kept only where the other
    operand needs its adjoint; ``parts``: each operand's (data, shape, dtype, entry), dtype
    None for a scalar, entry -1 for a constant (no adjoint)."""

    cdef readonly type cls
    cdef readonly object be, dtype, keep_a, keep_b
    cdef readonly tuple batch, a2, b2, mkn, a3, parts

    def __init__(self, type cls, be, dtype, tuple batch, tuple a2, tuple b2, tuple mkn,
                 tuple a3, keep_a, keep_b, tuple parts):
        self.cls, self.be, self.dtype, self.batch, self.a2, self.b2 = cls, be, dtype, batch, a2, b2
        self.mkn, self.a3, self.keep_a, self.keep_b, self.parts = mkn, a3, keep_a, keep_b, parts

    def __reduce__(self):     # pickles as its Python class did
        return MatmulStep, (self.cls, self.be, self.dtype, self.batch, self.a2, self.b2,
                             self.mkn, self.a3, self.keep_a, self.keep_b, self.parts)

    cdef object adjoints(self, object g):
        # numpy and no batch (the folds are no-ops): matmul_vjp's kernels called here
        if (type(self.be) is not _numpy_backend or self.batch
                or not (type(g) is _NDARRAY or isinstance(g, float))):
            return _service("structural.matmul_vjp")(self, g)
        cdef tuple a_part = self.parts[0], b_part = self.parts[1]
        cdef Py_ssize_t m = self.mkn[0], k = self.mkn[1], n = self.mkn[2], size = m * k * n
        cdef object be = self.be, ga = None, gb = None, g3
        if type(g) is not _NDARRAY:     # a float adjoint as a 0-d buffer (be.full)
            g3 = _tracked(be, _empty((), self.dtype, False))
            cnp.PyArray_FillWithScalar(<cnp.ndarray>g3, g)
            g = g3
        g3 = _reshaped(g, (1, m, n))
        if <Py_ssize_t>a_part[3] >= 0:       # g3 @ B^T, the transpose a BLAS flag
            ga = _tracked(be, _contiguous(_product(
                g3, cnp.PyArray_SwapAxes(<cnp.ndarray>self.keep_b, 1, 2), size)))
            ga = _reshaped(ga, <tuple>a_part[1])
        if <Py_ssize_t>b_part[3] >= 0:       # A^T (a contiguous copy, as strided) @ g3
            at = _tracked(be, cnp.PyArray_NewCopy(
                <cnp.ndarray>cnp.PyArray_SwapAxes(<cnp.ndarray>self.keep_a, 1, 2),
                cnp.NPY_CORDER))
            gb = _tracked(be, _contiguous(_product(at, g3, size)))
            gb = _reshaped(gb, <tuple>b_part[1])
        return (ga, gb)

    def graph(self, tape, Py_ssize_t index, g):
        return _service("structural.matmul_graph")(self, tape, index, g)


cdef inline object _contiguous(object r):
    if type(r) is _NDARRAY and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>r):
        return r
    return _np_ascontiguousarray(r)


# ---- the fast paths ----

cdef inline bint _on_numpy(TensorCore t):
    # a live float tensor on the numpy device whose buffer is an ndarray
    return (_structural_on and type(t._backend) is _numpy_backend
            and _errstate_var is not None and _is_float_dtype(t._dtype) and _live(t)
            and type(t._data) is _NDARRAY)


cdef inline bint _as_index(object v, Py_ssize_t* out):
    # an int (not a bool or numpy int) that fits a Py_ssize_t: its value
    if type(v) is not int:
        return False
    try:
        out[0] = v
    except OverflowError:
        return False
    return True


cdef tuple _ints_tuple(Py_ssize_t n, Py_ssize_t skip, object at_skip, tuple source):
    # source with item ``skip`` replaced by at_skip (dropped where at_skip is NULL-like
    # None), or range(n) where source is None
    cdef Py_ssize_t k, j = 0
    cdef tuple out = PyTuple_New(n - 1 if skip >= 0 and at_skip is None else n)
    cdef object item
    for k in range(n):
        if k == skip:
            if at_skip is None:
                continue
            item = at_skip
        else:
            item = source[k] if source is not None else k
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, j, item)
        j += 1
    return out


cdef tuple _filled(Py_ssize_t n, object item):
    cdef tuple out = PyTuple_New(n)
    cdef Py_ssize_t k
    for k in range(n):
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, k, item)
    return out


cdef tuple _shape_of(cnp.ndarray a):
    cdef Py_ssize_t k, n = cnp.PyArray_NDIM(a)
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    cdef tuple out = PyTuple_New(n)
    cdef object item
    for k in range(n):
        item = dims[k]
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, k, item)
    return out


cdef object _scalar_entry(TensorCore t, str label, double number, object step):
    # a single-number result (record_scalar): a scalar Record on t's list, or the float
    cdef WengertList tape = t._tape
    if tape is None or t._index < 0:
        return number
    cdef Node node = _new_node(label, (t._index,), step, None)
    node.scalar_output = True
    cdef Record r = Record.__new__(Record)
    r._number = number
    r.index = tape._push_node_entry(node, number)
    r.tape = tape
    r.generation = tape.generation
    return r


cdef object _tensor_entry(TensorCore t, str label, object data, tuple shape, object step):
    # a result tensor of t's class, recorded on t's list as one node reading t
    cdef WengertList tape = t._tape
    if tape is None or t._index < 0:
        return _new_tensor(type(t), t._backend, data, shape, t._dtype, None, -1)
    return _new_tensor(type(t), t._backend, data, shape, t._dtype, tape,
                       tape._push_node_entry(_new_node(label, (t._index,), step, None), 0.0))


cdef inline double _element(cnp.ndarray a, char* p):
    if cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE:
        return (<double*>p)[0]
    return <double>(<float*>p)[0]


# -- reductions --

cdef SumStep _sum_step(TensorCore t, tuple kept):
    cdef SumStep step = SumStep.__new__(SumStep)
    step.cls, step.be, step.kept, step.shape, step.dtype = \
        type(t), t._backend, kept, t._shape, t._dtype
    return step


cdef ExtremeStep _extreme_step(TensorCore t, tuple kept, object m, tuple axes):
    cdef ExtremeStep step = ExtremeStep.__new__(ExtremeStep)
    step.cls, step.be, step.kept, step.shape, step.dtype = \
        type(t), t._backend, kept, t._shape, t._dtype
    step.x, step.m, step.axes = t._data, m, axes
    return step


cdef object _reduce_fast(TensorCore t, object axis, object keepdims, int op):
    # sum (op 0), max (1) or min (2) over all axes or one int axis, without keepdims:
    # numpy's reduce, as the Python operation calls it; None where that one decides
    if keepdims is not False or not _on_numpy(t):
        return None
    cdef tuple shape = t._shape, axes, kept, out_shape
    cdef Py_ssize_t ndim = len(shape), k = -1
    cdef cnp.ndarray x = <cnp.ndarray>t._data
    if axis is not None:
        if not _as_index(axis, &k):
            return None
        if k < 0:
            k += ndim
        if not 0 <= k < ndim:
            return None
    if op and cnp.PyArray_SIZE(x) == 0:
        return None                 # the max of nothing: the Python operation says so
    if k < 0:
        axes, kept, out_shape = _ints_tuple(ndim, -1, None, None), _filled(ndim, _ONE), ()
    else:
        axes = (k,)
        kept = _ints_tuple(ndim, k, _ONE, shape)
        out_shape = _ints_tuple(ndim, k, None, shape)
    cdef object be = t._backend, raw, m
    if op == 0:
        raw = _quiet(_np_add_reduce, (x, axes))
        if not out_shape:
            return _scalar_entry(t, "sum", float(raw), _sum_step(t, kept)
                                 if t._tape is not None else None)
        return _tensor_entry(t, "sum", _tracked(be, _contiguous(raw)), out_shape,
                             _sum_step(t, kept))
    reducer = _np_maximum_reduce if op == 1 else _np_minimum_reduce
    label = "max" if op == 1 else "min"
    if not out_shape:       # kept-shaped (keepdims), and its one number
        m = _tracked(be, _quiet(reducer, (x, axes, None, None, True)))
        return _scalar_entry(t, label, _element(<cnp.ndarray>m,
                                                cnp.PyArray_BYTES(<cnp.ndarray>m)),
                             _extreme_step(t, kept, m, axes) if t._tape is not None
                             else None)
    raw = _tracked(be, _contiguous(_quiet(reducer, (x, axes))))
    return _tensor_entry(t, label, raw, out_shape,
                         _extreme_step(t, kept, _reshaped(raw, kept), axes))


# Tensor's methods (the tensor_* functions): their signatures for inspect and the docs,
# not in the docstring
@cython.embedsignature.format("clinic")
def tensor_sum(TensorCore self, axis=None, keepdims=False):
    """Sum over ``axis`` (all axes: a scalar Record, or a float for constants)."""
    out = _reduce_fast(self, axis, keepdims, 0)
    return out if out is not None else _service("structural.sum")(self, axis, keepdims)


@cython.embedsignature.format("clinic")
def tensor_mean(TensorCore self, axis=None, keepdims=False):
    """Mean over ``axis`` (all axes: a scalar Record, or a float for constants)."""
    out = _reduce_fast(self, axis, keepdims, 0)
    if out is None:
        return _service("structural.mean")(self, axis, keepdims)
    cdef tuple shape = self._shape
    cdef Py_ssize_t k, count
    if axis is None:
        count = cnp.PyArray_SIZE(<cnp.ndarray>self._data)
    else:
        k = axis
        count = shape[k if k >= 0 else k + len(shape)]
    return out * (1.0 / <double>count if count else NAN)


@cython.embedsignature.format("clinic")
def tensor_max(TensorCore self, axis=None, keepdims=False):
    """Largest element over ``axis``; ties share the derivative evenly."""
    out = _reduce_fast(self, axis, keepdims, 1)
    return out if out is not None else _service("structural.extreme")(
        "max", self, axis, keepdims)


@cython.embedsignature.format("clinic")
def tensor_min(TensorCore self, axis=None, keepdims=False):
    """Smallest element over ``axis``; ties share the derivative evenly."""
    out = _reduce_fast(self, axis, keepdims, 2)
    return out if out is not None else _service("structural.extreme")(
        "min", self, axis, keepdims)


# -- getitem --

cdef object _getitem_fast(TensorCore t, object key):
    # an index of ints in range and slices of ints (no more items than axes): numpy's basic
    # indexing, and a copy; None for any other index
    if not _on_numpy(t):
        return None
    cdef tuple shape = t._shape
    cdef Py_ssize_t ndim = len(shape), count, j, i, size, ints = 0
    cdef cnp.ndarray x = <cnp.ndarray>t._data
    cdef char* p = cnp.PyArray_BYTES(x)
    cdef PySliceObject* s
    cdef object item
    cdef bint single = type(key) is not tuple
    count = 1 if single else len(<tuple>key)
    if count > ndim:
        return None
    for j in range(count):
        item = key if single else (<tuple>key)[j]
        if type(item) is int:
            size = shape[j]
            if not _as_index(item, &i) or not -size <= i < size:
                return None
            p += (i + size if i < 0 else i) * cnp.PyArray_STRIDES(x)[j]
            ints += 1
        elif type(item) is slice:
            s = <PySliceObject*>item
            if not (<object>s.start is None or type(<object>s.start) is int):
                return None
            if not (<object>s.stop is None or type(<object>s.stop) is int):
                return None
            if not (<object>s.step is None or (type(<object>s.step) is int
                                                and _as_index(<object>s.step, &i) and i != 0)):
                return None
        else:
            return None
    cdef KeySliceStep step = None
    if t._tape is not None:
        step = KeySliceStep.__new__(KeySliceStep)
        step.cls, step.be, step.shape, step.dtype, step.key = \
            type(t), t._backend, shape, t._dtype, key
    if ints == ndim:        # one element: a scalar Record, or a float
        return _scalar_entry(t, "getitem", _element(x, p), step)
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_NewCopy(<cnp.ndarray>x[key],
                                                          cnp.NPY_CORDER)
    return _tensor_entry(t, "getitem", _tracked(t._backend, out), _shape_of(out), step)


cdef inline bint _has_slice(object key):
    # a slice among the index's items: no single element (shapes.is_element)
    if type(key) is slice:
        return True
    if type(key) is tuple:
        for item in <tuple>key:
            if type(item) is slice:
                return True
    return False


@cython.embedsignature.format("clinic")
def tensor_getitem(TensorCore self, key):
    """``t[key]``: scalar code on a transform's input reads its element Records; an index
    of ints and slices on the numpy device is taken here, the rest in Python."""
    records = self._records
    if records is not None and type(key) is int:   # scalar code on a 1-D input
        return records[key]
    if self._elements is not None and not _has_slice(key):   # perhaps one element
        return _service("tensor.element_getitem")(self, key)
    out = _getitem_fast(self, key)
    return out if out is not None else _service("structural.getitem")(self, key)


# -- matmul --

cdef object _matmul_fast(TensorCore a, object other):
    # (m, k) @ (k, n), (m, k) @ (k,), (k,) @ (k, n), (k,) @ (k,) of two live float tensors
    # on the numpy device, one dtype and one list: the matrix product _blas.matmul takes
    # (np.matmul on the buffers as they are); None for anything else
    if not isinstance(other, TensorCore):
        return None
    cdef TensorCore b = <TensorCore>other
    if (b._backend is not a._backend or b._dtype is not a._dtype or not _on_numpy(a)
            or not _on_numpy(b)):
        return None
    cdef WengertList tape = a._tape
    if tape is None:
        tape = b._tape
    elif b._tape is not None and b._tape is not tape:
        return None
    cdef tuple sa = a._shape, sb = b._shape, out_shape, a2, b2
    cdef Py_ssize_t na = len(sa), nb = len(sb), m, k, n
    if not (1 <= na <= 2 and 1 <= nb <= 2):
        return None
    k = sa[na - 1]
    if k != <Py_ssize_t>sb[0]:
        return None
    m = sa[0] if na == 2 else 1
    n = sb[1] if nb == 2 else 1
    if na == 2:
        a2 = sa
        out_shape = (sa[0], sb[1]) if nb == 2 else (sa[0],)
    else:
        a2 = (1, sa[0])
        out_shape = (sb[1],) if nb == 2 else ()
    b2 = sb if nb == 2 else (sb[0], 1)
    cdef Py_ssize_t ia = a._index, ib = b._index
    cdef object adata = a._data, bdata = b._data, be = a._backend, dtype = a._dtype
    result = _product(adata, bdata, m * k * n)
    cdef bint constant = tape is None or (ia < 0 and ib < 0)
    if not out_shape:
        if constant:
            return float(result)
    elif constant:
        return _new_tensor(type(a), be, _tracked(be, _contiguous(result)), out_shape, dtype,
                           None, -1)
    cdef MatmulStep step = MatmulStep.__new__(MatmulStep)
    step.cls, step.be, step.dtype, step.batch, step.a2, step.b2 = type(a), be, dtype, (), a2, b2
    step.mkn, step.a3 = (m, k, n), (1, m, k)
    step.keep_a = _reshaped(adata, step.a3) if ib >= 0 else None
    step.keep_b = _reshaped(bdata, (1, k, n)) if ia >= 0 else None
    step.parts = ((adata, sa, dtype, ia), (bdata, sb, dtype, ib))
    cdef tuple inputs = (ia, ib)
    cdef Node node = _new_node("matmul", inputs, step, None)
    cdef double number
    cdef Record r
    if not out_shape:
        number = float(result)
        node.scalar_output = True
        r = Record.__new__(Record)
        r._number = number
        r.index = tape._push_node_entry(node, number)
        r.tape = tape
        r.generation = tape.generation
        return r
    return _new_tensor(type(a), be, _tracked(be, _contiguous(result)), out_shape, dtype,
                       tape, tape._push_node_entry(node, 0.0))


@cython.embedsignature.format("clinic")
def tensor_matmul(TensorCore self, other):
    """``self @ other``."""
    out = _matmul_fast(self, other)
    return out if out is not None else _service("structural.matmul")(self, other)


# -- reshape, transpose --

cdef object _reshape_fast(TensorCore t, object new):
    # new: an int or a tuple of ints, at most one -1; None where the Python operation
    # decides (and raises)
    if not _on_numpy(t):
        return None
    cdef tuple target
    if type(new) is int:
        target = (new,)
    elif type(new) is tuple:
        target = <tuple>new
    else:
        return None
    cdef cnp.ndarray x = <cnp.ndarray>t._data
    cdef Py_ssize_t size = cnp.PyArray_SIZE(x), known = 1, unknown = -1, j, v = 0
    for j in range(len(target)):
        if not _as_index(target[j], &v) or v < -1:
            return None
        if v == -1:
            if unknown >= 0:
                return None
            unknown = j
        elif v and known > size // v + 1:   # the product would pass the size (or overflow)
            return None
        else:
            known *= v
    if unknown >= 0:
        if known == 0 or size % known:
            return None
        target = _ints_tuple(len(target), unknown, size // known, target)
    elif known != size:
        return None
    cdef ReshapeStep step = None
    if t._tape is not None:
        step = ReshapeStep.__new__(ReshapeStep)
        step.be, step.old = t._backend, t._shape
    return _tensor_entry(t, "reshape", _reshaped(x, target), target, step)


@cython.embedsignature.format("clinic")
def tensor_reshape(TensorCore self, *shape):
    """The same elements in ``shape`` (ints, or one tuple; one of them may be -1)."""
    new = shape[0] if len(shape) == 1 else shape
    out = _reshape_fast(self, new)
    return out if out is not None else _service("structural.reshape")(self, new)


cdef object _transpose_fast(TensorCore t):
    # a 2-D tensor's transpose, as a new C-contiguous buffer
    if len(t._shape) != 2 or not _on_numpy(t):
        return None
    cdef tuple out_shape = (t._shape[1], t._shape[0])
    cdef TransposeStep step = None
    if t._tape is not None:
        step = TransposeStep.__new__(TransposeStep)
        step.be, step.out_shape, step.inverse = t._backend, out_shape, _SWAP
    out = cnp.PyArray_NewCopy(<cnp.ndarray>cnp.PyArray_Transpose(<cnp.ndarray>t._data, NULL),
                              cnp.NPY_CORDER)
    return _tensor_entry(t, "transpose", _tracked(t._backend, out), out_shape, step)


cdef inline bint _is_swap(tuple axes):
    # (1, 0) of ints, or that as one tuple argument
    if len(axes) == 1 and type(axes[0]) is tuple:
        axes = <tuple>axes[0]
    return (len(axes) == 2 and type(axes[0]) is int and type(axes[1]) is int
            and axes[0] == 1 and axes[1] == 0)


@cython.embedsignature.format("clinic")
def tensor_transpose(TensorCore self, *axes):
    """The axes permuted by ``axes`` (ints, or one tuple; none: reversed)."""
    if not axes or _is_swap(axes):
        out = _transpose_fast(self)
        if out is not None:
            return out
    return _service("structural.transpose")(self, axes)


@cython.embedsignature.format("clinic")
def tensor_T(TensorCore self):
    """The axes reversed (a 2-D tensor's transpose)."""
    out = _transpose_fast(self)
    return out if out is not None else _service("structural.transpose")(self, ())

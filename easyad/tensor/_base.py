"""The tensor's base: storage and recording, what every tensor operation builds on.

Sits above the compiled core and beside the scalar API: a tensor operation appends one
node entry (``lst._push_node``) to the same WengertList as scalar Records, so Records and
Tensors combine freely and ``z.derivatives()`` runs one mixed sweep (scalar runs in C,
tensor nodes through their ``vjp``). A node keeps only what its vjp reads (the operands or
output its partial expressions name), so clearing the list releases the buffers.

Layering: this module imports only the core, ``_shapes``, ``_devices`` and
``_interpreters`` (which backend a new tensor goes on). The operations (``_elementwise``,
``_structural``, ``_fused``) import it and make their results with ``wrap``/``record`` of
the class they were given (``type(t)``), so none of them needs the ``Tensor`` class, which
sits above them all (``_tensor.py``) and calls them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from easyad import _arrays, _core, _expr, _levels
from easyad._core import Node as _core_Node
from easyad._core import Record, Trace, WengertList
from easyad.errors import StaleRecordError, TapeMismatchError
from easyad.tensor import _devices, _interpreters
from easyad.tensor import _shapes as shapes

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

FLOAT64, FLOAT32 = np.dtype(np.float64), np.dtype(np.float32)
FLOAT_DTYPES = (FLOAT64, FLOAT32)
BOOL = np.dtype(np.bool_)
T = TypeVar("T", bound="TensorBase")


def uses(expression: str, name: str) -> bool:
    """Whether a rule expression reads the variable ``name`` (x, y or z)."""
    return name in _expr.variables(expression)


# ---- tape nodes ----

# Node (a tensor operation's tape entry: label, inputs, vjp, graph, scalar_output, retain)
# is the core's cdef class: the mixed sweep reads its fields in C.
Node = _core_Node


def _no_vjp(g: Any) -> tuple[()]:
    return ()


# ---- operands: what a tensor operation accepts next to a Tensor ----

class Operand:
    """One operand, normalized: its data (a buffer, or a float for scalars), shape, tape
    (None for constants), entry index (-1 for constants) and dtype (None: a weak scalar)."""

    __slots__ = ("data", "shape", "tape", "index", "dtype")

    def __init__(self, data: Any, shape: tuple[int, ...], tape: Any, index: int,
                 dtype: Any) -> None:
        self.data, self.shape, self.tape, self.index, self.dtype = data, shape, tape, index, dtype

    @property
    def needs_adjoint(self) -> bool:
        return self.index >= 0


class ObjectArrayOperand(TypeError):
    """A tensor operation was handed a numpy object array of Records or Traces (what
    ``ad.record`` passes to ``f``); ``ad.hessian`` then differentiates with tensors."""


def refuse_object_array(a: np.ndarray) -> None:
    if a.dtype == object and any(isinstance(e, (Record, Trace)) for e in a.reshape(-1)):
        raise ObjectArrayOperand(
            "a tensor operation got a numpy array of Records or Traces (np.array of single "
            "numbers, or what ad.record passes f); tensor operations take Tensors: "
            "differentiate with ad.grad, ad.jacobian, ad.hessian or ad.hvp, which pass f "
            "Tensors, and build vectors with tensor operations (y * c, y[::-1], ad.stack or "
            "ad.concatenate with a Tensor among the parts) rather than np.array of elements")


def live_tape(t: TensorBase) -> Any:
    tape = t._tape
    if tape is not None and tape.generation != t._generation:
        raise StaleRecordError(f"this tensor was recorded on {tape!r} before it was cleared; "
                               f"tensors do not survive lst.clear(), so make the inputs again")
    return tape


def operand(v: Any, backend: Backend, dtype: Any = None) -> Operand | None:
    """``v`` as an Operand for ``backend``, or None if tensors cannot take it."""
    if type(v) is float:      # the commonest constants first
        return Operand(v, (), None, -1, None)
    if isinstance(v, TensorBase):
        if v._backend is backend:
            tape = v._tape
            if tape is not None and tape.generation != v._generation:
                live_tape(v)    # raises StaleRecordError
            return Operand(v._data, v._shape, tape, v._index, v._dtype)
        # another backend's tensor: this one's interpreter takes it (eval_shape: by its
        # shape) or raises why not (two devices; a tensor from outside ad.record's f)
        return Operand(backend.interpreter.adopt(backend, v), v._shape, live_tape(v),
                       v._index, v._dtype)
    if type(v) is Record:
        if v.tape is None:
            return Operand(float(v.number), (), None, -1, None)
        v.name  # raises StaleRecordError for a Record made before lst.clear()
        return Operand(float(v.number), (), v.tape, v.index, None)
    if type(v).__name__ == "TraceTensor":
        return None   # NotImplemented: a constant tensor with a TraceTensor is forward mode
    if type(v) is Trace:
        raise TypeError(f"cannot combine a Tensor with a {type(v).__name__}: forward mode "
                        f"and reverse mode do not mix")
    if isinstance(v, (complex, np.complexfloating)):   # float() would drop the imaginary
        _arrays.refuse_complex_scalar(v, "a tensor operand")
    if isinstance(v, (bool, int, float, np.number, np.bool_)):
        return Operand(float(v), (), None, -1, None)
    if isinstance(v, (np.ndarray, list, tuple)):
        a = np.asarray(v)
        refuse_object_array(a)
        if a.dtype.kind == "c":
            _arrays.check_real(a, "a tensor operand")
        if a.dtype.kind not in "biuf":
            return None
        dt: np.dtype
        if a.dtype == BOOL:
            dt = BOOL
        elif a.dtype in FLOAT_DTYPES:
            dt = a.dtype
        else:
            dt = dtype if dtype is not None else np.dtype(np.float64)
        return Operand(backend.asarray(a, dt), a.shape, None, -1, dt)
    return None


def common_tape(op: str, operands: list[Operand]) -> Any:
    tape = None
    for o in operands:
        if o.tape is None:
            continue
        if tape is None:
            tape = o.tape
        elif o.tape is not tape:
            raise TapeMismatchError(f"{op} mixes records of two different lists, {tape!r} and "
                                    f"{o.tape!r}; record a whole computation on one "
                                    f"WengertList")
    return tape


def result_dtype(operands: list[Operand]) -> np.dtype:
    if len(operands) == 2:      # the binary operations' case, without a list and result_type
        a, b = operands[0].dtype, operands[1].dtype
        if a is None or a is BOOL:
            a = b
        elif b is None or b is BOOL or b is a:
            b = a
        if a is b and a is not None and a is not BOOL:
            same: np.dtype = a
            return same
    found = [o.dtype for o in operands if o.dtype is not None and o.dtype != BOOL]
    if not found:
        return np.dtype(np.float64)
    return np.result_type(*found)


# ---- making tensors and recording operations ----

# ``wrap`` (a new tensor of the caller's class) and ``record`` (the same, recorded as one
# node) are the core's: every operation makes its result through them, in C.
wrap = _core.wrap
record = _core.record


def _any_entry(inputs: tuple[int, ...]) -> bool:
    for i in inputs:
        if i >= 0:
            return True
    return False


def record_scalar(cls: type[TensorBase], label: str, backend: Backend, value: Any,
                  tape: Any, inputs: tuple[int, ...], vjp: Any, graph: Any = None) -> Any:
    """A single-number result: a scalar Record (its entry a node whose adjoint is a float),
    a float for constants, or a 0-d tensor where the interpreter keeps numbers as tensors
    (eval_shape, ad.record of tensor code)."""
    interpreter = backend.interpreter
    if interpreter.numbers_stay_tensors:
        return interpreter.number(cls, label, backend, value, tape, inputs, vjp, graph)
    if backend.lazy_numbers and tape is not None and _any_entry(inputs):
        # read when first used (the core's PendingNumber): a step need not wait for it
        return tape._push_pending_node(Node(label, inputs, vjp, scalar_output=True,
                                            graph=graph), backend, value)
    number = read_number(backend, value)
    if tape is None or not _any_entry(inputs):
        return number
    return tape._push_node(Node(label, inputs, vjp, scalar_output=True, graph=graph), number)


def read_number(backend: Backend, buf: Any) -> float:
    """The one number of a 0-d (or one-element) buffer, as a float."""
    return float(np.asarray(backend.to_numpy(buf)).reshape(()))

_core._register_service("tensor.read_number", read_number)   # PendingNumber.value


def read_keyed(x: Any, key: Any) -> Any:
    """``key(values of x)`` for what is not differentiated (pivots, an index, a rank).
    Inside ``ad.record(tensor=True)`` replay is guarded on key's result only (not on every
    value, as ``x.value`` is); ``key`` runs on the host at every replay."""
    guarded = getattr(getattr(x, "_backend", None), "guarded_read", None)
    if guarded is not None:
        return guarded(x._data, key)
    return key(np.asarray(x.value if hasattr(x, "value") and not isinstance(x, np.ndarray)
                          else x))


def fold(backend: Backend, buf: Any, shape: tuple[int, ...], target: tuple[int, ...],
         scalar: bool = False) -> Any:
    """Sum a broadcast adjoint of ``shape`` back to an operand's ``target`` shape; a float
    for a ``scalar`` operand (a Record, whose adjoint is a float)."""
    if scalar:
        if shape == ():
            return float(np.asarray(backend.to_numpy(buf)).reshape(()))
        return float(np.asarray(backend.to_numpy(
            backend.reduce("sum", buf, tuple(range(len(shape)))))).reshape(()))
    if shape == target:
        return buf
    axes = shapes.reduced_axes(shape, target)
    return backend.reshape(backend.reduce("sum", buf, axes), target)

_core._register_service("tensor.fold", fold)   # an ElementwiseStep's broadcast adjoints



# ---- an input's elements as scalar Records ----

class Elements:
    """The elements of an input tensor as scalar variables of its list, made on the first
    access ``x[i, j]`` of one element: scalar code on an input then runs on Records (the
    fast scalar engine) instead of one getitem node per access. They are variables of
    their own, so the input's derivative is its tensor adjoint plus theirs
    (``TensorBase.input_derivative``)."""

    __slots__ = ("values", "records")

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.records: np.ndarray | None = None

    def get(self, key: Any, tape: Any) -> Any:
        """The Record of element ``key`` (ints, one per axis), or None for other keys."""
        if not shapes.is_element(key, self.values.ndim):
            return None
        if self.records is None:
            records = np.empty(self.values.shape, dtype=object)
            flat = records.reshape(-1)
            for i, v in enumerate(self.values.reshape(-1).tolist()):
                flat[i] = tape.variable(v)
            self.records = records
        return self.records[key]


# ---- the storage class ----

class TensorBase(_core.TensorCore):
    """A tensor's storage and recording: its buffer on a backend, shape, dtype and tape
    entry (fields of the core's ``TensorCore``, which the dispatch reads in C), the
    constructors, conversions and the backward sweep. ``Tensor`` adds the operations;
    everything here is what the operation modules below it need."""

    __slots__ = ()
    _backend: Backend      # the device's backend (NumpyBackend, OpenCLBackend, meta)
    _data: Any             # the backend's buffer
    _shape: tuple[int, ...]
    _dtype: np.dtype
    _tape: Any             # the WengertList, or None for a constant
    _handle: Any           # the Record of its tape entry
    _index: int            # its entry index (-1 for a constant)
    _generation: int       # the list's generation when recorded (staleness)
    _name: str | None
    _elements: Any         # an input's scalar elements (Elements), None for the others
    _records: Any          # a 1-D input's element Records once made (x[i] reads them)
    __array_priority__ = 1000.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("make tensors with Tensor.variable(array, lst) or "
                        "Tensor.constant(array)")

    # -- construction --
    @staticmethod
    def _from_array(array: Any, device: Any, dtype: Any) -> tuple[Any, Any, np.dtype]:
        # while a transform runs f (eval_shape, ad.record), its backend: _interpreters
        be = _interpreters.new_tensor_backend() or _devices.resolve(device)
        if isinstance(array, TensorBase):
            if (array._backend is be and array._dtype in FLOAT_DTYPES
                    and (dtype is None or np.dtype(dtype) == array._dtype)):
                # the tensor layer never writes into a tensor's buffer (tensors are
                # values): a tensor made from one on its backend shares it, no copy
                return be, array._data, array._dtype
            array = array.value
        elif (owns := getattr(be, "owns", None)) is not None and owns(array):
            # a device buffer of this backend (a parameter's values on the device): used
            # as it is, no copy; whoever made it never writes into it afterwards
            dt = np.dtype(array.dtype if dtype is None else dtype)
            if dt != array.dtype or dt not in FLOAT_DTYPES:
                raise TypeError(f"a device buffer of {array.dtype} makes a tensor of that "
                                f"dtype (float64 or float32), not {dt}")
            return be, array, dt
        a = np.asarray(array)
        if dtype is None:
            # float32 of either byte order stays float32 (np.dtype(">f4") != float32);
            # np.dtype(type): numpy's own dtype object, which the core's fast paths
            # recognise by identity (a newbyteorder copy would send them to Python)
            native = np.dtype(a.dtype.type) if a.dtype.kind == "f" else a.dtype
            dtype = native if native in FLOAT_DTYPES else np.float64
        dtype = np.dtype(dtype)
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"tensors hold float64 or float32, not {dtype}")
        if a.dtype.kind not in "biuf":
            refuse_object_array(a)       # Records (ad.record's scalar recording): say so
            _arrays.check_real(a, "a tensor's values")
        return be, be.asarray(a, dtype), dtype

    @classmethod
    def variable(cls: type[T], array: Any, lst: WengertList, name: str | None = None,
                 device: Any = None, dtype: Any = None) -> T:
        """An input tensor on ``lst``: derivatives are taken with respect to it."""
        if not isinstance(lst, WengertList):
            raise TypeError(f"lst must be a WengertList, got {type(lst).__name__}")
        be, data, dt = TensorBase._from_array(array, device, dtype)
        shape = tuple(np.shape(array))
        tape: Any = lst   # _push_node is the core's private hook, not in its typing stub
        handle = tape._push_node(Node("variable", (), _no_vjp))
        t = wrap(cls, be, data, shape, dt, lst, handle)
        t._name = name
        return t

    @classmethod
    def _input(cls: type[T], array: np.ndarray, lst: WengertList, device: Any = None) -> T:
        """An input of a transform (``ad.grad``...): a variable whose single elements
        are scalar Records (``Elements``)."""
        t = cls.variable(array, lst, device=device)
        t._elements = Elements(np.asarray(array, dtype=np.float64))
        return t

    def input_derivative(self, d: Any) -> np.ndarray:
        """The derivative of an input made by ``_input`` in the sweep ``d``: its tensor
        adjoint plus its elements' adjoints."""
        total: np.ndarray = self._derivative_from(d)  # type: ignore[attr-defined]
        elements = self._elements
        if elements is not None and elements.records is not None:
            total = total + np.fromiter((d[r] for r in elements.records.reshape(-1)),
                                        dtype=np.float64,
                                        count=self.size).reshape(self._shape)
        return total

    @classmethod
    def constant(cls: type[T], array: Any, device: Any = None, dtype: Any = None) -> T:
        """A tensor on no tape: nothing is recorded for it and its derivative is 0."""
        be, data, dt = TensorBase._from_array(array, device, dtype)
        return wrap(cls, be, data, tuple(np.shape(array)), dt)

    # -- what it is --
    @property
    def value(self) -> np.ndarray:
        """The values, as a new numpy array."""
        out: np.ndarray = self._backend.to_numpy(self._data)
        return out.astype(bool) if self._dtype == BOOL else out

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def device(self) -> Any:
        return self._backend.device

    @property
    def tape(self) -> Any:
        """The WengertList this tensor is recorded on (None for a constant)."""
        return self._tape

    @property
    def handle(self) -> Any:
        """The Record of this tensor's tape entry (None for a constant)."""
        return self._handle

    @property
    def name(self) -> str | None:
        return self._name

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __repr__(self) -> str:
        kind = "constant" if self._tape is None else f"on {self._tape!r}"
        if not self._backend.interpreter.has_values:
            return f"Tensor(shape={self._shape}, dtype={self._dtype}, {kind})"
        body = np.array2string(self.value, separator=", ", threshold=20)
        return f"Tensor({body}, dtype={self._dtype}, device={self.device}, {kind})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # Refused for a recorded tensor while a transform runs f or ad.record records it:
        # a SciPy function that calls np.asarray on its input (scipy.special.polygamma)
        # dropped the derivative with no error (a zero gradient). float(), item() and bool()
        # stay allowed there: they are the branches of ordinary Python (guards in a
        # recording). Outside (a tape made by hand) np.asarray is the caller's explicit
        # choice, and its result visibly a plain array.
        if self._tape is not None and (_levels.inside() or self._backend.interpreter.replays):
            raise TypeError(
                "np.asarray() of a recorded Tensor would drop its derivative silently: use "
                "the ad. functions or the numpy functions easyad implements on Tensors "
                "(docs/scientific.md lists them), or t.value for the values as a constant "
                "if no derivative should flow through them")
        v = self.value
        return v if dtype is None else v.astype(dtype)

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self._shape} is "
                             f"ambiguous; use ad.where(...) for elementwise choices")
        return bool(self.value.reshape(()))

    def __float__(self) -> float:
        if self.size != 1:
            raise TypeError(f"only a tensor of one element converts to float, not "
                            f"shape {self._shape}")
        return float(self.value.reshape(()))

    def item(self) -> float:
        return float(self)

    __hash__ = None  # type: ignore[assignment]  # == is elementwise

    def __reduce__(self) -> Any:
        raise TypeError("a Tensor does not pickle: it lives on a device and a WengertList; "
                        "pickle t.value (a numpy array) and make the tensor again with "
                        "Tensor.constant or Tensor.variable")

    # -- conversions --
    def astype(self: T, dtype: Any) -> T:
        """A copy in ``dtype`` (float64 or float32); differentiable."""
        dtype = np.dtype(dtype)
        if dtype == self._dtype:
            return self
        be, tape = self._backend, live_tape(self)
        (out,) = be.map("astype", ("x",), {"x": self._data}, self._shape, (dtype,))
        from easyad.tensor._steps import AstypeStep
        step = AstypeStep(be, self._shape, self._dtype)
        return record(type(self), "astype", be, out, self._shape, dtype, tape, (self._index,),
                      step, step.graph)

    def to(self: T, device: Any) -> T:
        """This tensor on another device (recorded: derivatives flow back)."""
        target = _devices.resolve(device)
        if target is self._backend:
            return self
        source, tape = self._backend, live_tape(self)
        data = target.asarray(self.value, self._dtype)
        from easyad.tensor._steps import ToStep
        step = ToStep(source, target, self._dtype)
        return record(type(self), "to", target, data, self._shape, self._dtype, tape,
                      (self._index,), step, step.graph)

    def detach(self: T) -> T:
        """The same values as a constant (no derivative flows through)."""
        return wrap(type(self), self._backend, self._data, self._shape, self._dtype)

    def _graph_derivative(self, d: Any) -> Any:
        """``d[t]`` for the derivatives of a recorded sweep (create_graph): the adjoint as a
        tensor recorded on the list (zeros when nothing reached it)."""
        adjoint = None
        if self._tape is not None and d.tape is not None:
            if d.tape is not self._tape:
                raise TapeMismatchError(f"derivatives on {d.tape!r} looked up with a tensor "
                                        f"of {self._tape!r}; use tensors of the same list")
            live_tape(self)
            adjoint = d._adjoint(self._index)
        zero = wrap(type(self), self._backend, self._backend.full(self._shape, 0.0, self._dtype),
                    self._shape, self._dtype)
        if adjoint is None:
            return zero
        return adjoint if isinstance(adjoint, TensorBase) else zero + adjoint

    def recorded_on(self, tape: Any) -> bool:
        """Whether this tensor is an entry of ``tape`` as the list is now (recorded on it
        and not cleared since)."""
        return tape is not None and self._tape is tape and self._generation == tape.generation

    def adjoint(self, d: Any) -> np.ndarray | None:
        """Its adjoint in the backward sweep ``d`` as a host array to be read only (the
        sweep's own array on the host device, a copy elsewhere), or None when no derivative
        reached it (or ``d`` is a sweep of another list)."""
        if self._tape is None or d.tape is not self._tape:
            return None
        adjoint = d._node_adjoint(self._index)
        if adjoint is None:
            return None
        out: np.ndarray = np.asarray(self._backend.host_array(adjoint)).reshape(self._shape)
        return out
